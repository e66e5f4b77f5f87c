"""The lab: a simulated data centre on 127.0.0.1 for the demo, the tests and the benchmarks.

- BMCs: sushy-tools' Redfish emulator (lab/redfish.py), one port per server, power changes that land
  seconds later, per-server credentials and injected faults; servers named in `ipmi_hosts` have an IPMI LAN BMC
  instead (lab/ipmi.py: pyghmi's BMC server class on the same power and boot events, `ipmi://` addresses).
- Servers: file-backed disks under var/lab/<host>/, a hardware profile per server (gpu-server: 8 GPUs,
  NVMe disks, 2 TiB of RAM reported; cpu-server), and the real agent (agent/) started as a process when a
  server powers on into PXE, as the ramdisk would be, with the lab's hardware (lab/hardware.py) in place of Linux's. Powering on from disk "boots the installed OS":
  the lab reads the cloud-init NoCloud seed that the agent wrote on the disk and runs its join command
  (the kubelet joining the tenant's API with the bootstrap token).
- VM servers (`vms=N`, hosts vm-01…): a QEMU virtual machine per server (lab/vm.py) behind the same kind of
  BMC: the controller maps each landed power change to the VM's process (on with the boot target in force,
  off, graceful off, reset), and a guest that powers itself off shows Off on its BMC. No simulated agent or
  OS for them: the VM boots what the console serves. They reach the console as 10.0.2.2 (QEMU's user-mode
  network), so a console with VMs runs with AGENT_BOOT_URL=http://10.0.2.2:PORT; the lab's own host-side
  parts (simulated servers, BMCs downloading virtual media) use 127.0.0.1 for the same URL.
- Tenant APIs: one small Kubernetes-compatible API per tenant (lab/kube.py, on kmock).
- Images: a small raw image (and a qcow2 when qemu-img is present) with known checksums, served over HTTP.

Faults per host: bmc-500 (the BMC answers 500 for a few requests), bmc-down (its port closed),
slow-power (power changes land after 60 s), agent-crash (the agent dies after its first command),
corrupt-image (the image reaches that server with a flipped byte), no-tftp (its network boot finds no boot
file: the VM's TFTP directory stays empty, a simulated server gets no boot configuration); disk faults erase-skips-region (the erase
reports success but leaves the middle quarter of the disk untouched) and erase-fails (the erase command
fails), on the first disk or on `KIND:DISK`; GPU faults gpu-dcgm-fail, gpu-xid, gpu-reset-busy, mig-busy, ecc-uncorrectable (on GPU 0 or on
`KIND:N`) and nccl-slow, played by the fake nvidia-smi / dcgmi / all_reduce_perf (lab/fake_tools.py) that
the agent finds on its PATH. BIOS and firmware faults, played by its BMC (lab/redfish.py): bios-no-stick (every
pending BIOS setting, or `bios-no-stick:ATTRIBUTE`, is dropped at the reboot that should apply it) and
firmware-update-fails (every SimpleUpdate's task ends in Exception). Several faults: `KIND,KIND:TARGET`.

Faults for the fleet's health (issue 15), against the lab's gpu-server SKU (`lab_sku`: 8 NVIDIA H200, 2 TiB,
2 NVMe of the lab's disk size, one 100 Gb/s NIC):
- gpu-missing: a GPU has fallen off the bus: inspection, nvidia-smi and the diagnostics see 7 of 8 (GPU 7, or
  `gpu-missing:N`). The SKU check sends the host to repair ("GPUs: 7 of 8 NVIDIA H200").
- disk-small: the first NVMe (or `disk-small:DISK`) is half the lab's disk size, smaller than the SKU
  ("nvme0n1: 128 MiB < 256 MiB").
- nvlink-slow: NVLinks of GPU 0 (or `:N`) are down: `nvidia-smi nvlink --status` shows them inactive and
  all_reduce_perf's large-message busbw is ~330 GB/s, under the lab's 400 GB/s threshold (nccl-slow: ~180).
- xid-intermittent: an Xid 94 on GPU 0 (or `:N`) fails the first `dcgmi diag` (level 2 or more) and never
  again: a retest passes. The fired state is kept in the host's lab directory (xid-intermittent.fired) and
  cleared when the lab starts or the fault is set again.
- burnin-fail: passes inspection, GPU reset, DCGM levels 1 and 2 and NCCL, but `dcgmi diag -r 3` or `-r 4`
  (the intake burn-in) fails Targeted Stress on GPU 0 (or `:N`) with DCGM_FR_STRESS_LEVEL.

The release gate's census (hosts/gate/census.py): each lab BMC reports its server's drives (serial, model, size) under
Systems/<id>/Storage/1/Drives, unless bmc-no-storage (set at the lab's start), and its CPUs, GPUs (Processors) and
memory (MemorySummary) for the console's out-of-band inspection. A lying agent, whose report of the
disks is not the hardware (the BMC and the disk files stay true): agent-omits-disk (the last disk, or `:DISK`,
is neither reported nor erased), agent-forges-serial (reported as FORGED-SERIAL), agent-misreports-size (a decoy
file 1 MiB larger is erased and reported in its place, the real disk untouched), agent-extra-disk (a decoy
nvme9n1 with serial EXTRA-SERIAL is reported besides the real ones).
`manage.py lab --fault HOST=KIND[:TARGET][,KIND...]` sets any of them; `LabSite.set_fault` while it runs.

While a server runs its installed OS, `write_pattern` plays its tenant writing data across its disks, and
`scan_disks` looks for bytes afterwards (the isolation tests).
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from agent.seed import SeedError, read_seed

from .hardware import ERASE_FAULTS, LAB_HARDWARE, LabHardware
from .kube import TenantAPIServer, kubelet_join, parse_join_command
from .kubevirt import KubeVirtCluster
from .metal3 import Metal3LabCluster
from .redfish import GUEST_HOST, RedfishLab, port_free
from .vm import VMServer

log = logging.getLogger("lab")
# The demo's network hands out 22 addresses: runs at scale (the HA test, the benches) apply this one instead.
ROOMY_NETWORK = """\
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata: {name: servers, namespace: p-default}
spec:
  providerRef: metal3
  properties:
    metal3.vcluster.com/network-cidr: 10.10.0.1/16
    metal3.vcluster.com/network-ip-range: 10.10.1.0-10.10.250.255
