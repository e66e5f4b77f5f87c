"""`write_seed`: put the cloud-init NoCloud seed (user-data, meta-data, network-config) on the root disk."""
from __future__ import annotations

from agent import seed
from agent.commands.base import CommandError, Context
from agent.disks import DiskError, choose_root_disk


def write_seed(args: dict, ctx: Context) -> dict:
    """Build the `cidata` ISO and write it into the root disk's last 64 MiB (layout: agent/seed.py)."""
    if args.get("user_data") is None:
        raise CommandError("write_seed: missing argument 'user_data'")
    try:
        disk = choose_root_disk(ctx.hardware.disks(), name=args.get("disk"), hints=args.get("root_device_hints"))
        offset = seed.seed_offset(disk.size_bytes)
    except (DiskError, seed.SeedError) as exc:
        raise CommandError(f"write_seed: {exc}") from exc
    image = ctx.session.get("image")
    if image and image["disk"] == disk.name and image["bytes_written"] > offset:
        raise CommandError(
            f"write_seed: the image on {disk.name} ends at byte {image['bytes_written']}, inside the seed region "
            f"(last {seed.SEED_REGION_BYTES // (1024 * 1024)} MiB, from byte {offset}): the disk is too small"
        )
    iso = seed.build_seed_iso(args["user_data"], args.get("meta_data") or "", args.get("network_config"))
    try:
        written = seed.write_seed_to_disk(disk.path, iso)
    except seed.SeedError as exc:
        raise CommandError(f"write_seed: {exc}") from exc
    partition = seed.add_partition_entry(disk.path, written["offset"]) if disk.is_block_device else "skipped: not a block device"
    return {"disk": disk.name, "offset": written["offset"], "size_bytes": written["size_bytes"], "partition": partition}
