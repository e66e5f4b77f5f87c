"""The erase plan of one release: for each disk of the census, whether it is erased or kept, by which methods, at
which NIST SP 800-88 level, and why."""
# The one rule: a host that may go to another tenant (any release but a re-image of the same pool) has every disk
# of its census erased at the strongest level the disk supports: the NodeType's method for the disk where it is a
# Purge, else the drive's own strongest command, and a Clear (one pass of zeros) only where the disk offers no purge
# command (the certificate then says why). A re-image of the same pool follows the NodeType's disk rules
# (pools/erase_rules.py) and may keep the data disks its pool marks kept where the NodeType allows it; the OS disk
# is always erased. Which disk is the OS disk is the console's own reading of the census with the host's root
# device hints (the agent's rule, agent.disks.choose_root_disk), never the agent's word.
from __future__ import annotations

from agent.disks import DiskError, choose_root_disk
from agent.hardware import Disk
from pools.erase_rules import DATA_ROLE, METHOD_LEVEL, OS_ROLE, rule_matches

# claims.choices.ReleasePurpose.REIMAGE (hosts sits below claims and reads the claim it is handed).
REIMAGE = "reimage"
ANOTHER_TENANT = "another tenant"
SAME_POOL = "the same pool"
STRONGEST = ["secure", "full"]  # the drive's own purge, else one pass of zeros

METHOD_WORDS = {
    "metadata": "express metadata wipe", "full": "full overwrite", "secure": "the drive's own secure erase",
    "nvme-format": "NVMe format (user data erase)", "nvme-crypto-format": "NVMe format crypto erase",
    "nvme-sanitize-block": "NVMe sanitize block erase", "nvme-sanitize-crypto": "NVMe sanitize crypto erase",
    "nvme-sanitize-overwrite": "NVMe sanitize overwrite", "ata-secure-erase": "ATA secure erase",
    "crypto-erase": "crypto erase",
}


def _census_disk(d: dict) -> Disk:
    name = d.get("name") or d.get("bmc_name") or d.get("serial") or "?"
    return Disk(name=name, path=f"/dev/{name}", size_bytes=int(d.get("size_bytes") or 0), type=d.get("type") or "",
                model=d.get("model") or None, serial=d.get("serial") or None, rotational=d.get("type") == "hdd")


def os_disk(host, census: dict) -> dict | None:
    """The census's disk the image is written to (the host's root device hints, else the agent's default rule);
    None when the hints select none of them."""
    disks = [d for d in census.get("disks") or [] if d.get("name")]
    if not disks:
        return None
    try:
        chosen = choose_root_disk([_census_disk(d) for d in disks], hints=host.root_device_hints or None)
    except DiskError:
        return None
    return next(d for d in disks if d["name"] == chosen.name)


def reimage_pool(claim):
    """The pool a release re-images the host for, or None: the host may go to another tenant."""
    if claim is None or getattr(claim, "release_purpose", "") != REIMAGE or not claim.pool_id:
        return None
    return claim.pool