"""


ROOT = Path(__file__).resolve().parent.parent
GPU_FAULTS = ("gpu-dcgm-fail", "gpu-xid", "gpu-reset-busy", "nccl-slow", "nvlink-slow", "xid-intermittent",
              "burnin-fail", "mig-busy", "ecc-uncorrectable")
GPU_STATE = "gpu-state.json"  # beside the host's profile: its GPUs' settings (lab/fake_tools.py)
SKU_FAULTS = ("gpu-missing", "disk-small")  # the hardware itself differs from the SKU
# A lying agent: what its ramdisk reports of the disks is not the hardware (the BMC still reports the truth).
LIE_FAULTS = ("agent-omits-disk", "agent-forges-serial", "agent-misreports-size", "agent-extra-disk")
FORGED_SERIAL = "FORGED-SERIAL"
# Its BMC's BIOS and firmware (lab/redfish.py): a BIOS setting that never sticks (bios-no-stick:ATTRIBUTE, every pending
# one without a target), a firmware update whose task ends in Exception.
FIRMWARE_FAULTS = ("bios-no-stick", "firmware-update-fails")
FIRMWARE_UPDATE_FAILURE = "Image verification failed: the image's signature does not match this component"
FAULTS = ("bmc-500", "bmc-down", "slow-power", "bmc-no-storage", "agent-crash", "corrupt-image", "no-tftp",
          *ERASE_FAULTS, *GPU_FAULTS, *SKU_FAULTS, *LIE_FAULTS, *FIRMWARE_FAULTS)
VM_FAULTS = ("bmc-500", "bmc-down", "slow-power", "bmc-no-storage", "no-tftp", *FIRMWARE_FAULTS)  # the others are played by simulated parts
XID_FIRED = "xid-intermittent.fired"  # beside the host's profile: the intermittent Xid has shown once
DISK_BYTES = 256 * 1024 * 1024  # sparse files: they cost nothing until written
SEED_REGION = 64 * 1024 * 1024  # agent/seed.py: the cloud-init seed lives in a disk's last 64 MiB
# The lab's gpu-server is an 8x H200 SXM: it runs `dcgmi diag -r 2` and must reach 400 GB/s all-reduce busbw.
LAB_GPU_HEALTH = {"health_dcgm_level": 2, "health_nccl_min_busbw_gbps": 400.0}
GPU_MODEL = "NVIDIA H200"
MiB = 1024 * 1024


def lab_sku(role: str, disk_bytes: int = DISK_BYTES) -> dict:
    """The SKU the lab's servers of a role are built to (pools/sku.py): what their profile reports."""
    size = f"{disk_bytes // MiB}Mi" if disk_bytes % MiB == 0 else str(disk_bytes)
    if role == "gpu":
        return {"gpu": {"model": GPU_MODEL, "count": 8}, "memory": "2Ti", "nvme": {"count": 2, "minSize": size},
                "nics": {"count": 1, "minSpeedGbps": 100}}
    return {"gpu": {"count": 0}, "memory": "512Gi", "nvme": {"count": 1, "minSize": size},
            "nics": {"count": 1, "minSpeedGbps": 25}}


# A lab server's boot MAC follows from its name alone (gpu-07 is 52:54:00:1a:00:06 whatever the lab's size), so a
# larger or smaller lab keeps every other server's MAC: the fourth byte says the role.
MAC_ROLE_BYTE = {"gpu": "1a", "vm": "1b", "cpu": "1c"}


def lab_mac(name: str) -> str:
    """"gpu-07" → 52:54:00:1a:00:06; "cpu-01" → 52:54:00:1c:00:00; "vm-02" → 52:54:00:1b:00:01."""
    role, _, number = name.partition("-")
    i = int(number) - 1
    return f"52:54:00:{MAC_ROLE_BYTE[role]}:{i >> 8:02x}:{i & 255:02x}"


def parse_faults(text: str) -> list[tuple[str, str]]:
    """"gpu-xid:3,erase-fails" → [("gpu-xid", "3"), ("erase-fails", "")]."""
    return [(kind.strip(), target.strip()) for kind, _, target in
            (item.partition(":") for item in (text or "").split(",")) if kind.strip()]
NOT_SIMULATED = "the lab no longer simulates this server"  # why a server of a smaller lab is in maintenance
KUBEVIRT_CLUSTER = "kubevirt"  # the lab KubeVirt cluster: its name, and its kubeconfig's ProviderSecret
VM_NODE_TYPE = "vm-server"  # VMs have no GPUs and 1 vCPU: a node type of their own, not cpu-server's 64 cores
IMAGE_NAME = "ubuntu2404-20260926"
IMAGE_BYTES = 8 * 1024 * 1024


