"""The release gate's census: a host's disks, fixed by the console before the erase, and the agent's erase
report held against it."""
# The release gate's census: which disks a host has, fixed by the console before the erase from sources the
# agent of that boot cannot change, and the agent's erase report held against it.
#
# - The inventory of record (BareMetalHost.disk_record): the disks, by serial, model and size, as the host's
#   first inspection (or the Metal3 status it was imported with) found them. A later inspection that finds other
#   disks does not change it: it is a deviation (hosts.selectors.host_sku_deviations, the SKU check sends the host
#   to repair) until an admin accepts the disks found (hosts.services.host_disk_record_accept).
# - The BMC's own view, where it reports storage (Redfish Systems/<id>/Storage/*/Drives; hosts.bmc.client.BMC.drives).
#   Read at each inspection too and kept beside the agent's inventory (BareMetalHost.bmc_inventory): a drive the BMC
#   lists that the agent does not name is a SKU deviation (`bmc_deviations`), so such a host never reaches the pool;
#   an IPMI BMC lists no drives, and its host's census is the inventory of record alone.
#
# A disk in either source is in the census (a BMC often lists only some drives, so one the BMC does not list is
# still the inventory's). The gate passes only when every disk of the census was erased and verified under the
# same serial and size, and no other disk was reported (`census_match`).
from __future__ import annotations

from django.utils import timezone

from pools.sku import size_text

MiB = 1024 * 1024
# A BMC's CapacityBytes is often the drive's nominal size, rounded (3.84 TB for 3,840,755,982,336 bytes): the
# agent's size must be the inventory's exactly, and the BMC's within this share.
BMC_SIZE_TOLERANCE = 0.005


def _disk(d: dict) -> dict:
    """One disk in the census's shape, from the agent's inventory or a Metal3 `hardware.storage` entry."""
    return {"name": str(d.get("name") or d.get("path") or "").removeprefix("/dev/"),
            "serial": str(d.get("serial") or d.get("serialNumber") or "").strip(),
            "model": str(d.get("model") or "").strip(),
            "size_bytes": int(d.get("size_bytes") or d.get("sizeBytes") or 0),
            "type": str(d.get("type") or "").lower()}


def inventory_disks(inventory: dict | None) -> list[dict]:
    """The disks of an inventory (the agent's `inspect`, or Metal3's hardware status), in the census's shape."""
    inv = inventory if isinstance(inventory, dict) else {}
    return [_disk(d) for d in inv.get("disks") or inv.get("storage") or [] if isinstance(d, dict)]


def record_from(inventory: dict | None, *, by: str) -> dict:
    """A disk record of these disks: {"disks", "recorded_at", "by"}."""
    return {"disks": inventory_disks(inventory), "recorded_at": timezone.now().isoformat(), "by": by}


def disks_of_record(host) -> tuple[list[dict], str]:
    """(disks, when recorded) of the host's inventory of record. A host recorded before the console kept a
    record: its inventory, as last inspected."""
    record = host.disk_record if isinstance(host.disk_record, dict) else {}
    if record.get("disks") is not None and record.get("recorded_at"):
        return [_disk(d) for d in record["disks"] if isinstance(d, dict)], record["recorded_at"]
    return inventory_disks(host.inventory), ""


def disk_text(d: dict) -> str:
    """'S7GPU011 (96 MiB)': a disk by its serial (else its name) and size, as the evidence names it."""
    size = d.get("size_bytes") or 0
    what = d.get("serial") or d.get("name") or "?"
    return f"{what} ({size_text(size, binary=size % MiB == 0)})" if size else what


def record_deviations(host) -> list[str]:
    """How the host's last inspection differs from its inventory of record: one sentence per disk; [] when they
    agree (or there is no record yet)."""
    record = host.disk_record if isinstance(host.disk_record, dict) else {}
    if not record.get("recorded_at") or not host.inventory:
        return []
    recorded = [_disk(d) for d in record.get("disks") or [] if isinstance(d, dict)]
    found = inventory_disks(host.inventory)
    out = []
    for disk in recorded:
        match = _find(disk, found)
        if match is None:
            out.append(f"disk {disk_text(disk)} of the inventory of record not found")
        elif disk["size_bytes"] and match["size_bytes"] != disk["size_bytes"]:
            out.append(f"disk {disk_text(disk)} of the inventory of record found with "
                       f"{size_text(match['size_bytes'], binary=match['size_bytes'] % MiB == 0)}")
    for disk in found:
        if _find(disk, recorded) is None:
            out.append(f"disk {disk['name'] or '?'} ({disk_text(disk)}) not in the inventory of record")
    return out


