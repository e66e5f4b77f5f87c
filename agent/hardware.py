"""What the agent knows about the machine it runs on: CPU, memory, disks, NICs, GPUs, system.

`Hardware` is the interface every command uses; `LinuxHardware`, the real one, reads the running kernel's view
(/proc, /sys, `nvidia-smi`). A caller may supply another implementation, e.g. a simulated server: pass it to
`Agent(console, hardware)`, or name it on the command line as `python -m agent --hardware MODULE:CALLABLE
[--hardware-arg ARG]`, where CALLABLE (a dotted path inside MODULE) is called with ARG, or with nothing, and
returns a Hardware (`load_hardware`).
"""
from __future__ import annotations

import csv
import importlib
import io
import logging
import os
import platform
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger("agent.hardware")

DISK_TYPES = ("nvme", "ssd", "hdd")
NVIDIA_SMI_QUERY = [
    "--query-gpu=index,name,uuid,memory.total,pci.bus_id,vbios_version",
    "--format=csv,noheader,nounits",
]
# Block devices that are not disks a server could boot from: loop, RAM, device-mapper, optical, …
_VIRTUAL_BLOCK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd", "drbd", "rbd")


class HardwareError(Exception):
    """The hardware cannot be read or named (a bad description, a missing file, an unknown implementation)."""


@dataclass
class Disk:
    name: str
    path: str
    size_bytes: int
    type: str  # nvme | ssd | hdd
    model: str | None = None
    serial: str | None = None
    rotational: bool = False
    vendor: str | None = None
    wwn: str | None = None

    @property
    def is_block_device(self) -> bool:
        try:
            return stat.S_ISBLK(os.stat(self.path).st_mode)
        except OSError:
            return False

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "path": self.path,
            "model": self.model,
            "serial": self.serial,
            "size_bytes": self.size_bytes,
            "type": self.type,
            "rotational": self.rotational,
        }


@dataclass
class Nic:
    name: str
    mac: str
    speed_gbps: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# One write of the erase's zeros: os.pwritev's signature (fd, buffers, offset) -> bytes written.
DiskWrite = Callable[[int, list, int], int]


class Hardware:
    """The interface every command uses; an implementation says where the facts come from."""

    reboots = True  # whether `reboot` restarts this machine (a simulated one is powered by its BMC instead)

    def cpu(self) -> dict:
        raise NotImplementedError

    def ram_mib(self) -> int:
        raise NotImplementedError

    def disks(self) -> list[Disk]:
        raise NotImplementedError

    def nics(self) -> list[Nic]:
        raise NotImplementedError

    def gpus(self) -> list[dict]:
        raise NotImplementedError

    def system(self) -> dict:
        raise NotImplementedError

    def macs(self) -> list[str]:
        return [nic.mac for nic in self.nics() if nic.mac]

    def disk_writer(self, disk: Disk, regions: list[tuple[int, int]]) -> DiskWrite:
        """The write call for one erase of `regions` on `disk` (agent/sanitize.py): the device's own answer."""
        return os.pwritev

    def tool_env(self) -> dict | None:
        """The environment for the tools the agent runs (nvme, hdparm, nvidia-smi, dcgmi…); None: the agent's."""
        return None

    def disk(self, name: str) -> Disk:
        for disk in self.disks():
            if name in (disk.name, disk.path):
                return disk
        raise HardwareError(f"no disk named {name!r} (disks: {', '.join(d.name for d in self.disks()) or 'none'})")


def normalise_mac(mac: str) -> str:
    return mac.strip().lower().replace("-", ":")


def query_nvidia_smi(executable: str = "nvidia-smi", timeout: float = 60) -> list[dict]:
    """GPUs as `nvidia-smi --query-gpu` lists them; [] when the tool is absent. Raises HardwareError when it fails."""
    exe = shutil.which(executable)
    if exe is None:
        return []
    try:
        proc = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HardwareError(f"nvidia-smi failed: {exc}") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise HardwareError(f"nvidia-smi exited {proc.returncode}: {detail[-1] if detail else 'no output'}")
    return parse_nvidia_smi_csv(proc.stdout)


def parse_nvidia_smi_csv(text: str) -> list[dict]:
    """Rows of `index, name, uuid, memory.total (MiB), pci.bus_id[, vbios_version]` → GPU dicts."""
    gpus = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or not row[0].strip():
            continue
        if len(row) < 5:
            raise HardwareError(f"unexpected nvidia-smi row: {','.join(row)!r}")
        index, name, uuid, memory, bus = (cell.strip() for cell in row[:5])
        gpu = {
            "index": int(index),
            "name": name,
            "uuid": uuid,
            "memory_mib": _int_or_none(memory),
            "pci_bus": bus,
        }
        if len(row) > 5 and row[5].strip() and not row[5].strip().startswith("["):  # [N/A]
            gpu["vbios_version"] = row[5].strip()  # the SKU's firmware.gpuVbios
        gpus.append(gpu)
    return gpus


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None  # "[N/A]" and friends


