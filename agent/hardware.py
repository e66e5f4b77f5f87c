"""What the agent knows about the machine it runs on: CPU, memory, disks, NICs, GPUs, system.

`LinuxHardware` reads the running kernel's view (/proc, /sys, `nvidia-smi`); `LabHardware`
reads a JSON profile whose disks are plain files, so a simulated server needs no root.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import os
import platform
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("agent.hardware")

DISK_TYPES = ("nvme", "ssd", "hdd")
NVIDIA_SMI_QUERY = [
    "--query-gpu=index,name,uuid,memory.total,pci.bus_id,vbios_version",
    "--format=csv,noheader,nounits",
]
# Block devices that are not disks a server could boot from: loop, RAM, device-mapper, optical, …
_VIRTUAL_BLOCK_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd", "drbd", "rbd")


class HardwareError(Exception):
    """The hardware description cannot be read (bad profile, missing file)."""


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


class Hardware:
    """The interface every command uses; subclasses say where the facts come from."""

    is_lab = False

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

    def erase_fault(self, disk: Disk) -> str | None:
        """A simulated fault of the agent's own erase writes (the lab's); real hardware has none to declare."""
        return None

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


class LabHardware(Hardware):
    """A simulated server described by a JSON profile; its disks are plain (sparse) files.

    Profile: {"system": {vendor, product, serial}, "cpu": {arch, model, count}, "ram_mib": N,
    "nics": [{name, mac, speed_gbps}], "gpus": [{index, name, uuid, memory_mib, pci_bus}],
    "disks": [{name, path, size_bytes, type, model, serial, rotational?, fault?}]}.
    Relative disk paths are relative to the profile's folder. A disk file that does not exist
    yet is created sparse with `size_bytes`; an existing one reports its real size. Without a
    "gpus" key the GPUs come from `nvidia-smi` on PATH (the lab's fake one), as on real hardware.
    """

    is_lab = True

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

    def erase_fault(self, disk: Disk) -> str | None:
        """`erase-skips-region` or `erase-fails` from the disk's "fault" in the profile (the lab's faults)."""
        for spec in self.profile["disks"]:
            if spec.get("name") == disk.name:
                return spec.get("fault") or None
        return None

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


def device_size(path: str) -> int:
    """Size in bytes of a block device or a plain file (seeking to the end works for both)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def load_hardware(spec: str) -> Hardware:
    """`linux` → LinuxHardware; `lab:/path/profile.json` → LabHardware."""
    if spec == "linux":
        return LinuxHardware()
    if spec.startswith("lab:"):
        return LabHardware.from_file(spec[4:])
    raise HardwareError(f"unknown hardware {spec!r}: use 'linux' or 'lab:/path/profile.json'")
