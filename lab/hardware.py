"""The lab's simulated server hardware, supplied to the real agent through its hardware interface
(agent/hardware.py): a JSON profile whose disks are plain files, and the disk faults of the agent's own writes.

The lab starts each simulated server's agent as `python -m agent --hardware lab.hardware:LabHardware.from_file
--hardware-arg PROFILE` (lab/site.py), or in a thread with `Agent(console, LabHardware.from_file(PROFILE))`.
Erase faults (a disk's "fault" in the profile): erase-skips-region (the device acknowledges the writes to the
middle quarter of the largest range written without making them, so the erase reports success) and erase-fails
(the device answers EIO once a quarter of the bytes has been issued). The drive commands' faults are the fake
tools' (lab/fake_tools.py), found first on PATH through `tool_env`.
"""
from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import platform
import threading
from pathlib import Path

from agent.hardware import (
    DISK_TYPES, Disk, DiskWrite, Hardware, HardwareError, Nic, device_size, normalise_mac, query_nvidia_smi,
)
from agent.verify import BLOCK

log = logging.getLogger("lab.hardware")
ERASE_SKIPS_REGION = "erase-skips-region"
ERASE_FAILS = "erase-fails"
ERASE_FAULTS = (ERASE_SKIPS_REGION, ERASE_FAILS)
# How an agent process is told to use it: `python -m agent --hardware LAB_HARDWARE --hardware-arg PROFILE`.
LAB_HARDWARE = "lab.hardware:LabHardware.from_file"


class LabHardware(Hardware):
    """A simulated server described by a JSON profile; its disks are plain (sparse) files.

    Profile: {"system": {vendor, product, serial}, "cpu": {arch, model, count}, "ram_mib": N,
    "nics": [{name, mac, speed_gbps}], "gpus": [{index, name, uuid, memory_mib, pci_bus}],
    "disks": [{name, path, size_bytes, type, model, serial, rotational?, fault?}]}.
    Relative disk paths are relative to the profile's folder. A disk file that does not exist
    yet is created sparse with `size_bytes`; an existing one reports its real size. Without a
    "gpus" key the GPUs come from `nvidia-smi` on PATH (the lab's fake one), as on real hardware.
    """

    reboots = False  # its power is its BMC's (lab/redfish.py): the agent exits and the console power-cycles it

    def __init__(self, profile: dict, base_dir: str | os.PathLike = "."):
        if not isinstance(profile, dict):
            raise HardwareError("hardware profile must be a JSON object")
        self.profile = profile
        self.base_dir = Path(base_dir)
        self.path: Path | None = None  # the profile file, when read from one
        for key in ("nics", "disks"):
            if not isinstance(profile.get(key), list):
                raise HardwareError(f"hardware profile needs a list {key!r}")

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> LabHardware:
        path = Path(path)
        try:
            profile = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise HardwareError(f"cannot read hardware profile {path}: {exc}") from exc
        hardware = cls(profile, base_dir=path.resolve().parent)
        hardware.path = path.resolve()
        return hardware

    def cpu(self) -> dict:
        cpu = self.profile.get("cpu") or {}
        return {"arch": cpu.get("arch", platform.machine()), "model": cpu.get("model"), "count": cpu.get("count", 1)}

    def ram_mib(self) -> int:
        return int(self.profile.get("ram_mib", 0))

    def disks(self) -> list[Disk]:
        disks = []
        for i, spec in enumerate(self.profile["disks"]):
            if "name" not in spec or "path" not in spec:
                raise HardwareError(f"disk #{i} in the hardware profile needs 'name' and 'path'")
            path = Path(spec["path"])
            if not path.is_absolute():
                path = self.base_dir / path
            if not path.exists():
                if "size_bytes" not in spec:
                    raise HardwareError(f"disk {spec['name']}: {path} does not exist and has no size_bytes")
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "wb") as fh:
                    fh.truncate(int(spec["size_bytes"]))  # sparse: costs no space until written
                log.info("created sparse disk file %s (%d bytes)", path, int(spec["size_bytes"]))
            kind = spec.get("type", "ssd")
            if kind not in DISK_TYPES:
                raise HardwareError(f"disk {spec['name']}: type must be one of {', '.join(DISK_TYPES)}")
            disks.append(Disk(
                name=spec["name"],
                path=str(path),
                size_bytes=device_size(str(path)),
                type=kind,
                model=spec.get("model"),
                serial=spec.get("serial"),
                rotational=bool(spec.get("rotational", kind == "hdd")),
                vendor=spec.get("vendor"),
                wwn=spec.get("wwn"),
            ))
        return disks

    def tool_env(self) -> dict | None:
        """The lab's fake tools (lab/fake_tools.py) first on PATH, told which server they play."""
        tools = (self.profile.get("lab") or {}).get("tools")
        if not tools:
            return None
        env = dict(os.environ)
        env["PATH"] = f"{tools}{os.pathsep}{env.get('PATH', '')}"
        if self.path is not None:
            env["VMETAL_LAB_PROFILE"] = str(self.path)
        return env

    def disk_writer(self, disk: Disk, regions: list[tuple[int, int]]) -> DiskWrite:
        """The disk's "fault" in the profile, played on the agent's own erase writes (erase_writer); a thin disk
        without one takes zeros as a discard."""
        spec = next((spec for spec in self.profile["disks"] if spec.get("name") == disk.name), {})
        if spec.get("thin") and not spec.get("fault"):
            return thin_writer
        return erase_writer(spec.get("fault"), regions)

    def nics(self) -> list[Nic]:
        return [
            Nic(name=n.get("name", f"eth{i}"), mac=normalise_mac(n["mac"]), speed_gbps=n.get("speed_gbps"))
            for i, n in enumerate(self.profile["nics"])
        ]

    def gpus(self) -> list[dict]:
        if "gpus" in self.profile:
            return [dict(g) for g in self.profile["gpus"]]
        return query_nvidia_smi()

    def system(self) -> dict:
        system = self.profile.get("system") or {}
        return {"vendor": system.get("vendor"), "product": system.get("product"), "serial": system.get("serial"),
                "bios_version": system.get("bios_version")}