class LinuxHardware(Hardware):
    """The machine the agent boots on, as Linux sees it. `root` lets tests point at a fake /proc and /sys."""

    def __init__(self, root: str | os.PathLike = "/", nvidia_smi: str = "nvidia-smi", dev_dir: str = "/dev"):
        self.root = Path(root)
        self.nvidia_smi = nvidia_smi
        self.dev_dir = dev_dir

    def _read(self, *parts: str) -> str | None:
        try:
            return self.root.joinpath(*parts).read_text(errors="replace").strip()
        except OSError:
            return None  # absent, or readable by root only (dmi serials), or EINVAL (speed of a down link)

    def cpu(self) -> dict:
        text = self._read("proc", "cpuinfo") or ""
        model = None
        count = 0
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "processor":
                count += 1
            elif model is None and key in ("model name", "Model", "cpu model"):
                model = value
        return {"arch": platform.machine(), "model": model, "count": count or os.cpu_count()}

    def ram_mib(self) -> int:
        for line in (self._read("proc", "meminfo") or "").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
        raise HardwareError("MemTotal not found in /proc/meminfo")

    def disks(self) -> list[Disk]:
        block = self.root / "sys" / "block"
        disks = []
        for entry in sorted(block.iterdir()) if block.is_dir() else []:
            name = entry.name
            if name.startswith(_VIRTUAL_BLOCK_PREFIXES) or not (entry / "device").exists():
                continue
            sectors = self._read("sys", "block", name, "size")
            size = int(sectors) * 512 if sectors and sectors.isdigit() else 0  # always 512-byte units
            if size == 0:
                continue  # empty card reader, ejected media
            rotational = self._read("sys", "block", name, "queue", "rotational") == "1"
            kind = "nvme" if name.startswith("nvme") else ("hdd" if rotational else "ssd")
            disks.append(Disk(
                name=name,
                path=os.path.join(self.dev_dir, name),
                size_bytes=size,
                type=kind,
                model=self._read("sys", "block", name, "device", "model"),
                serial=(self._read("sys", "block", name, "device", "serial")  # NVMe, some SCSI
                        or self._read("sys", "block", name, "serial")  # virtio
                        or self._vpd_serial(name)),  # SATA/SAS
                rotational=rotational,
                vendor=self._read("sys", "block", name, "device", "vendor"),
                wwn=self._read("sys", "block", name, "wwid") or self._read("sys", "block", name, "device", "wwid"),
            ))
        return disks

    def _vpd_serial(self, name: str) -> str | None:
        """SCSI/SATA serial from VPD page 0x80: 4 header bytes, then the serial."""
        try:
            raw = (self.root / "sys" / "block" / name / "device" / "vpd_pg80").read_bytes()
        except OSError:
            return None
        serial = raw[4:].decode("ascii", "replace").strip(" \x00")
        return serial or None

    def nics(self) -> list[Nic]:
        net = self.root / "sys" / "class" / "net"
        nics = []
        for entry in sorted(net.iterdir()) if net.is_dir() else []:
            if entry.name == "lo" or not (entry / "device").exists():
                continue  # bridges, bonds, veths: no MAC of their own worth looking up
            mac = self._read("sys", "class", "net", entry.name, "address")
            if not mac or mac == "00:00:00:00:00:00":
                continue
            speed = self._read("sys", "class", "net", entry.name, "speed")
            speed_gbps = None
            if speed and speed.lstrip("-").isdigit() and int(speed) > 0:
                speed_gbps = int(speed) / 1000
            nics.append(Nic(name=entry.name, mac=normalise_mac(mac), speed_gbps=speed_gbps))
        return nics

    def gpus(self) -> list[dict]:
        return query_nvidia_smi(self.nvidia_smi)

    def system(self) -> dict:
        dmi = ("sys", "class", "dmi", "id")
        return {
            "vendor": self._read(*dmi, "sys_vendor"),
            "product": self._read(*dmi, "product_name"),
            "serial": self._read(*dmi, "product_serial"),
            "bios_version": self._read(*dmi, "bios_version"),  # the SKU's firmware.bios
        }


def device_size(path: str) -> int:
    """Size in bytes of a block device or a plain file (seeking to the end works for both)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def load_hardware(spec: str, arg: str | None = None) -> Hardware:
    """`linux` → LinuxHardware; `MODULE:CALLABLE` → what CALLABLE(arg) (or CALLABLE() without arg) returns."""
    if spec == "linux":
        return LinuxHardware()
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise HardwareError(f"unknown hardware {spec!r}: use 'linux' or MODULE:CALLABLE")
    try:
        factory = importlib.import_module(module_name)
        for name in attribute.split("."):
            factory = getattr(factory, name)
    except (ImportError, AttributeError) as exc:
        raise HardwareError(f"hardware {spec!r}: {exc}") from exc
    hardware = factory() if arg is None else factory(arg)
    if not isinstance(hardware, Hardware):
        raise HardwareError(f"hardware {spec!r} gave {type(hardware).__name__}, not a Hardware")
    return hardware