def bmc_deviations(host) -> list[str]:
    """How the agent's inventory differs from the drives the host's BMC listed at the same inspection
    (BareMetalHost.bmc_inventory): a drive the BMC lists by serial that the agent did not name (omitted, or named
    under another serial), or named with another size. One sentence each; [] when they agree, when the BMC lists
    no drives (an IPMI BMC, a BMC without storage) or the inventory is the BMC's own (inspectionMode fast). A
    drive the agent names that the BMC does not list is none: BMCs often list only some drives."""
    listed = (host.bmc_inventory or {}).get("disks") if isinstance(host.bmc_inventory, dict) else None
    if not listed or not host.inventory or (host.inventory or {}).get("source") == "bmc":
        return []
    found = inventory_disks(host.inventory)
    out = []
    for drive in (_disk(d) for d in listed if isinstance(d, dict)):
        if not drive["serial"]:
            continue  # nothing to hold the agent's report against
        match = _find(drive, found)
        if match is None:
            out.append(f"drive {disk_text(drive)} the BMC lists is not in the agent's inventory")
        elif drive["size_bytes"] and abs(match["size_bytes"] - drive["size_bytes"]) > drive["size_bytes"] * \
                BMC_SIZE_TOLERANCE:
            out.append(f"drive {disk_text(drive)} the BMC lists is {disk_text(match)} in the agent's inventory")
    return out


def _find(disk: dict, among: list[dict]) -> dict | None:
    """The disk of `among` that is `disk`: the same serial; by name only where the disk has no serial."""
    if disk["serial"]:
        return next((d for d in among if d["serial"] == disk["serial"]), None)
    return next((d for d in among if not d["serial"] and d["name"] == disk["name"]), None)


# --- the census: taken before the erase ------------------------------------------------------------------

def census_take(*, host, bmc_drives: list[dict] | None) -> dict:
    """The disks the erase must account for: the inventory of record and the BMC's drives (None: the BMC
    reports no storage), merged by serial. Each disk says where it comes from (inventory, bmc, both) and the
    size each source gives; the census says its source as a whole."""
    recorded, recorded_at = disks_of_record(host)
    disks = [{**d, "source": "inventory", "inventory_size_bytes": d["size_bytes"]} for d in recorded]
    unidentified = 0
    for drive in bmc_drives or []:
        drive = _disk(drive)
        if not drive["serial"]:  # nothing to hold an agent's report against (a RAID volume, a BMC that hides it)
            unidentified += 1
            continue
        match = _find(drive, disks)
        if match is not None:
            match.update(source="both", bmc_size_bytes=drive["size_bytes"], model=match["model"] or drive["model"])
        else:
            disks.append({**drive, "name": "", "source": "bmc", "bmc_size_bytes": drive["size_bytes"],
                          "bmc_name": drive["name"]})
    sources = {d["source"] for d in disks}
    source = ("both" if "both" in sources or sources == {"inventory", "bmc"} else
              next(iter(sources)) if sources else "none")
    return {"source": source, "disks": disks, "taken_at": timezone.now().isoformat(),
            "inventory_recorded_at": recorded_at or None,
            "bmc": (f"{len(bmc_drives)} drive(s) reported" + (f", {unidentified} without a serial (not counted)"
                                                               if unidentified else "")
                    if bmc_drives else "no storage reported")}


def _origin(disk: dict) -> str:
    return {"inventory": "the inventory", "bmc": "the BMC", "both": "the inventory and the BMC"}[disk["source"]]


def census_match(census: dict | None, reported: list[dict]) -> tuple[dict[str, dict | None], dict[str, list[str]],
                                                                      list[dict]]:
    """The agent's reported disks (name → disk, from its erase and verify results) against the census.

    Returns (census disk of each reported name, None when it is not in the census; findings per reported name;
    the census disks no reported disk matches, each with `findings` and the `disk` name its certificate takes)."""
    disks = list((census or {}).get("disks") or [])
    of, findings, taken = {}, {}, set()
    for item in reported:
        got = _disk(item)
        name = got["name"]
        match = next((d for i, d in enumerate(disks) if i not in taken and _same(d, got)), None)
        problems = []
        if census is None:
            problems.append("no census of the host's disks was taken before the erase")
        elif match is None:
            named = next((d for i, d in enumerate(disks) if i not in taken and d["name"] and d["name"] == name), None)
            if named is not None and named["serial"]:
                problems.append(f"reported with serial {got['serial'] or '(none)'}: disk {name} of "
                                f"{_origin(named)} is {named['serial']}")
            else:
                problems.append(f"disk {name} ({disk_text(got)}, as the agent reports it) is not in the census")
        else:
            taken.add(disks.index(match))
            for source, slack in (("inventory", 0), ("bmc", BMC_SIZE_TOLERANCE)):
                want = match.get(f"{source}_size_bytes")
                if want and abs(got["size_bytes"] - want) > want * slack:
                    problems.append(f"disk {disk_text({**match, 'size_bytes': want})} of the "
                                    f"{'BMC' if source == 'bmc' else 'inventory'} "
                                    f"reported with {size_text(got['size_bytes'], binary=got['size_bytes'] % MiB == 0)}")
        of[name], findings[name] = match, problems
    missing = []
    for i, disk in enumerate(disks):
        if i in taken:
            continue
        names = {d["name"] for d in missing} | set(of)
        key = disk["name"] if disk["name"] and disk["name"] not in names else disk["serial"] or disk.get("bmc_name")
        missing.append({**disk, "disk": (key or f"disk-{i}")[:64],
                        "findings": [f"disk {disk_text(disk)} of {_origin(disk)} not reported by the agent"]})
    return of, findings, missing


def _same(census_disk: dict, got: dict) -> bool:
    if census_disk["serial"]:
        return got["serial"] == census_disk["serial"]
    return not got["serial"] and bool(census_disk["name"]) and got["name"] == census_disk["name"]