def skipped_region(regions: list[tuple[int, int]]) -> tuple[int, int]:
    """erase-skips-region's hole: the middle quarter (3/8 to 5/8) of the largest range written, block-aligned."""
    start, length = max(regions, key=lambda r: r[1])
    lo = (start + length * 3 // 8) // BLOCK * BLOCK
    hi = (start + length * 5 // 8) // BLOCK * BLOCK
    return lo, hi


def erase_writer(fault: str | None, regions: list[tuple[int, int]]) -> DiskWrite:
    """The write call of one erase of `regions` on a disk with this fault: os.pwritev itself when it has none."""
    if fault == ERASE_SKIPS_REGION:
        return _skipping_writer(*skipped_region(regions))
    if fault == ERASE_FAILS:
        return _failing_writer(sum(n for _, n in regions) // 4)
    return os.pwritev


_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_ZEROS = memoryview(bytes(4 * 2**20))


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Deallocate [offset, offset + length) of a disk file: it reads back as zeros and takes no space."""
    if length > 0 and _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def thin_writer(fd: int, buffers: list, offset: int) -> int:
    """A thin-provisioned device: zeros are taken as a discard (the range reads back as zeros and the file stays
    sparse), anything else is written. For labs of a thousand servers, whose erases would otherwise fill the disk."""
    data = memoryview(buffers[0]) if len(buffers) == 1 else memoryview(b"".join(buffers))
    if data.nbytes <= _ZEROS.nbytes and data.cast("B") == _ZEROS[:data.nbytes]:
        punch_hole(fd, offset, data.nbytes)
        return data.nbytes
    return os.pwritev(fd, buffers, offset)


def _skipping_writer(lo: int, hi: int) -> DiskWrite:
    """A device that drops the writes to [lo, hi) and says it made them."""

    def pwritev(fd: int, buffers: list, offset: int) -> int:
        data = memoryview(buffers[0]) if len(buffers) == 1 else memoryview(b"".join(buffers))
        end = offset + len(data)
        for start, stop in ((offset, min(end, lo)), (max(offset, hi), end)):
            while start < stop:
                start += os.pwritev(fd, [data[start - offset:stop - offset]], start)
        return len(data)

    return pwritev


def _failing_writer(fail_at: int) -> DiskWrite:
    """A device that answers EIO to every write issued once `fail_at` bytes have been issued."""
    lock = threading.Lock()
    issued = [0]

    def pwritev(fd: int, buffers: list, offset: int) -> int:
        with lock:
            if issued[0] >= fail_at:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            issued[0] += sum(len(memoryview(b)) for b in buffers)
        return os.pwritev(fd, buffers, offset)

    return pwritev
