"""The cloud-init NoCloud seed: built as an ISO9660 image and kept in the last 64 MiB of the root disk.

Layout (the lab's "installed OS" and anything else reading the seed rely on it):

    disk: [ OS image ........................ | seed region: the last 64 MiB         ]
                                              ^ offset = disk size − 64 MiB
    seed region: [ ISO9660 image, volume label "cidata" | unused ........ | last 1 MiB ]

- The ISO starts exactly at `disk size − SEED_REGION_BYTES` (64 MiB); its own header says
  how long it is (primary volume descriptor at byte 32768 of the ISO, volume space size ×
  2048). It holds `user-data`, `meta-data` and, when given, `network-config`, under those
  names through Rock Ridge and Joliet (what `genisoimage -J -r -V cidata` makes), so
  cloud-init's NoCloud datasource finds it by its `cidata` label once the region is a
  partition.
- The ISO must end before the last MiB of the disk, where GPT keeps its backup header.
- The OS image must end before the seed region: `write_seed` refuses to overwrite an image
  written in the same boot, and disks must be larger than image + 64 MiB (lab disks too).
- On a real block device with a GPT and `sgdisk` available, the region also gets a
  partition entry (type 0700, name `config-2`), as Ironic does for config drives, so the
  OS does not grow its root partition over it. Plain files (the lab) get no entry.
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import struct
import subprocess

from agent.disks import MiB, write_all

log = logging.getLogger("agent.seed")

SEED_REGION_BYTES = 64 * MiB
GPT_RESERVE_BYTES = 1 * MiB
SEED_LABEL = "cidata"
ISO_SECTOR = 2048
PVD_OFFSET = 16 * ISO_SECTOR
# (name in the seed, ISO9660 level-1 name, argument of write_seed)
SEED_FILES = (
    ("user-data", "/USERDATA.;1", "user_data"),
    ("meta-data", "/METADATA.;1", "meta_data"),
    ("network-config", "/NETWORKC.;1", "network_config"),
)


class SeedError(Exception):
    """No seed where one should be, or the seed does not fit."""


def seed_offset(disk_size: int) -> int:
    """Where the seed ISO starts on a disk of this size."""
    if disk_size < SEED_REGION_BYTES + GPT_RESERVE_BYTES:
        raise SeedError(f"disk of {disk_size} bytes is too small for a {SEED_REGION_BYTES // MiB} MiB seed region")
    return disk_size - SEED_REGION_BYTES


def build_seed_iso(user_data: str, meta_data: str, network_config: str | None = None) -> bytes:
    """An ISO9660 image labelled `cidata` with the NoCloud files (network-config only when given)."""
    import pycdlib  # imported here so the rest of the agent runs without it

    contents = {"user-data": user_data, "meta-data": meta_data, "network-config": network_config}
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=SEED_LABEL, joliet=3, rock_ridge="1.09")
    for name, iso_path, _ in SEED_FILES:
        text = contents[name]
        if text is None:
            continue
        data = text.encode("utf-8")
        iso.add_fp(io.BytesIO(data), len(data), iso_path, rr_name=name, joliet_path=f"/{name}")
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def write_seed_to_disk(path: str, iso: bytes) -> dict:
    """Write the ISO at the start of the disk's seed region and fsync. Returns {offset, size_bytes}."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        offset = seed_offset(size)
        if len(iso) > SEED_REGION_BYTES - GPT_RESERVE_BYTES:
            raise SeedError(f"seed ISO of {len(iso)} bytes does not fit the {SEED_REGION_BYTES // MiB} MiB region")
        write_all(fd, iso, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"offset": offset, "size_bytes": len(iso)}


def read_seed(disk_path: str) -> dict:
    """The seed written on this disk: {"user-data", "meta-data", "network-config" (None when absent)}.

    Raises SeedError when the disk's seed region holds no `cidata` ISO.
    """
    import pycdlib

    with open(disk_path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        offset = seed_offset(size)
        fh.seek(offset + PVD_OFFSET)
        pvd = fh.read(ISO_SECTOR)
        if len(pvd) < 136 or pvd[1:6] != b"CD001" or pvd[0] != 1:
            raise SeedError(f"no seed on {disk_path}: no ISO9660 volume at offset {offset}")
        label = pvd[40:72].decode("ascii", "replace").strip()
        if label.lower() != SEED_LABEL:
            raise SeedError(f"no seed on {disk_path}: volume label is {label!r}, not {SEED_LABEL!r}")
        blocks, = struct.unpack("<I", pvd[80:84])
        block_size, = struct.unpack("<H", pvd[128:130])
        length = blocks * block_size
        if not 0 < length <= SEED_REGION_BYTES:
            raise SeedError(f"no seed on {disk_path}: implausible ISO size {length}")
        fh.seek(offset)
        image = fh.read(length)
    iso = pycdlib.PyCdlib()
    try:
        iso.open_fp(io.BytesIO(image))
    except pycdlib.pycdlibexception.PyCdlibException as exc:
        raise SeedError(f"unreadable seed ISO on {disk_path}: {exc}") from exc
    try:
        return {name: _read_file(iso, name, iso_path) for name, iso_path, _ in SEED_FILES}
    finally:
        iso.close()


def _read_file(iso, name: str, iso_path: str) -> str | None:
    import pycdlib

    for kwargs in ({"rr_path": f"/{name}"}, {"joliet_path": f"/{name}"}, {"iso_path": iso_path}):
        out = io.BytesIO()
        try:
            iso.get_file_from_iso_fp(out, **kwargs)
        except pycdlib.pycdlibexception.PyCdlibException:
            continue  # not under this naming scheme (an ISO made without Rock Ridge, say)
        return out.getvalue().decode("utf-8")
    return None


def add_partition_entry(path: str, offset: int) -> str:
    """Best effort: a GPT entry for the seed region on a real disk. Returns what happened, for the result."""
    sgdisk = shutil.which("sgdisk")
    if sgdisk is None:
        return "skipped: sgdisk not found"
    sector = _logical_sector_size(path)
    with open(path, "rb") as fh:
        fh.seek(sector)
        if fh.read(8) != b"EFI PART":
            return "skipped: no GPT on the disk (sgdisk would convert an MBR)"
    start = offset // sector
    steps = [
        [sgdisk, "--move-second-header", path],  # the image's backup GPT sits at the image's end
        [sgdisk, "--set-alignment=1", f"--new=0:{start}:0", "--typecode=0:0700", "--change-name=0:config-2", path],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            log.warning("sgdisk failed (%s): %s", " ".join(cmd[1:-1]), detail[-1] if detail else proc.returncode)
            return f"failed: sgdisk exited {proc.returncode}"
    if shutil.which("partprobe"):
        subprocess.run(["partprobe", path], capture_output=True, timeout=60)
    return "added"


def _logical_sector_size(path: str) -> int:
    name = os.path.basename(os.path.realpath(path))
    try:
        with open(f"/sys/block/{name}/queue/logical_block_size") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return 512