def erase_plan(*, host, claim, node_type, census: dict, policy: dict) -> dict:
    """{"next_owner", "pool", "disks": [{disk, serial, role, action (erase|keep), methods, level, why}]}: one entry
    per disk of the census, in its order. `policy`: the gate's (method and fallback when no rule names one)."""
    pool = reimage_pool(claim)
    rules = {r["role"]: r for r in (node_type.cleaning_disks if node_type is not None else []) or []
             if isinstance(r, dict) and r.get("role")}
    data_rules = [r for r in rules.values() if r["role"] != OS_ROLE]
    releasing = claim.pool if claim is not None and claim.pool_id else None
    marked = set(releasing.keep_disks or []) if releasing is not None else set()
    the_os = os_disk(host, census)
    base = [m for m in (policy.get("method"), policy.get("fallback")) if m]
    type_name = node_type.name if node_type is not None else "(none)"
    out = []
    for d in census.get("disks") or []:
        name = d.get("name") or d.get("bmc_name") or d.get("serial") or ""
        if the_os is not None and d is the_os:
            role = OS_ROLE
        else:
            role = next((r["role"] for r in data_rules if rule_matches(r, d)), DATA_ROLE)
        rule = rules.get(role, {})
        named = [m for m in (rule.get("method"), rule.get("fallback")) if m] or base or ["full"]
        entry = {"disk": name, "serial": d.get("serial") or "", "role": role}
        what = "the OS disk" if role == OS_ROLE else f"data disk ({role})"
        if pool is None:
            purges = [m for m in named if METHOD_LEVEL.get(m) == "Purge"]
            methods = list(dict.fromkeys(purges + STRONGEST))
            why = (f"the host may go to another tenant: {what} gets the strongest level it supports "
                   f"({METHOD_WORDS[methods[0]]} first; a Clear by one pass of zeros only where the disk offers "
                   "no purge command)")
            if role in marked:
                why += (f"; pool {releasing} marks it kept, but this release is not a re-image of that pool, so "
                        "it is erased")
            entry.update(action="erase", methods=methods, level="Purge", why=why)
        elif role in marked and role != OS_ROLE and rule.get("keepOnReimage") is True:
            entry.update(action="keep", methods=[], level="None",
                         why=f"kept: {what} marked kept by pool {pool} for a re-image of the same pool")
        else:
            source = (f"NodeType {type_name}'s rule for {what}" if rule.get("method")
                      else f"the cleaning policy ({policy.get('source') or 'default'})")
            why = f"a re-image of pool {pool}: {METHOD_WORDS.get(named[0], named[0])} by {source}"
            if role == OS_ROLE and role in marked:
                why += "; the OS disk is always erased"
            elif role in marked:
                why += f"; pool {pool} marks it kept, but NodeType {type_name} does not allow keeping it"
            entry.update(action="erase", methods=named, level=METHOD_LEVEL.get(named[0], "Clear"), why=why)
        out.append(entry)
    return {"next_owner": SAME_POOL if pool is not None else ANOTHER_TENANT, "pool": str(pool) if pool else None,
            "os_disk": the_os["name"] if the_os else None, "disks": out}


def planned_for(plan: dict | None, disk: dict | None, name: str) -> dict | None:
    """The plan's entry for a disk of the census (by serial; by name for a disk without one)."""
    if not plan:
        return None
    serial = (disk or {}).get("serial") or ""
    for entry in plan.get("disks") or []:
        if serial and entry.get("serial") == serial:
            return entry
        if not serial and not entry.get("serial") and entry.get("disk") == ((disk or {}).get("name") or name):
            return entry
    return None


def kept(plan: dict | None) -> list[dict]:
    return [{"disk": e["disk"], "serial": e["serial"], "role": e["role"]}
            for e in (plan or {}).get("disks") or [] if e.get("action") == "keep"]


def plan_findings(entry: dict | None, erased: dict | None) -> list[str]:
    """What the agent's erase record of a disk breaks of the plan: a disk to erase that it kept or erased by a
    method the plan does not name, or below the planned level without saying why. [] when it kept the plan."""
    if entry is None or entry.get("action") != "erase":
        return []
    erased = erased or {}
    if erased.get("kept"):
        return [f"the agent kept this disk; the plan erases it ({entry['why']})"]
    if not erased.get("ok"):
        return []  # the erase failed: judge_disk says so
    method = erased.get("method") or ""
    if method not in entry["methods"]:
        return [f"erased by {method or 'no method'}, which the plan does not name (planned: "
                f"{', '.join(entry['methods'])})"]
    got = erased.get("method_type") or "None"
    rank = {"None": 0, "Clear": 1, "Purge": 2}
    if rank.get(got, 0) < rank.get(entry["level"], 0) and not (got == "Clear" and erased.get("fallback_reason")
                                                               or got == "Clear" and method == "ata-secure-erase"
                                                               or got == "Clear" and method == "secure"):
        return [f"a {got} erase where the plan asks {entry['level']}, with no reason from the disk"]
    if rank.get(got, 0) == 0 and rank.get(entry["level"], 0) > 0:
        return [f"a metadata wipe is not the {entry['level']} the plan asks"]
    return []
