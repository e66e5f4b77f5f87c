"""Disk erase commands: `erase_metadata` (zero both ends), `erase` (by cleaning policy, after planting canaries)
and `verify_erase` (read the canaries and a sample back with O_DIRECT)."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from agent import sanitize, verify
from agent.commands.base import CommandError, Context, require
from agent.disks import MiB, zero_regions


def erase_metadata(args: dict, ctx: Context) -> dict:
    """Zero the first and last `mib` MiB (default 2) of the named disks (default all).

    Both ends because GPT keeps a backup header at the end, and RAID/LVM/ZFS signatures may
    sit at either. A disk smaller than both ends together is zeroed whole.
    """
    try:
        mib = int(args.get("mib", 2))
    except (TypeError, ValueError):
        raise CommandError(f"erase_metadata: mib must be a whole number, not {args.get('mib')!r}") from None
    if mib <= 0:
        raise CommandError("erase_metadata: mib must be positive")
    disks = ctx.hardware.disks()
    names = args.get("disks")
    if names:
        by_name = {d.name: d for d in disks}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise CommandError(f"erase_metadata: no such disk: {', '.join(missing)} (disks: {', '.join(by_name)})")
        disks = [by_name[n] for n in names]
    done = []
    for i, disk in enumerate(disks):
        ctx.progress(int(100 * i / len(disks)), f"erasing metadata on {disk.name}")
        span = mib * MiB
        zeroed, direct = zero_regions(disk.path, [(0, span), (disk.size_bytes - span, span)])
        done.append({"name": disk.name, "bytes_zeroed": zeroed, "direct_io": direct})
    ctx.progress(100, "metadata erased")
    return {"disks": done}


# --- erase by policy, then verify -------------------------------------------------------------------

def _master_key(args: dict, command: str) -> bytes:
    key = require(args, "key", command)
    try:
        master = bytes.fromhex(key)
    except (TypeError, ValueError):
        raise CommandError(f"{command}: key must be hex") from None
    if len(master) < 16:
        raise CommandError(f"{command}: key too short")
    return master


def _state_path(ctx: Context, erase_id: str) -> str:
    safe = "".join(c for c in erase_id if c.isalnum() or c in "-_")[:64]
    return os.path.join(ctx.tmp_dir or tempfile.gettempdir(), f"vmetal-erase-{safe}.json")


def _select(ctx: Context, names, command: str) -> list:
    disks = ctx.hardware.disks()
    if not names:
        return disks
    by_name = {d.name: d for d in disks}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise CommandError(f"{command}: no such disk: {', '.join(missing)} (disks: {', '.join(by_name)})")
    return [by_name[n] for n in names]


class _Progress:
    """Per-disk progress folded into one percentage and one line for the console."""

    def __init__(self, ctx: Context, names: list[str], phase: str):
        self.ctx, self.phase = ctx, phase
        self.state = {n: (0.0, "waiting") for n in names}
        self.lock = threading.Lock()

    def for_disk(self, name: str, weight: tuple[float, float] = (0.0, 1.0)):
        lo, hi = weight

        def report(fraction: float, message: str = "") -> None:
            with self.lock:
                self.state[name] = (lo + (hi - lo) * max(0.0, min(1.0, fraction)), message)
                total = sum(f for f, _ in self.state.values()) / len(self.state)
                line = ", ".join(f"{n} {int(100 * f)}%{' ' + m if m else ''}" for n, (f, m) in self.state.items())
            self.ctx.progress(int(100 * total), f"{self.phase}: {line}"[:480])

        return report


def _disk_plans(args: dict) -> list[dict]:
    """The console's per-disk plan (hosts/gate/plan.py): [{serial, name, keep, methods}]; [] erases every disk by
    the one policy."""
    plans = args.get("plan") or []
    if not isinstance(plans, list) or not all(isinstance(p, dict) for p in plans):
        raise CommandError("erase: plan must be a list of {serial, name, keep, methods}")
    for p in plans:
        for value in p.get("methods") or []:
            if value not in sanitize.METHODS:
                raise CommandError(f"erase: unknown method {value!r} (known: {', '.join(sanitize.METHODS)})")
        if not p.get("keep") and not p.get("methods"):
            raise CommandError(f"erase: the plan for disk {p.get('serial') or p.get('name')} names no method")
    return plans


def _plan_of(plans: list[dict], disk) -> dict | None:
    """A disk's entry: by serial (names change between boots), by name for a disk without one."""
    if disk.serial:
        return next((p for p in plans if p.get("serial") == disk.serial), None)
    return next((p for p in plans if not p.get("serial") and p.get("name") == disk.name), None)