@dataclass
class LabHost:
    name: str
    role: str  # gpu, cpu or vm
    mac: str
    password: str
    directory: Path
    fault: str = ""
    disk_bytes: int = DISK_BYTES
    thin: bool = False  # its disks take an erase's zeros as a discard (lab/hardware.py thin_writer)
    dcgm_version: str = "3.3.9"
    tools_dir: str = ""
    agent: "subprocess.Popen | _AgentThread | None" = None
    node: tuple[TenantAPIServer, str] | None = None  # the installed OS's kubelet: (tenant API, node name)
    vm: VMServer | None = None  # a VM server: QEMU, not simulated parts

    @property
    def profile_path(self) -> Path:
        return self.directory / "hardware.json"

    def faults(self) -> list[tuple[str, str]]:
        return parse_faults(self.fault)

    def has_fault(self, kind: str) -> bool:
        return any(k == kind for k, _ in self.faults())

    def disks(self) -> list[dict]:
        """The server's disks as they are (what its BMC reports, what its tenant writes to)."""
        disks = [{"name": f"nvme{i}n1", "path": str(self.directory / f"nvme{i}n1.img"), "size_bytes": self.disk_bytes,
                  "type": "nvme", "model": "SAMSUNG MZWLO3T8HCLS" if self.role == "gpu" else "SAMSUNG MZQL21T9HCJR",
                  "serial": f"S7{self.name.upper().replace('-', '')}{i}"}
                 for i in range(2 if self.role == "gpu" else 1)]
        if self.thin:
            for disk in disks:
                disk["thin"] = True
        for kind, target in self.faults():
            if kind in (*ERASE_FAULTS, "disk-small"):
                disk = next((d for d in disks if d["name"] == (target or disks[0]["name"])), None)
                if disk is None:
                    raise ValueError(f"{self.name}: fault {kind}: no disk {target!r}")
                if kind == "disk-small":
                    disk["size_bytes"] = self.disk_bytes // 2
                else:
                    disk["fault"] = kind
        return disks

    def _reported_disks(self) -> list[dict]:
        """The disks as the agent sees them (its profile): the hardware, unless a lie fault plays an agent that
        omits a disk, forges its serial, erases a decoy of another size in its place, or reports an extra one."""
        disks = [dict(d) for d in self.disks()]
        for kind, target in self.faults():
            if kind not in LIE_FAULTS:
                continue
            if kind == "agent-extra-disk":
                disks.append({"name": "nvme9n1", "path": str(self.directory / "decoy-nvme9n1.img"),
                              "size_bytes": self.disk_bytes, "type": "nvme", "model": disks[0]["model"],
                              "serial": "EXTRA-SERIAL"})
                continue
            disk = next((d for d in disks if d["name"] == (target or disks[-1]["name"])), None)
            if disk is None:
                raise ValueError(f"{self.name}: fault {kind}: no disk {target!r}")
            if kind == "agent-omits-disk":
                disks.remove(disk)
            elif kind == "agent-forges-serial":
                disk["serial"] = FORGED_SERIAL
            else:  # agent-misreports-size: a decoy file, the real disk left as it is
                disk.update(path=str(self.directory / f"decoy-{disk['name']}.img"),
                            size_bytes=disk["size_bytes"] + 1024 * 1024)
        return disks

    def profile(self) -> dict:
        missing = {int(target or 7) for kind, target in self.faults() if kind == "gpu-missing"}
        gpus = [{"index": i, "name": GPU_MODEL, "uuid": f"GPU-{hashlib.md5(f'{self.name}/{i}'.encode()).hexdigest()}",
                 "memory_mib": 143771, "pci_bus": f"00000000:{0x18 + i * 0x10:02X}:00.0",
                 "vbios_version": "96.00.AF.00.01"}
                for i in range(8 if self.role == "gpu" else 0)]
        # A GPU off the bus: the others keep their indexes' order, renumbered as nvidia-smi would.
        gpus = [{**g, "index": n} for n, g in enumerate(g for g in gpus if g["index"] not in missing)]
        disks = self._reported_disks()
        gpu_faults = []
        for kind, target in self.faults():
            if kind in GPU_FAULTS:
                gpu_faults.append({"kind": kind, **({"gpu": int(target or 0)} if kind != "nccl-slow" else {})})
        return {
            "system": {"vendor": "Lab", "product": f"{self.role}-server", "serial": f"LAB-{self.name}",
                       "bios_version": "2.3.1" if self.role == "gpu" else "1.9.2"},
            "cpu": {"arch": "x86_64", "model": "AMD EPYC 9654" if self.role == "gpu" else "AMD EPYC 9354",
                    "count": 192 if self.role == "gpu" else 64},
            "ram_mib": 2 * 1024 * 1024 if self.role == "gpu" else 512 * 1024,
            "nics": [{"name": "eth0", "mac": self.mac, "speed_gbps": 100 if self.role == "gpu" else 25}],
            "gpus": gpus, "disks": disks,
            # For the fake tools (lab/fake_tools.py) and LabHardware.tool_env (lab/hardware.py).
            "lab": {"faults": gpu_faults, "dcgm_version": self.dcgm_version, "tools": self.tools_dir},
        }

    def allocatable(self) -> dict:
        """What its kubelet reports as capacity and allocatable: the hardware's CPUs, memory and GPUs."""
        profile = self.profile()
        resources = {"cpu": str(profile["cpu"]["count"]), "memory": f"{profile['ram_mib']}Mi", "pods": "110"}
        if profile["gpus"]:
            resources["nvidia.com/gpu"] = str(len(profile["gpus"]))
        return resources

    def disk_paths(self) -> list[Path]:
        return [Path(d["path"]) for d in self.disks()]

    def bmc_inventory(self) -> dict:
        """What its BMC lists beside the drives (lab/redfish.py: Processors, MemorySummary): the hardware's CPUs,
        memory and GPUs (the console's out-of-band inspection reads them). None for a VM: its BMC lists none."""
        if self.vm is not None:
            return None
        profile = self.profile()
        threads = profile["cpu"]["count"]
        return {"cpu": {"model": profile["cpu"]["model"], "vendor": "AMD", "sockets": 2, "cores": threads // 2,
                        "threads": threads},
                "memory_gib": profile["ram_mib"] // 1024,
                "gpus": [{"model": g["name"], "manufacturer": "NVIDIA"} for g in profile["gpus"]],
                "nic_speed_gbps": profile["nics"][0]["speed_gbps"]}

    def bmc_firmware(self) -> dict:
        """What its BMC says of its BIOS and firmware (lab/redfish.py): the components' versions as the agent sees
        them (BIOS, GPU VBIOS), and the faults that play a setting that never sticks or an update that fails."""
        versions = {"BIOS": "2.3.1" if self.role == "gpu" else "1.9.2", "BMC": "1.10.2", "NIC.1": "22.31.1014",
                    **{f"GPU.{i}": "96.00.AF.00.01" for i in range(8 if self.role == "gpu" else 0)}}
        stuck = [target or "*" for kind, target in self.faults() if kind == "bios-no-stick"]
        return {"firmware": versions, "bios_no_stick": stuck,
                "update_fails": FIRMWARE_UPDATE_FAILURE if self.has_fault("firmware-update-fails") else ""}

    def bmc_drives(self) -> list[dict]:
        """Its BMC's Storage/1/Drives (lab/redfish.py): the real disks; none with the bmc-no-storage fault."""
        if self.has_fault("bmc-no-storage"):
            return []
        return [{"id": f"Disk.Bay.{i}", "serial": d["serial"], "model": d["model"], "size_bytes": d["size_bytes"],
                 "manufacturer": d["model"].split()[0], "media_type": "SSD"} for i, d in enumerate(self.disks())]


@dataclass
class LabImage:
    name: str
    path: Path
    sha256: str
    format: str = "raw"


