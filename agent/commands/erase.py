"""`erase_metadata`: zero both ends of each disk, where partition tables and signatures live."""
from __future__ import annotations

from agent.commands import CommandError, Context
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