def erase(args: dict, ctx: Context) -> dict:
    """Plant canaries and fingerprint a sample (for the verification), then erase every disk by the policy (or
    each by its entry of the console's plan; a disk it keeps is left untouched, no canary planted), several at a
    time. The plan is kept in the ramdisk for `verify_erase`; no key and no disk content is."""
    erase_id = str(require(args, "erase_id", "erase"))
    master = _master_key(args, "erase")
    method = args.get("method", "full")
    fallback = args.get("fallback") or ""
    for value in (method, fallback or "full"):
        if value not in sanitize.METHODS:
            raise CommandError(f"erase: unknown method {value!r} (known: {', '.join(sanitize.METHODS)})")
    plans = _disk_plans(args)
    policy = sanitize.Policy(method=method, fallback=fallback, metadata_mib=int(args.get("metadata_mib", 2)),
                             allow_suspend=bool(args.get("allow_suspend", True)),
                             tool_timeout_s=float(args.get("tool_timeout_s", 6 * 3600)))
    check = args.get("verify") or {}
    share = float(check.get("share", verify.DEFAULT_SHARE))
    chunk = int(check.get("chunk", verify.DEFAULT_SAMPLE_CHUNK))
    canaries = int(args["canaries"]) if args.get("canaries") else None
    if not 0 < share <= 1:
        raise CommandError("erase: verify.share must be in (0, 1]")
    disks = _select(ctx, args.get("disks"), "erase")
    if not disks:
        raise CommandError("erase: this host has no disks")
    concurrency = max(1, min(int(args.get("concurrency", 4)), len(disks)))
    progress = _Progress(ctx, [d.name for d in disks], "erase")

    def one(disk) -> tuple[dict, dict | None]:
        report = progress.for_disk(disk.name)
        facts = {"name": disk.name, "path": disk.path, "serial": disk.serial, "model": disk.model,
                 "vendor": disk.vendor, "type": disk.type, "size_bytes": disk.size_bytes,
                 "rotational": disk.rotational}
        entry = _plan_of(plans, disk) if plans else None
        if entry is not None and entry.get("keep"):
            report(1.0, "kept")
            return {**facts, "ok": True, "kept": True, "method": "kept"}, None
        own = dataclasses.replace(policy, methods=tuple(entry["methods"])) if entry else policy
        chain = own.chain()
        first = chain[0]
        key = verify.disk_key(master, disk.serial or disk.name)
        try:
            the_plan = verify.plan(key, disk.size_bytes, first, canaries=canaries, share=share, chunk=chunk,
                                   metadata_mib=own.metadata_mib)
            report(0.0, "planting canaries")
            prepared = verify.prepare(disk.path, key, the_plan, lambda f: report(0.05 * f, "fingerprinting"),
                                      fingerprint=any(m in sanitize.DRIVE_METHODS for m in chain))
            result = sanitize.erase_disk(disk, own, ctx.hardware,
                                         lambda f, m: report(0.05 + 0.95 * f, m))
        except verify.VerifyError as exc:
            return {**facts, "ok": False, "error": f"before the erase: {exc}"}, None
        except sanitize.EraseFailed as exc:
            return {**facts, "ok": False, "error": str(exc), "requested": first, "attempts": exc.attempts}, None
        if result["method"] == "metadata" and first != "metadata":
            # Fallen back to a metadata wipe: verify what it claims, the two ends, and say so.
            the_plan.regions = verify.metadata_regions(disk.size_bytes, own.metadata_mib)
            prepared.fingerprints += [(o, "", None) for s, n in the_plan.regions
                                      for o in range(s, s + n - the_plan.chunk + 1, the_plan.chunk)]
        result.pop("regions", None)
        state = {"prepared": prepared.to_dict(), "expectation": result["expectation"], "method": result["method"]}
        return {**facts, "ok": True, "canaries_planted": len(the_plan.canaries),
                "samples_fingerprinted": len(prepared.fingerprints), **result}, state

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="erase") as pool:
        outcomes = list(pool.map(one, disks))
    results = [r for r, _ in outcomes]
    states = {r["name"]: s for r, s in outcomes if s is not None}
    record = {"erase_id": erase_id, "disks": states, "at": time.time()}
    ctx.session[f"erase:{erase_id}"] = record
    with open(_state_path(ctx, erase_id), "w") as f:
        json.dump(record, f)
    failed = [r for r in results if not r["ok"]]
    summary = {"erase_id": erase_id, "policy": {"method": method, "fallback": fallback},
               "concurrency": concurrency, "disks": results}
    if failed:
        raise CommandError("erase failed: " + "; ".join(f"{r['name']}: {r['error']}" for r in failed), summary)
    ctx.progress(100, "erase done")
    return summary


def verify_erase(args: dict, ctx: Context) -> dict:
    """Read back what `erase` planted and sampled, with O_DIRECT; report per disk what was found."""
    erase_id = str(require(args, "erase_id", "verify_erase"))
    master = _master_key(args, "verify_erase")
    mode = args.get("mode", "sampled")
    if mode not in ("sampled", "full"):
        raise CommandError("verify_erase: mode must be sampled or full")
    record = ctx.session.get(f"erase:{erase_id}")
    if record is None:
        try:
            with open(_state_path(ctx, erase_id)) as f:
                record = json.load(f)
        except (OSError, ValueError):
            raise CommandError(f"verify_erase: no record of erase {erase_id} on this boot (the agent restarted "
                               "since?): the erase cannot be verified and must run again") from None
    disks = {d.name: d for d in ctx.hardware.disks()}
    names = list(record["disks"])
    concurrency = max(1, min(int(args.get("concurrency", 4)), len(names) or 1))
    progress = _Progress(ctx, names, "verify")

    def one(name: str) -> dict:
        state = record["disks"][name]
        disk = disks.get(name)
        base = {"name": name, "method": state["method"]}
        if disk is None:
            return {**base, "passed": False, "error": f"disk {name} is gone since the erase"}
        base.update(serial=disk.serial, model=disk.model, size_bytes=disk.size_bytes)
        key = verify.disk_key(master, disk.serial or disk.name)
        try:
            found = verify.verify(disk.path, key, verify.Prepared.from_dict(state["prepared"]),
                                  expectation=state["expectation"], mode=mode,
                                  progress=lambda f: progress.for_disk(name)(f, mode))
        except verify.VerifyError as exc:
            return {**base, "passed": False, "error": str(exc), "findings": [str(exc)]}
        return {**base, **found}

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="verify") as pool:
        results = list(pool.map(one, names))
    ctx.progress(100, "verified")
    return {"erase_id": erase_id, "mode": mode, "disks": results, "passed": bool(results) and all(
        r.get("passed") for r in results)}