class LabSite:
    def __init__(self, *, hosts: int = 8, tenants: list[str] | None = None, faults: dict[str, str] | None = None,
                 inspection_modes: dict[str, str] | None = None,
                 console_url: str = "http://127.0.0.1:8000", var_dir: Path | str = ROOT / "var" / "lab",
                 power_delay: tuple[float, float] = (1, 11), bmc_port: int = 0, gpu_hosts: int | None = None,
                 agent_mode: str = "process", disk_bytes: int = DISK_BYTES, vms: int = 0,
                 health: dict | None = None, ipmi_hosts: list[str] | tuple = (), kubevirt: bool = False,
                 kubevirt_guests: str = "simulated", metal3_cluster_hosts: int = 0, thin_disks: bool = False):
        # agent_mode "process": one agent process per server, as a ramdisk runs it (the default);
        # "thread": the same agent code in threads of the lab process, for fleets of hundreds on two cores.
        self.agent_mode = agent_mode
        self.health = health or {}  # gpu-server's health tiers (pools/health_tiers.py), when a test sets them
        # The console's agent listener as the lab's host-side parts reach it, and as its VMs do (10.0.2.2).
        self.console_url = _host_view(console_url.rstrip("/"))
        self.vm_console_url = _guest_view(self.console_url)
        self.var_dir = Path(var_dir)
        self.power_delay = power_delay
        self.bmc_port = bmc_port
        self.tenant_names = tenants or []
        faults = faults or {}
        self.disk_bytes = disk_bytes
        for host, text in faults.items():
            for kind, _ in parse_faults(text):
                if kind not in FAULTS:
                    raise ValueError(f"unknown fault {kind!r} for {host}; expected one of {', '.join(FAULTS)}")
        # Default: two cpu-servers, the rest gpu-servers (8: tenant one's static pools and tenant two's dynamic pool
        # of up to 4 gpu-servers, with one spare); half and half below 4.
        gpu_count = max(hosts // 2, hosts - 2) if gpu_hosts is None else gpu_hosts
        self.hosts: dict[str, LabHost] = {}
        for i in range(hosts):
            role = "gpu" if i < gpu_count else "cpu"
            n = i + 1 if role == "gpu" else i - gpu_count + 1
            name = f"{role}-{n:02d}"
            self.hosts[name] = LabHost(name=name, role=role, mac=lab_mac(name),
                                       password=secrets.token_urlsafe(12), directory=self.var_dir / name,
                                       fault=faults.get(name, ""), disk_bytes=disk_bytes, thin=thin_disks,
                                       dcgm_version="4.2.3" if i % 2 == 0 else "3.3.9",  # both formats
                                       tools_dir=str(self.var_dir / "tools"))
        for i in range(vms):
            name = f"vm-{i + 1:02d}"
            mac = lab_mac(name)
            directory = self.var_dir / name
            self.hosts[name] = host = LabHost(name=name, role="vm", mac=mac, password=secrets.token_urlsafe(12),
                                              directory=directory, fault=faults.get(name, ""), disk_bytes=disk_bytes)
            host.vm = VMServer(name, mac, directory, disk_bytes=disk_bytes, disk_serial=host.disks()[0]["serial"],
                               probe_kernel=_agent_kernel())
            other = [k for k, _ in host.faults() if k not in VM_FAULTS]
            if other:
                raise ValueError(f"fault {other[0]!r} is not played on a VM server ({name}); expected one of "
                                 f"{', '.join(VM_FAULTS)}")
        unknown = set(faults) - set(self.hosts)
        if unknown:
            raise ValueError(f"fault for unknown host(s): {', '.join(sorted(unknown))}")
        self.ipmi_hosts = set(ipmi_hosts)
        self.inspection_modes = dict(inspection_modes or {})  # host → its BareMetalHost's spec.inspectionMode
        unknown = self.ipmi_hosts - {name for name, host in self.hosts.items() if host.vm is None}
        if unknown:
            raise ValueError(f"IPMI BMC for unknown or VM host(s): {', '.join(sorted(unknown))}")
        self.tenants: dict[str, TenantAPIServer] = {}
        # A KubeVirt cluster (lab/kubevirt.py) for a kubeVirt NodeProvider: its VMs join the tenants as nodes.
        # Its guests simulated, or QEMU VMs of the lab OS image (built at start) that join by themselves.
        self.kubevirt: KubeVirtCluster | None = KubeVirtCluster(
            KUBEVIRT_CLUSTER, check_urls=True, guests=kubevirt_guests,
            var_dir=self.var_dir / KUBEVIRT_CLUSTER) if kubevirt else None
        # Another site's Metal3 cluster (lab/metal3.py): its hosts are BareMetalHosts there, claimed by the console
        # through provider METAL3_CLUSTER's clusterRef, never registered as the console's own.
        self.metal3_cluster_hosts = metal3_cluster_hosts
        self.metal3: Metal3LabCluster | None = None
        self.images: list[LabImage] = []
        self.redfish: RedfishLab | None = None
        self._image_server: http.server.ThreadingHTTPServer | None = None
        self._stop = threading.Event()
        self._controller: threading.Thread | None = None
        self._lock = threading.Lock()
        self._bmc_recorded: dict[str, int] = {}  # every server this var_dir's labs simulated: its BMC port

    @property
    def not_simulated(self) -> list[str]:
        """The servers an earlier start of this lab simulated and this one does not (it is smaller)."""
        return sorted(set(self._bmc_recorded) - set(self.hosts))

    # --- life cycle ---------------------------------------------------------------------------------

    def start(self) -> "LabSite":
        from .fake_tools import install

        # The servers' boot configurations (their boot secrets), BMC passwords and agents' state live here: readable
        # by the lab's owner only.
        self.var_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.var_dir.chmod(0o700)
        self.tools_dir = install(self.var_dir / "tools")
        for host in self.hosts.values():
            host.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            host.directory.chmod(0o700)
            if host.vm is not None:
                host.vm.prepare()
                continue
            self._write_profile(host)
            (host.directory / GPU_STATE).unlink(missing_ok=True)  # GPUs as from the factory
        self._make_images()
        # The ports of the lab's last start in this var_dir, where still free: a restart re-registers its servers,
        # tenant APIs and images at the addresses they had, so the console's objects do not change.
        last = self._ports_last()
        self._start_image_server(last.get("images", 0))
        systems = [{"name": h.name, "mac": h.mac, "password": h.password, "port": last.get("bmc", {}).get(h.name, 0),
                    "drives": h.bmc_drives(), "inventory": h.bmc_inventory(), "ipmi": h.name in self.ipmi_hosts,
                    **h.bmc_firmware(),
                    **next(({"fault": self._bmc_fault(k)} for k, _ in h.faults()
                            if k in ("bmc-500", "bmc-down", "slow-power")), {})}
                   for h in self.hosts.values()]
        self.redfish = RedfishLab(systems, username="admin", password=secrets.token_urlsafe(12),
                                  power_delay=self.power_delay, port=self.bmc_port or last.get("shared", 0)).start()
        for name in self.tenant_names:
            self.tenants[name] = TenantAPIServer(name, port=last.get("tenants", {}).get(name, 0)).start()
        if self.kubevirt is not None:
            if self.kubevirt.guests == "qemu" and self.kubevirt.os_image is None:
                from .vmimage import OS_IMAGE, build

                self.kubevirt.os_image = build(["os-image"]).path(OS_IMAGE)  # cached after the first build
            self.kubevirt.port = last.get("kubevirt", 0)
            self.kubevirt.start()
        self._ports_keep()
        if self.metal3_cluster_hosts:
            self.start_metal3_cluster()
        self._controller = threading.Thread(target=self._control, name="lab-controller", daemon=True)
        self._controller.start()
        return self

    def start_metal3_cluster(self, **timings) -> Metal3LabCluster:
        """The other site's Metal3 cluster with its hosts, its booting servers joining this lab's tenants."""
        self.metal3 = Metal3LabCluster(METAL3_CLUSTER, tenants=list(self.tenants.values()),
                                       **{"step_s": 0.5, "clean_s": 2, **timings}).start()
        for i in range(self.metal3_cluster_hosts):
            self.metal3.add_host(f"{METAL3_CLUSTER}-{i + 1:02d}", METAL3_CLUSTER_LABELS)
        return self.metal3

    def stop(self) -> None:
        self._stop.set()
        if self._controller:
            self._controller.join(5)
        for host in self.hosts.values():
            self._stop_agent(host)
            if host.vm is not None:
                host.vm.power_off()
        if self.redfish:
            self.redfish.stop()
        if self.metal3:
            self.metal3.stop()
        for server in self.tenants.values():
            server.stop()
        if self.kubevirt is not None:
            self.kubevirt.stop()
        if self._image_server:
            self._image_server.shutdown()
            self._image_server.server_close()

    def __enter__(self) -> "LabSite":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @staticmethod
    def _bmc_fault(kind: str) -> dict:
        return {"bmc-500": {"kind": "bmc-500", "requests": 3}, "bmc-down": {"kind": "bmc-down"},
                "slow-power": {"kind": "slow-power"}}[kind]

    # --- what the console is told ---------------------------------------------------------------------

    def manifests(self) -> str:
        """BareMetalHost manifests (and their Secrets) for every lab server, and the lab's OS images."""
        docs = []
        if any(h.vm for h in self.hosts.values()):
            docs.append({"apiVersion": "management.loft.sh/v1", "kind": "NodeType", "metadata": {"name": VM_NODE_TYPE},
                         "spec": {"providerRef": "metal3", "displayName": "Lab VM server (QEMU)",
                                  "resources": {"cpu": "1", "memory": "512Mi"},
                                  "bareMetalHosts": {"selector": {"matchLabels": {"role": "vm"}}}}})
        for image in self.images:
            docs.append({"apiVersion": "management.loft.sh/v1", "kind": "OSImage",
                         "metadata": {"name": image.name},
                         "spec": {"displayName": f"{image.name} (lab, {image.format})", "format": image.format,
                                  "properties": {"metal3.vcluster.com/image-url": self.image_url(image),
                                                 "metal3.vcluster.com/image-checksum": image.sha256,
                                                 "metal3.vcluster.com/image-checksum-type": "sha256",
                                                 **self._kubevirt_image(image)}}})
        if self.metal3_cluster_hosts:
            docs.append(metal3_cluster_provider())
        for host in self.hosts.values():
            docs.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                         "metadata": {"name": f"{host.name}-bmc", "namespace": "metal3"},
                         "data": {"username": base64.b64encode(b"admin").decode(),
                                  "password": base64.b64encode(host.password.encode()).decode()}})
            address = self.redfish.system_address(host.name) if self.redfish else f"redfish+http://127.0.0.1/{host.name}"
            docs.append({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                         "metadata": {"name": host.name, "namespace": "metal3",
                                      "labels": {"role": host.role, "rack": f"r{1 + int(host.mac[-1], 16) % 2}"}},
                         "spec": {"bmc": {"address": address, "credentialsName": f"{host.name}-bmc"},
                                  "bootMACAddress": host.mac, "online": True,
                                  **({"inspectionMode": self.inspection_modes[host.name]}
                                     if host.name in self.inspection_modes else {})}})
        import yaml

        return "".join("---\n" + yaml.safe_dump(d, sort_keys=False) for d in docs)

    def register(self, actor: str = "system:lab") -> list[str]:
        """Register the servers through the same path as `apply`, and give each tenant its API."""
        from manifests.apply import apply_files
        from pools.models import Tenant
        from pools.services import tenant_set_api

        result = apply_files([("lab", self.manifests())], actor=actor)
        if self.metal3:  # the clusterRef's kubeconfig, where machines.clusters reads it
            from machines.clusters import CLUSTER_SECRET_NAMESPACE, KUBECONFIG_KEY
            from machines.models import ProviderSecret

            ProviderSecret.objects.update_or_create(
                namespace=CLUSTER_SECRET_NAMESPACE, name=METAL3_CLUSTER,
                defaults={"contents": json.dumps({KUBECONFIG_KEY: self.metal3.kubeconfig()})})
        for name, server in self.tenants.items():
            tenant = Tenant.objects.filter(name=name).first() or Tenant(name=name)
            tenant_set_api(tenant=tenant, api_endpoint=server.endpoint, kubeconfig=server.kubeconfig(), actor=actor)
        if self.kubevirt is not None:
            self.register_kubevirt()
        self.configure_node_types()
        return result.lines + self.follow_size(actor=actor)

    def register_kubevirt(self) -> None:
        """The lab KubeVirt cluster's kubeconfig where a kubeVirt NodeProvider's clusterRef.cluster finds it."""
        from machines.clusters import CLUSTER_SECRET_NAMESPACE, KUBECONFIG_KEY
        from machines.models import ProviderSecret

        ProviderSecret.objects.update_or_create(
            namespace=CLUSTER_SECRET_NAMESPACE, name=KUBEVIRT_CLUSTER,
            defaults={"contents": json.dumps({KUBECONFIG_KEY: self.kubevirt.kubeconfig()})})

    def follow_size(self, *, actor: str = "system:lab") -> list[str]:
        """What a smaller or larger lab means in the console: the servers it no longer simulates go to maintenance,
        saying why (their BMCs are silent now); those in maintenance for that reason that it simulates again come
        out (they register again, at the BMC port they had). A server serving a claim cannot go to maintenance: the
        line says what to do."""
        from events.choices import EventKind
        from events.models import Event
        from hosts.choices import HostState
        from hosts.lifecycle import TRANSITIONS, ConcurrentTransition, IllegalTransition
        from hosts.models import BareMetalHost
        from hosts.services import host_set_maintenance

        lines = []
        size = f"it runs {len(self.hosts)} servers now"
        for host in BareMetalHost.objects.filter(name__in=self.not_simulated).order_by("name"):
            if host.state in (HostState.MAINTENANCE, HostState.RETIRED):
                continue
            if HostState.MAINTENANCE not in TRANSITIONS[host.state]:
                lines.append(f"{host.name}: the lab no longer simulates it ({size}), but it is {host.state}: "
                             "release its claim, then put it in maintenance")
                continue
            try:
                host_set_maintenance(host=host, on=True, actor=actor,
                                     reason=f"{NOT_SIMULATED} ({size}); a larger lab brings it back")
            except (IllegalTransition, ConcurrentTransition) as exc:  # a flow moved it meanwhile
                lines.append(f"{host.name}: the lab no longer simulates it ({size}); not put in maintenance: {exc}")
                continue
            lines.append(f"{host.name}: in maintenance: {NOT_SIMULATED} ({size})")
        back = BareMetalHost.objects.filter(name__in=list(self.hosts), state=HostState.MAINTENANCE).order_by("name")
        for host in back:
            why = (Event.objects.filter(host_id=host.pk, kind=EventKind.TRANSITION, to_state=HostState.MAINTENANCE)
                   .order_by("-id").values_list("message", flat=True).first() or "")
            if why.startswith(NOT_SIMULATED):  # not one a person put there
                host_set_maintenance(host=host, on=False, actor=actor, reason="the lab simulates it again")
                lines.append(f"{host.name}: out of maintenance: the lab simulates it again")
        return lines

    def configure_node_types(self) -> None:
        """The lab's GPU servers are 8x H200: gpu-server gets their health suite, unless someone set one. A
        thread-mode lab (hundreds of servers on one disk, for the fleet benchmark) wipes metadata only, still
        verified, instead of overwriting hundreds of disk files."""
        from pools.models import NodeType

        NodeType.objects.filter(name="gpu-server", health_nccl_min_busbw_gbps__isnull=True).update(**LAB_GPU_HEALTH)
        # The SKU the lab's servers are built to (lab_sku), unless someone set one: gpu-missing and disk-small
        # hosts then go to repair instead of the pool.
        for role in ("gpu", "cpu"):
            NodeType.objects.filter(name=f"{role}-server", sku={}).update(sku=lab_sku(role, self.disk_bytes))
        if self.health:
            NodeType.objects.filter(name="gpu-server").update(health=self.health)
        if self.agent_mode == "thread":
            NodeType.objects.update(cleaning_policy="metadata", cleaning_fallback="")

    # --- images -------------------------------------------------------------------------------------

    def _make_images(self) -> None:
        directory = self.var_dir / "images"
        directory.mkdir(parents=True, exist_ok=True)
        raw = directory / f"{IMAGE_NAME}.raw"
        if not raw.exists() or raw.stat().st_size != IMAGE_BYTES:
            block = bytearray()
            seed = b"vmetal-lab-image"
            while len(block) < IMAGE_BYTES:
                seed = hashlib.sha256(seed).digest()
                block += seed * 128
            block[:16] = b"VMETAL-LAB-IMAGE"
            block[510:512] = b"\x55\xaa"  # an MBR signature, as a real disk image has
            raw.write_bytes(bytes(block[:IMAGE_BYTES]))
        self.images = [LabImage(IMAGE_NAME, raw, _sha256(raw))]
        qemu_img = shutil.which("qemu-img")
        if qemu_img:
            qcow2 = directory / f"{IMAGE_NAME}.qcow2"
            if not qcow2.exists():
                subprocess.run([qemu_img, "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
            self.images.append(LabImage(f"{IMAGE_NAME}-qcow2", qcow2, _sha256(qcow2), "qcow2"))
        (directory / "SHA256SUMS").write_text("".join(f"{i.sha256}  {i.path.name}\n" for i in self.images))

    def _kubevirt_image(self, image: LabImage) -> dict:
        """With the lab's KubeVirt cluster: a VM's root disk is imported from the same image (its controller asks
        the URL, so it must be the lab image server's)."""
        if self.kubevirt is None:
            return {}
        return {"kubevirt.vcluster.com/image-url": self.image_url(image), "kubevirt.vcluster.com/root-disk-size": "20Gi"}

    def image_url(self, image: LabImage) -> str:
        return f"http://127.0.0.1:{self._image_server.server_address[1]}/{image.path.name}"

    PORTS_FILE = "ports.json"

    def _ports_last(self) -> dict:
        """The ports recorded by the last start (bmc per host, shared, tenants, images), each kept only if free."""
        try:
            last = json.loads((self.var_dir / self.PORTS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(last, dict):
            return {}
        recorded = last.get("bmc") if isinstance(last.get("bmc"), dict) else {}
        self._bmc_recorded = {k: v for k, v in recorded.items() if isinstance(v, int)}

        def free(port) -> int:
            return port if isinstance(port, int) and 0 < port < 65536 and port_free(port) else 0

        return {"images": free(last.get("images")), "shared": free(last.get("shared")),
                "bmc": {k: free(v) for k, v in (last.get("bmc") or {}).items()},
                "tenants": {k: free(v) for k, v in (last.get("tenants") or {}).items()},
                "kubevirt": free(last.get("kubevirt"))}

    def _ports_keep(self) -> None:
        # The servers an earlier, larger lab simulated keep their BMC ports here: a larger lab again brings them back
        # at the address the console knows.
        bmc = {**self._bmc_recorded, **{name: self.redfish.system_port(name) for name in self.hosts}}
        ports = {"images": self._image_server.server_address[1], "shared": self.redfish.port, "bmc": bmc,
                 "tenants": {n: t.port for n, t in self.tenants.items()},
                 "kubevirt": self.kubevirt.port if self.kubevirt is not None else 0}
        (self.var_dir / self.PORTS_FILE).write_text(json.dumps(ports, indent=1))

    def _start_image_server(self, port: int = 0) -> None:
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                path = site.var_dir / "images" / Path(self.path.split("?")[0]).name
                if not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                mac = re.search(r"mac ([0-9a-f:]{17})", self.headers.get("User-Agent", ""))
                host = next((h for h in site.hosts.values() if mac and h.mac == mac.group(1)), None)
                if host is not None and host.has_fault("corrupt-image") and path.suffix != "" and "SUMS" not in path.name:
                    data = bytearray(data)
                    data[len(data) // 2] ^= 0xFF  # one flipped byte in transit
                    data = bytes(data)
                start = 0
                ranged = re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))
                if ranged:
                    start = int(ranged.group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                try:
                    self.wfile.write(data[start:])
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self._image_server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._image_server.daemon_threads = True
        threading.Thread(target=self._image_server.serve_forever, name="lab-images", daemon=True).start()

    # --- the controller: what a server does when its power changes ----------------------------------

    def _control(self) -> None:
        seq = 0
        while not self._stop.is_set():
            try:
                events = self.redfish.events(since=seq)
            except Exception:
                if self._stop.is_set():
                    return
                log.warning("lab controller: Redfish lab not answering", exc_info=True)
                self._stop.wait(1)
                continue
            for event in events:
                seq = max(seq, event["seq"])
                host = self.hosts.get(event["system"])
                if host is None:
                    continue
                try:
                    self.on_power(host, event)
                except Exception:
                    log.exception("lab controller: %s %s failed", host.name, event.get("cause"))
            self._watch_vms()
            self._stop.wait(0.1)

    def _watch_vms(self) -> None:
        """A VM whose QEMU ended without its BMC asking (the guest powered off): its BMC shows Off."""
        for host in self.hosts.values():
            if host.vm is not None and host.vm.exited_by_itself():
                try:
                    self.redfish.power_changed(host.name, "Off", cause="guest-power-off")
                except Exception:
                    log.warning("%s: could not tell the BMC the VM powered off", host.name, exc_info=True)

    def on_power(self, host: LabHost, event: dict) -> None:
        if host.vm is not None:
            with self._lock:
                self._vm_power(host, event)
            return
        with self._lock:
            self._stop_agent(host)
            self._stop_os(host)
            if event["power_state"] != "On":
                return
            if event.get("boot_target") in ("Pxe", "Cd"):
                boot_config = self._boot_config(host, event)
                if boot_config is None:
                    log.warning("%s: powered on into %s but got no boot configuration: no agent", host.name,
                                event.get("boot_target"))
                    return
                self._start_agent(host, boot_config)
            else:
                self._boot_installed_os(host)

    def _vm_power(self, host: LabHost, event: dict) -> None:
        """The BMC's landed power change, played on the VM: the boot target and one-time override in force at
        power-on, the inserted virtual media as its CD, its DHCP boot file from the console's DHCP rules."""
        from hosts.boot.dhcp import ipxe_chain_script

        if event["power_state"] != "On":
            host.vm.power_off(graceful=event.get("request") == "GracefulShutdown")
            return
        media = event.get("virtual_media") or {}
        chain = None if host.has_fault("no-tftp") else ipxe_chain_script(self.vm_console_url)
        host.vm.power_on(boot=event.get("boot_target") or "Hdd", once=bool(event.get("boot_once")),
                         chain_script=chain, cd_file=media.get("file") if media.get("inserted") else None)

    def _boot_config(self, host: LabHost, event: dict) -> str | None:
        """What the server's firmware gets from the boot path: the kernel command line of its iPXE script
        (network boot), or VMETAL.CFG from the CD its BMC downloaded (virtual media). None: nothing to boot."""
        if event.get("boot_target") == "Cd":
            media = event.get("virtual_media") or {}
            config = _iso_config(media["file"]) if media.get("inserted") and media.get("file") else None
            return _host_view(config) if config else None
        if host.has_fault("no-tftp"):
            return None
        url = f"{self.console_url}/boot/{host.mac.replace(':', '-')}.ipxe"
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as resp:
                script = resp.read().decode()
        except (OSError, ValueError) as exc:
            log.info("%s: iPXE script %s: %s", host.name, url, exc)
            return None
        kernel = next((line for line in script.splitlines() if line.startswith("kernel ")), None)
        # The agent runs on this host: the console's address for VMs (10.0.2.2) is 127.0.0.1 here.
        return _host_view(kernel.split(None, 2)[2]) if kernel and len(kernel.split(None, 2)) == 3 else None

    def _start_agent(self, host: LabHost, boot_config: str) -> None:
        ramdisk = host.directory / "ramdisk"  # the agent's tmp dir: a fresh "ramdisk" on every PXE boot
        shutil.rmtree(ramdisk, ignore_errors=True)
        ramdisk.mkdir(parents=True)
        cmdline = ramdisk / "cmdline"  # the ramdisk's /proc/cmdline
        cmdline.write_text(boot_config + "\n")
        if self.agent_mode == "thread" and not host.has_fault("agent-crash"):
            host.agent = _AgentThread(host.profile_path, ramdisk, cmdline)
            return
        log_file = host.directory / "agent.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        # agent-crash: the same agent, started through a wrapper that kills it when it gets its first command.
        program = "lab.crashing_agent" if host.has_fault("agent-crash") else "agent"
        host.agent = subprocess.Popen(
            [sys.executable, "-m", program, "--boot-config", str(cmdline), "--hardware", LAB_HARDWARE,
             "--hardware-arg", str(host.profile_path), "--log-file", str(log_file), "--tmp-dir", str(ramdisk)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        log.info("%s: powered on into PXE, agent started (pid %s)", host.name, host.agent.pid)

    def _stop_agent(self, host: LabHost) -> None:
        proc, host.agent = host.agent, None
        if isinstance(proc, _AgentThread):
            proc.stop()
        elif proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)

    def _boot_installed_os(self, host: LabHost) -> None:
        """First boot from disk: cloud-init reads the NoCloud seed and runs the join command."""
        seed = None
        for path in host.disk_paths():
            try:
                seed = read_seed(str(path))
                break
            except (SeedError, OSError):
                continue
        if seed is None:
            log.info("%s: booted from disk, no seed: nothing to join", host.name)
            return
        import yaml

        user_data = yaml.safe_load(seed["user-data"]) or {}
        meta_data = yaml.safe_load(seed["meta-data"]) or {}
        node_name = meta_data.get("local-hostname") or host.name
        for command in user_data.get("runcmd") or []:
            text = command if isinstance(command, str) else " ".join(command)
            try:
                endpoint, token = parse_join_command(text)
            except ValueError:
                continue
            server = next((s for s in self.tenants.values() if s.endpoint == endpoint), None)
            if server is None:
                log.warning("%s: join command names an unknown tenant API %s", host.name, endpoint)
                return
            threading.Thread(target=self._join, args=(host, server, token, node_name), daemon=True).start()
            return

    def _join(self, host: LabHost, server: TenantAPIServer, token: str, node_name: str) -> None:
        time.sleep(0.5)  # cloud-init and the kubelet start
        labels = {"kubernetes.io/hostname": node_name, "node.kubernetes.io/instance-type": f"{host.role}-server"}
        try:
            kubelet_join(server.endpoint, token, node_name, labels, capacity=host.allocatable(),
                         sample_pods=not _of_dynamic_pool(node_name))
            host.node = (server, node_name)
            log.info("%s: joined tenant %s as node %s", host.name, server.name, node_name)
        except Exception as exc:
            log.warning("%s: join failed: %s", host.name, exc)

    def _stop_os(self, host: LabHost) -> None:
        node, host.node = host.node, None
        if node is not None:
            server, name = node
            try:
                server.kubelet_stop(name)
            except Exception:
                pass  # the node may be gone already (drained and deleted)

    # --- for tests ----------------------------------------------------------------------------------

    def read_disk(self, host: str, offset: int, length: int, disk: int = 0) -> bytes:
        with open(self.hosts[host].disk_paths()[disk], "rb") as f:
            f.seek(offset)
            return f.read(length)

    def kill_agent(self, host: str) -> None:
        """The server's agent dies (the ramdisk hangs); its power stays as it is."""
        with self._lock:
            self._stop_agent(self.hosts[host])

    def set_fault(self, host: str, fault: str) -> None:
        """Break (or mend, with "") a server while the lab runs: the fake tools and the next agent boot see it."""
        for kind, _ in parse_faults(fault):
            if kind not in FAULTS:
                raise ValueError(f"unknown fault {kind!r}; expected one of {', '.join(FAULTS)}")
        lab_host = self.hosts[host]
        lab_host.fault = fault
        self._write_profile(lab_host)

    def set_gpu_state(self, host: str, **settings) -> None:
        """A tenant's changes to every GPU of the server, as the fake nvidia-smi keeps them (lab/fake_tools.py):
        mig_current / mig_pending ("Enabled"), instances (["1g.18gb", ...]), persistence ("Disabled"),
        app_graphics / app_memory (MHz), power_limit (W)."""
        lab_host = self.hosts[host]
        path = lab_host.directory / GPU_STATE
        states = json.loads(path.read_text()) if path.exists() else {}
        for gpu in lab_host.profile()["gpus"]:
            states[str(gpu["index"])] = {**states.get(str(gpu["index"]), {}), **settings}
        path.write_text(json.dumps(states, indent=1))

    def gpu_state(self, host: str) -> dict:
        """The server's GPU settings as the fake nvidia-smi keeps them ({} when none changed since the start)."""
        path = self.hosts[host].directory / GPU_STATE
        return json.loads(path.read_text()) if path.exists() else {}

    @staticmethod
    def _write_profile(host: LabHost) -> None:
        """The server's profile for the agent and the fake tools, its disk files at their sizes (disk-small
        shrinks one), and the intermittent Xid armed again."""
        profile = host.profile()
        host.profile_path.write_text(json.dumps(profile, indent=1))
        for disk in {d["path"]: d for d in (*host.disks(), *profile["disks"])}.values():  # decoys too
            with open(disk["path"], "ab") as f:
                f.truncate(disk["size_bytes"])
        (host.directory / XID_FIRED).unlink(missing_ok=True)

    def write_pattern(self, host: str, pattern: bytes, *, image_bytes: int = 16 * 1024 * 1024) -> int:
        """The tenant's workload writing its data across the server's disks while the installed OS runs: every
        disk, whole, except where the OS lives on the first (its image at the start, the seed at the end).
        Returns the bytes written. Refused when the server is not running its installed OS."""
        lab_host = self.hosts[host]
        if lab_host.node is None:
            raise RuntimeError(f"{host} is not running its installed OS: no tenant can write to it")
        block = (pattern * (1024 * 1024 // len(pattern) + 1))[:1024 * 1024]
        written = 0
        for i, path in enumerate(lab_host.disk_paths()):
            size = os.path.getsize(path)
            start, end = (image_bytes, size - SEED_REGION) if i == 0 else (0, size)
            with open(path, "r+b") as f:
                offset = start
                while offset < end:
                    n = min(len(block), end - offset)
                    f.seek(offset)
                    f.write(block[:n])
                    offset += n
                    written += n
                f.flush()
                os.fsync(f.fileno())
        return written

    def scan_disks(self, host: str, needle: bytes) -> list[tuple[str, int]]:
        """Every place (disk file, offset) where `needle` occurs on the server's disks, each read whole."""
        hits = []
        overlap = len(needle) - 1
        for path in self.hosts[host].disk_paths():
            with open(path, "rb") as f:
                offset, tail = 0, b""
                while True:
                    chunk = f.read(8 * 1024 * 1024)
                    if not chunk:
                        break
                    data = tail + chunk
                    at = data.find(needle)
                    while at >= 0:
                        hits.append((path.name, offset - len(tail) + at))
                        at = data.find(needle, at + 1)
                    tail = data[-overlap:] if overlap else b""
                    offset += len(chunk)
        return hits


METAL3_CLUSTER = "lab-metal3"
METAL3_CLUSTER_LABELS = {"role": "gpu", "site": METAL3_CLUSTER}  # `site`: none of the console's own hosts has it


def metal3_cluster_provider() -> dict:
    """The NodeProvider of the lab's Metal3 cluster: kind metal3 with a clusterRef, one NodeType over its hosts."""
    return {"apiVersion": "management.loft.sh/v1", "kind": "NodeProvider", "metadata": {"name": METAL3_CLUSTER},
            "spec": {"displayName": "Lab Metal3 cluster (another site's baremetal-operator)",
                     "metal3": {"clusterRef": {"cluster": METAL3_CLUSTER, "namespace": "metal3"},
                                "nodeTypes": [{"name": f"{METAL3_CLUSTER}-gpu", "resources": {"cpu": "64",
                                                                                           "memory": "512Gi"},
                                               "bareMetalHosts": {"selector": {"matchLabels": {
                                                   "site": METAL3_CLUSTER}}}}]}}}


def _of_dynamic_pool(node_name: str) -> bool:
    """Whether the node serves a claim of a dynamic pool: such a node starts empty (no sample workload), as
    a new node does, so that only the tenant's own pods keep it from being consolidated."""
    from django.db import connection

    from claims.models import NodeClaim
    from pools.choices import PoolKind

    try:
        return NodeClaim.objects.filter(node_name=node_name, pool__kind=PoolKind.DYNAMIC).exists()
    except Exception:  # no database here (a lab without the console): the node gets the sample pods
        log.info("%s: could not look up its pool", node_name, exc_info=True)
        return False
    finally:
        connection.close()  # this is a join thread of its own


class _AgentThread:
    """The agent, run in a thread of the lab process (agent_mode="thread")."""

    def __init__(self, profile: Path, ramdisk: Path, cmdline: Path):
        from agent import bootconfig
        from agent.runner import Agent

        boot = bootconfig.read(str(cmdline))
        self.agent = Agent(boot.console, LabHardware.from_file(str(profile)), backoff_initial=0.2, tmp_dir=str(ramdisk),
                           boot_secret=boot.boot_secret)
        self.thread = threading.Thread(target=self.agent.run, name=f"agent-{profile.parent.name}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Power gone: the agent makes no further call (its token dies with the boot anyway). Not joined: the
        controller handles every server's power events in turn, and waiting here for an agent's call in flight
        (or for the reboot it asked for, which is this very event) held up every other server's boot."""
        self.agent.stop()


def _host_view(text: str) -> str:
    """URLs as this host reaches them: QEMU's guest-side address of the host is its loopback."""
    return re.sub(rf"(https?://){re.escape(GUEST_HOST)}(?=[:/]|$)", r"\g<1>127.0.0.1", text)


def _guest_view(url: str) -> str:
    """The console's URL as a lab VM reaches it: the host's loopback is 10.0.2.2 from inside QEMU."""
    return re.sub(r"^(https?://)(127\.0\.0\.1|localhost)(?=[:/]|$)", rf"\g<1>{GUEST_HOST}", url)


def _agent_kernel() -> Path | None:
    """The agent ramdisk's kernel, if built (IMAGE_DIR/agent/vmlinuz): what the KVM probe boots."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        path = Path(settings.IMAGE_DIR) / "agent" / "vmlinuz"
    except ImproperlyConfigured:  # no Django settings: a lab without the console
        return None
    return path if path.is_file() else None


def _iso_config(path: str) -> str | None:
    """VMETAL.CFG of a boot ISO (hosts/boot/ramdisk.py makes them), as the ramdisk reads it from its CD."""
    import io

    import pycdlib

    iso = pycdlib.PyCdlib()
    try:
        iso.open(path)
        out = io.BytesIO()
        iso.get_file_from_iso_fp(out, iso_path="/VMETAL.CFG;1")
        iso.close()
    except Exception as exc:  # not an ISO, or no VMETAL.CFG: the CD does not boot the agent
        log.info("virtual media %s: %s", path, exc)
        return None
    return out.getvalue().decode(errors="replace").strip()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
