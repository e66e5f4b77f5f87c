"""Disk helpers shared by the commands: which disk is the root disk, and zeroing byte ranges."""
from __future__ import annotations

import errno
import mmap
import os

from agent.hardware import Disk

MiB = 1024 * 1024
GiB = 1024 * MiB
# Ironic's default root disk: the smallest disk of at least 4 GiB (ironic-python-agent,
# get_os_install_device). Lab disks are smaller, so the first disk is taken when none qualifies.
MIN_ROOT_DISK_BYTES = 4 * GiB
ZERO_CHUNK = 1 * MiB
DIRECT_ALIGN = 4096  # O_DIRECT needs offsets and lengths aligned to the logical block size (512 or 4096)

# Metal3's rootDeviceHints, in its own spelling; Ironic's snake_case names are accepted too.
SUPPORTED_HINTS = ("deviceName", "model", "vendor", "serialNumber", "wwn", "rotational", "minSizeGigabytes")
_HINT_ALIASES = {"name": "deviceName", "serial": "serialNumber", "size": "minSizeGigabytes"}


class DiskError(Exception):
    """No disk fits, or a disk cannot be written."""


def choose_root_disk(disks: list[Disk], *, name: str | None = None, hints: dict | None = None) -> Disk:
    """The disk to install on: by name when given, else the first disk matching all hints, else Ironic's default."""
    if not disks:
        raise DiskError("no disks found")
    if name:
        for disk in disks:
            if name in (disk.name, disk.path):
                return disk
        raise DiskError(f"no disk named {name!r} (disks: {', '.join(d.name for d in disks)})")
    if hints:
        hints = {_HINT_ALIASES.get(k, k): v for k, v in hints.items() if v not in (None, "")}
        unknown = sorted(set(hints) - set(SUPPORTED_HINTS))
        if unknown:
            # Ignoring a hint could pick the wrong disk and overwrite it: refuse instead.
            raise DiskError(f"unsupported root device hints: {', '.join(unknown)} (supported: {', '.join(SUPPORTED_HINTS)})")
        matching = [d for d in disks if _matches(d, hints)]
        if not matching:
            raise DiskError(f"no disk matches root device hints {hints} (disks: {', '.join(d.name for d in disks)})")
        # Among matches, Ironic still prefers the smallest (stable order breaks ties).
        return min(matching, key=lambda d: d.size_bytes)
    large_enough = [d for d in disks if d.size_bytes >= MIN_ROOT_DISK_BYTES]
    if large_enough:
        return min(large_enough, key=lambda d: d.size_bytes)
    return disks[0]


def _matches(disk: Disk, hints: dict) -> bool:
    for key, wanted in hints.items():
        if key == "deviceName":
            if not _device_name_matches(disk, str(wanted)):
                return False
        elif key in ("model", "vendor"):
            value = getattr(disk, key) or ""
            if str(wanted).strip().lower() not in value.strip().lower():  # Metal3: "can be a substring"
                return False
        elif key == "serialNumber":
            if (disk.serial or "").strip() != str(wanted).strip():
                return False
        elif key == "wwn":
            if (disk.wwn or "").strip().lower() != str(wanted).strip().lower():
                return False
        elif key == "rotational":
            if disk.rotational != _as_bool(wanted):
                return False
        elif key == "minSizeGigabytes":
            if disk.size_bytes // GiB < int(wanted):  # Ironic counts whole GiB
                return False
    return True


def _device_name_matches(disk: Disk, wanted: str) -> bool:
    if wanted in (disk.path, disk.name):
        return True
    if wanted.startswith("/dev/"):
        # /dev/sda, or a stable link such as /dev/disk/by-path/… resolving to it
        return disk.name in (os.path.basename(wanted), os.path.basename(os.path.realpath(wanted)))
    return False


def _as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def write_all(fd: int, data, offset: int) -> None:
    """pwrite until every byte of `data` is written (a short write is legal)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise DiskError(f"short write at offset {offset}")
        view = view[n:]
        offset += n


def merge_regions(regions: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """(offset, length) ranges clipped to [0, size) and merged where they overlap."""
    clipped = sorted((max(0, o), min(size, o + n)) for o, n in regions if n > 0)
    merged: list[list[int]] = []
    for start, end in clipped:
        if start >= end:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e - s) for s, e in merged]


def zero_regions(path: str, regions: list[tuple[int, int]], *, direct: bool = True) -> tuple[int, bool]:
    """Write zeros over the given ranges, then fsync. Returns (bytes zeroed, whether O_DIRECT was used).

    O_DIRECT keeps the page cache from absorbing the writes; filesystems without it (tmpfs)
    or unaligned ranges fall back to buffered writes, which the fsync still makes durable.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)
    regions = merge_regions(regions, size)
    if direct and hasattr(os, "O_DIRECT") and all(o % DIRECT_ALIGN == 0 and n % DIRECT_ALIGN == 0 for o, n in regions):
        try:
            return _zero(path, regions, os.O_DIRECT), True
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
    return _zero(path, regions, 0), False


def _zero(path: str, regions: list[tuple[int, int]], extra_flags: int) -> int:
    fd = os.open(path, os.O_WRONLY | extra_flags)
    buf = mmap.mmap(-1, ZERO_CHUNK)  # page-aligned and zero-filled, as O_DIRECT needs
    zeros = memoryview(buf)
    try:
        total = 0
        for offset, length in regions:
            end = offset + length
            while offset < end:
                n = min(ZERO_CHUNK, end - offset)
                write_all(fd, zeros[:n], offset)
                offset += n
                total += n
        os.fsync(fd)
        return total
    finally:
        zeros.release()
        buf.close()
        os.close(fd)
