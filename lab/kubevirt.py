"""The lab's KubeVirt cluster: the tenant API emulator (lab/kube.py) serving the kinds of kubevirt.io and
cdi.kubevirt.io, plus a controller that plays virt-controller, CDI and the guests.

What the controller does, as the real ones do it, polling the cluster through the official client like any
other controller:

- CDI: a DataVolume imports (phase ImportScheduled → ImportInProgress with a progress → Succeeded); an image URL
  the lab is told fails (`fail_import`), or with `check_urls` one that answers an error, ends it Failed.
- virt-controller: a VirtualMachine with runStrategy Always (or RerunOnFailure) and its DataVolumes Succeeded gets
  its VirtualMachineInstance (Pending → Scheduling → Scheduled → Running); runStrategy Halted deletes it, a
  deleted VMI (a restart) is made again, a VMI whose VM is gone is deleted. VM status.printableStatus follows.
- the guest: once its VMI runs, it reads its cloud-init NoCloud user data (the Secret the VM's
  cloudInitNoCloud volume names, or the user data inline), finds the join command in runcmd and joins the
  tenant that command names (lab.kube.kubelet_join) with the VMI's hostname as its node name. The controller
  knows no tenant: the endpoint comes from the join command. When the VMI goes, the kubelet stops (NotReady).

Guests are simulated (the default: the join above, done by the controller) or, with `guests="qemu"`, real QEMU
virtual machines (lab/vm.py, TCG) booting the lab OS image (lab/vmimage.py os-image), as virt-launcher runs them:

- CDI's import makes the DataVolume's disk: a qcow2 overlay of the lab OS image, as large as the DataVolume asks
  (its source URL is checked as above, never downloaded); the DataVolume's deletion removes it.
- the VMI's QEMU process is started when the VMI is scheduled (then Running): the root disk on virtio-blk first in
  the boot order, and the cloudInitNoCloud volume as a second virtio disk, a NoCloud seed in the layout the agent
  writes on bare metal (agent/seed.py: a `cidata` ISO in the disk's last 64 MiB), so the OS image reads it as it
  does on a server: meta-data (instance-id, local-hostname: the VMI's hostname), user-data, network-config (the
  volume's networkData; without it, DHCP from QEMU's user-mode network). The guest joins the tenant itself from
  its runcmd, reaching this host as 10.0.2.2: a tenant API on 127.0.0.1 must be named so in the join command.
- the QEMU process is the VMI: a stop, a restart or a deleted VM kills it (the OS image has no ACPI handler), and
  the tenant's node lifecycle controller is played as for simulated guests (NotReady); a guest that powers off
  ends its VMI Succeeded, a QEMU that dies ends it Failed, and runStrategy Always starts a new VMI.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import kmock
import yaml

from agent.seed import GPT_RESERVE_BYTES, SEED_REGION_BYTES, SeedError, build_seed_iso, write_seed_to_disk

from .kube import (RESOURCES, TenantAPIServer, TenantEmulator, _api_client, _close, _set_ready, kubelet_join,
                   parse_join_command)
from .redfish import GUEST_HOST
from .vm import QEMU, SERCON_PORT, VMError, VMServer, accelerator, qemu_available

log = logging.getLogger(__name__)

KUBEVIRT = ("kubevirt.io", "v1")
CDI = ("cdi.kubevirt.io", "v1beta1")
VMS = kmock.resource(*KUBEVIRT, "virtualmachines")
VMIS = kmock.resource(*KUBEVIRT, "virtualmachineinstances")
DATA_VOLUMES = kmock.resource(*CDI, "datavolumes")
VERBS = {"create", "delete", "get", "list", "patch", "update", "watch"}
KUBEVIRT_RESOURCES = {
    VMS: kmock.ResourceInfo(kind="VirtualMachine", singular="virtualmachine", namespaced=True, shortnames={"vm"},
                            verbs=VERBS, subresources={"status"}),
    VMIS: kmock.ResourceInfo(kind="VirtualMachineInstance", singular="virtualmachineinstance", namespaced=True,
                             shortnames={"vmi"}, verbs=VERBS, subresources={"status"}),
    DATA_VOLUMES: kmock.ResourceInfo(kind="DataVolume", singular="datavolume", namespaced=True, shortnames={"dv"},
                                     verbs=VERBS, subresources={"status"}),
}
RUNNING_STRATEGIES = ("Always", "RerunOnFailure")
VMI_PHASES = ("Pending", "Scheduling", "Scheduled", "Running")  # one step per controller pass
HOST_NODE = "kubevirt-node-1"  # the KubeVirt cluster's own node the lab's VMIs run on
GUESTS = ("simulated", "qemu")
FINISHED = ("Succeeded", "Failed")
RESTART_BACKOFF_S = 5.0  # a finished VMI of runStrategy Always is started again after this (KubeVirt backs off too)
SLIRP_GUEST_IP = "10.0.2.15"  # the address QEMU's user-mode DHCP gives a guest


def _capacity(vmi_spec: dict) -> dict:
    """The node's capacity as the guest's kubelet reports it: the domain's cores and memory."""
    domain = vmi_spec.get("domain") or {}
    capacity = {"cpu": str((domain.get("cpu") or {}).get("cores") or 1)}
    memory = ((domain.get("memory") or {}).get("guest")
              or ((domain.get("resources") or {}).get("requests") or {}).get("memory"))
    if memory:
        capacity["memory"] = str(memory)
    return capacity


def _guest_ram_mib(vmi_spec: dict, cap: int) -> int:
    """The domain's memory for QEMU, between 512 MiB (the OS image runs from RAM) and the lab's cap."""
    from kubernetes.utils import parse_quantity

    domain = vmi_spec.get("domain") or {}
    memory = ((domain.get("memory") or {}).get("guest")
              or ((domain.get("resources") or {}).get("requests") or {}).get("memory"))
    try:
        mib = int(parse_quantity(memory)) // 2**20 if memory else cap
    except ValueError:
        mib = cap
    return max(512, min(mib, cap))


class KubeVirtGuest(VMServer):
    """virt-launcher's QEMU for one VMI: the root disk (a qcow2 overlay) and the NoCloud seed disk on virtio-blk,
    a virtio NIC on QEMU's user-mode network, the serial console in console.log. Power as VMServer's."""

    def __init__(self, name: str, mac: str, directory: Path, *, root_disk: Path, cores: int, ram_mib: int):
        super().__init__(name, mac, directory, disk_bytes=0, disk_serial="", ram_mib=ram_mib)
        self.root_disk, self.cores = root_disk, cores

    @property
    def seed_disk(self) -> Path:
        return self.directory / "cloudinitdisk.img"

    def prepare(self, *, user_data: str, meta_data: str, network_config: str | None) -> None:
        """The seed disk as the agent lays it out on a server's disk: the cidata ISO in its last 64 MiB."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "sercon.bin").write_bytes(SERCON_PORT)  # SeaBIOS's text console, as VMServer's
        with open(self.seed_disk, "wb") as disk:
            disk.truncate(SEED_REGION_BYTES + GPT_RESERVE_BYTES)
        write_seed_to_disk(str(self.seed_disk), build_seed_iso(user_data, meta_data, network_config))

    def command(self, *, boot: str, once: bool, cd: bool) -> list[str]:
        return [
            QEMU, "-name", self.name, "-machine", "pc", "-accel", accelerator(),
            "-m", str(self.ram_mib), "-smp", str(self.cores), "-nodefaults", "-display", "none", "-vga", "none",
            "-serial", f"file:{self.console_log}", "-monitor", "stdio",
            "-fw_cfg", f"name=etc/sercon-port,file={self.directory / 'sercon.bin'}",
            "-drive", f"file={self.root_disk},format=qcow2,if=none,id=rootdisk",
            "-device", "virtio-blk-pci,drive=rootdisk,bootindex=1",
            "-drive", f"file={self.seed_disk},format=raw,if=none,id=cloudinitdisk,readonly=on",
            "-device", "virtio-blk-pci,drive=cloudinitdisk",
            "-netdev", "user,id=n0", "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile=",
        ]


class KubeVirtEmulator(TenantEmulator):
    """The tenant API emulator with KubeVirt's and CDI's kinds registered."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        for res, info in {**RESOURCES, **KUBEVIRT_RESOURCES}.items():
            self.resources[res] = info


class KubeVirtCluster(TenantAPIServer):
    """A KubeVirt cluster on 127.0.0.1 with its controller running.

    with KubeVirtCluster("kubevirt") as cluster:
        cluster.kubeconfig()                   # for a ProviderSecret's `kubeconfig` key
        cluster.fail_import(url)               # DataVolumes of this URL end Failed
        cluster.import_s = 2                   # a slow import

    KubeVirtCluster("kubevirt", guests="qemu", os_image=path, var_dir=dir)  # real QEMU guests of the lab OS image
    """

    emulator_class = KubeVirtEmulator

    def __init__(self, name: str = "kubevirt", *, import_s: float = 0.3, tick_s: float = 0.05,
                 check_urls: bool = False, guests: str = "simulated", os_image: Path | str | None = None,
                 var_dir: Path | str | None = None, guest_ram_mib: int = 1024, guest_cores: int = 1,
                 **kwargs) -> None:
        super().__init__(name, **kwargs)
        if guests not in GUESTS:
            raise ValueError(f"guests must be one of {', '.join(GUESTS)}, not {guests!r}")
        self.import_s = import_s  # how long an import takes
        self.tick_s = tick_s
        self.check_urls = check_urls  # ask each http(s) image URL before importing it (the lab site's images)
        self.guests = guests
        self.os_image = Path(os_image) if os_image else None  # QEMU guests' image: needed by start()
        self.var_dir = Path(var_dir) if var_dir else None  # QEMU guests' disks and consoles (a temporary one if None)
        # TCG on a small host: the lab caps what a guest gets, whatever its domain asks.
        self.guest_ram_mib, self.guest_cores = guest_ram_mib, guest_cores
        self.failing_urls: set[str] = set()
        self.joins: list[dict] = []  # every guest join: {"vmi", "node", "endpoint", "error"} (QEMU: once seen)
        self._imports: dict[str, float] = {}  # DataVolume uid -> when its import began
        # running VMI uid -> {"endpoint", "token", "node"} (simulated: once it joined; QEMU: from the seed's join,
        # plus "vm", the KubeVirtGuest, and "record", its entry in joins once the guest said it joined)
        self._guests: dict[str, dict] = {}
        self._disks: dict[str, Path] = {}  # DataVolume uid -> its disk (QEMU guests)
        self._finished: dict[str, float] = {}  # VMI uid -> when it was seen Succeeded or Failed
        self._own_dir: tempfile.TemporaryDirectory | None = None
        self._controller: threading.Thread | None = None
        self._halt = threading.Event()

    def fail_import(self, url: str) -> None:
        """DataVolumes importing this URL end Failed, as CDI's importer does on a 404."""
        self.failing_urls.add(url)

    def start(self, timeout: float = 10, **kwargs) -> KubeVirtCluster:
        if self.guests == "qemu":
            self._prepare_qemu()
        super().start(timeout, **kwargs)
        if self._controller is None or not self._controller.is_alive():
            self._halt.clear()
            self._controller = threading.Thread(target=self._run, name=f"kubevirt-controller-{self.name}",
                                                daemon=True)
            self._controller.start()
        return self

    def stop(self, timeout: float = 10) -> None:
        self._halt.set()
        if self._controller is not None:
            self._controller.join(timeout)
            self._controller = None
        for guest in self._guests.values():  # the cluster goes: so do its VMs (no QEMU left behind)
            if guest.get("vm") is not None:
                guest["vm"].power_off()
        self._guests.clear()
        super().stop(timeout)
        if self._own_dir is not None:
            self._own_dir.cleanup()
            self._own_dir = self.var_dir = None

    def _prepare_qemu(self) -> None:
        if self.os_image is None or not self.os_image.is_file():
            raise VMError(f"QEMU guests boot the lab OS image: none at {self.os_image} "
                          "(python -m lab.vmimage os-image builds it)")
        if not qemu_available() or shutil.which("qemu-img") is None:
            raise VMError(f"{QEMU} and qemu-img are not installed (Debian: qemu-system-x86, qemu-utils)")
        if self.var_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix=f"vmetal-kubevirt-{self.name}-")
            self.var_dir = Path(self._own_dir.name)
        for sub in ("images", "disks", "guests"):
            (self.var_dir / sub).mkdir(parents=True, exist_ok=True)
        # The cluster's own copy: every disk's backing file, whatever happens to the build cache meanwhile.
        base = self.var_dir / "images" / self.os_image.name
        if not base.exists() or base.stat().st_size != self.os_image.stat().st_size:
            shutil.copyfile(self.os_image, base)
        self._base_image = base

    # -- the controller

    def _run(self) -> None:
        api = _api_client(self.endpoint, self.token)
        try:
            from kubernetes import client

            custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
            while not self._halt.wait(self.tick_s):
                try:
                    self._pass(custom, core)
                except Exception as exc:  # a lab controller keeps going, as the real ones do
                    log.warning("kubevirt controller %s: %r", self.name, exc)
        finally:
            _close(api)

    @staticmethod
    def _list(custom, group_version: tuple[str, str], plural: str) -> list[dict]:
        return custom.list_cluster_custom_object(*group_version, plural, _request_timeout=10)["items"]

    def _pass(self, custom, core) -> None:
        for dv in self._list(custom, CDI, "datavolumes"):
            self._import(custom, dv)
        dvs = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
               for d in self._list(custom, CDI, "datavolumes")}
        vms = {(v["metadata"]["namespace"], v["metadata"]["name"]): v for v in self._list(custom, KUBEVIRT,
                                                                                            "virtualmachines")}
        vmis = {(v["metadata"]["namespace"], v["metadata"]["name"]): v
                for v in self._list(custom, KUBEVIRT, "virtualmachineinstances")}
        for uid in set(self._guests) - {v["metadata"]["uid"] for v in vmis.values()}:
            self._power_off_guest(uid)  # its VMI was deleted: a restart, a stop, or its VM deleted
        for key, vmi in vmis.items():
            if key not in vms:  # the garbage collector: a VMI goes with its VM
                self._delete_vmi(custom, vmi)
            elif self.guests == "qemu":
                self._follow_guest(custom, vmi)
        for key, vm in vms.items():
            self._reconcile_vm(custom, core, vm, vmis.get(key), dvs)
        if self.guests == "qemu":  # a deleted DataVolume's disk goes, once no QEMU has it open
            in_use = {g.get("disk") for g in self._guests.values()}
            for uid in set(self._disks) - {d["metadata"]["uid"] for d in dvs.values()}:
                if self._disks[uid] not in in_use:
                    self._disks.pop(uid).unlink(missing_ok=True)

    def _import(self, custom, dv: dict) -> None:
        meta, status = dv["metadata"], dv.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        source = (dv.get("spec") or {}).get("source") or {}
        url = (source.get("http") or source.get("registry") or {}).get("url", "")
        began = self._imports.setdefault(meta["uid"], time.monotonic())
        why = self._import_error(url) if not status.get("phase") else None
        if not why and not status.get("phase") and self.guests == "qemu":
            why = self._make_disk(dv)
        if why:
            changes = {"phase": "Failed", "progress": "N/A", "conditions": [
                {"type": "Ready", "status": "False", "reason": "Error", "message": why},
                {"type": "Running", "status": "False", "reason": "Error", "message": why}]}
        elif not status.get("phase"):
            changes = {"phase": "ImportScheduled", "progress": "N/A"}
        else:
            share = min(1.0, (time.monotonic() - began) / self.import_s) if self.import_s > 0 else 1.0
            changes = ({"phase": "Succeeded", "progress": "100.0%", "conditions": [
                           {"type": "Ready", "status": "True", "reason": "", "message": ""}]}
                       if share >= 1.0 else {"phase": "ImportInProgress", "progress": f"{share * 100:.2f}%"})
        if changes.get("phase") != status.get("phase") or changes.get("progress") != status.get("progress"):
            custom.patch_namespaced_custom_object_status(*CDI, meta["namespace"], "datavolumes", meta["name"],
                                                         {"status": changes}, _request_timeout=10)

    def _import_error(self, url: str) -> str | None:
        if url in self.failing_urls:
            return "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found"
        if self.check_urls and url.startswith(("http://", "https://")):
            try:
                with urllib.request.urlopen(url, timeout=5):  # the status is enough; the body is not read
                    return None
            except urllib.error.HTTPError as exc:
                return f"Unable to connect to http data source: expected status code 200, got {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                return f"Unable to connect to http data source: {exc}"
        return None

    def _make_disk(self, dv: dict) -> str | None:
        """The imported disk of a DataVolume: a qcow2 overlay of the lab OS image of the size it asks for."""
        from kubernetes.utils import parse_quantity

        meta, spec = dv["metadata"], dv.get("spec") or {}
        requests = ((spec.get("storage") or spec.get("pvc") or {}).get("resources") or {}).get("requests") or {}
        try:
            size = int(parse_quantity(requests.get("storage") or "1Gi"))
        except ValueError as exc:
            return f"storage request: {exc}"
        size = max(size, self._base_image.stat().st_size)
        disk = self.var_dir / "disks" / f"{meta['namespace']}-{meta['name']}-{meta['uid'][:8]}.qcow2"
        proc = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(self._base_image),
                               str(disk), str(size)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return f"qemu-img create: {(proc.stderr or proc.stdout).strip()[-300:]}"
        self._disks[meta["uid"]] = disk
        return None

    def _reconcile_vm(self, custom, core, vm: dict, vmi: dict | None, dvs: dict) -> None:
        meta, spec = vm["metadata"], vm.get("spec") or {}
        namespace = meta["namespace"]
        strategy = spec.get("runStrategy") or ("Always" if spec.get("running") else "Halted")
        volumes = ((spec.get("template") or {}).get("spec") or {}).get("volumes") or []
        disks = [dvs.get((namespace, v["dataVolume"]["name"])) for v in volumes if v.get("dataVolume")]
        if strategy not in RUNNING_STRATEGIES:
            if vmi is not None:
                self._delete_vmi(custom, vmi)
            printable = "Stopped"
        elif any(d is None for d in disks):
            printable = "DataVolumeError" if disks else "Stopped"
        elif any((d.get("status") or {}).get("phase") == "Failed" for d in disks):
            printable = "DataVolumeError"
        elif any((d.get("status") or {}).get("phase") != "Succeeded" for d in disks):
            printable = "Provisioning"
        elif vmi is None:
            self._create_vmi(custom, vm)
            printable = "Starting"
        else:
            phase = (vmi.get("status") or {}).get("phase") or "Pending"
            if phase in VMI_PHASES[:-1]:
                following = VMI_PHASES[VMI_PHASES.index(phase) + 1]
                why = self._launch_guest(core, vmi, dvs) if following == "Running" and self.guests == "qemu" else None
                self._vmi_phase(custom, vmi, "Failed" if why else following, why)
                printable = "Starting"
            elif phase in FINISHED:
                restart = strategy == "Always" or phase == "Failed"
                since = self._finished.setdefault(vmi["metadata"]["uid"], time.monotonic())
                if restart and time.monotonic() - since >= RESTART_BACKOFF_S:
                    self._delete_vmi(custom, vmi)  # made again at the next pass
                    printable = "Starting"
                else:
                    printable = "CrashLoopBackOff" if phase == "Failed" else "Stopped"
            else:
                printable = "Running" if phase == "Running" else phase
                if phase == "Running" and self.guests == "simulated" and vmi["metadata"]["uid"] not in self._guests:
                    self._boot_guest(core, vmi)
        status = vm.get("status") or {}
        ready = printable == "Running"
        if status.get("printableStatus") != printable or status.get("ready", False) != ready:
            custom.patch_namespaced_custom_object_status(
                *KUBEVIRT, namespace, "virtualmachines", meta["name"],
                {"status": {"printableStatus": printable, "ready": ready, "created": vmi is not None}},
                _request_timeout=10)

    def _create_vmi(self, custom, vm: dict) -> None:
        meta, template = vm["metadata"], (vm.get("spec") or {}).get("template") or {}
        body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                             "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                                  "name": meta["name"], "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": template.get("spec") or {}, "status": {"phase": "Pending"}}
        custom.create_namespaced_custom_object(*KUBEVIRT, meta["namespace"], "virtualmachineinstances", body,
                                               _request_timeout=10)

    def _vmi_phase(self, custom, vmi: dict, phase: str, message: str | None = None) -> None:
        status: dict = {"phase": phase}
        if phase in ("Scheduled", "Running"):
            status["nodeName"] = HOST_NODE
        if phase == "Running":
            guest = self._guests.get(vmi["metadata"]["uid"]) or {}
            interface = {"name": "default", "ipAddress": "10.244.0.10"}
            if guest.get("vm") is not None:
                interface = {"name": "default", "ipAddress": SLIRP_GUEST_IP, "mac": guest["vm"].mac}
            status["interfaces"] = [interface]
            status["conditions"] = [{"type": "Ready", "status": "True"}]
        if phase in FINISHED:
            status["conditions"] = [{"type": "Ready", "status": "False", "reason": phase, "message": message or ""}]
        custom.patch_namespaced_custom_object_status(*KUBEVIRT, vmi["metadata"]["namespace"],
                                                     "virtualmachineinstances", vmi["metadata"]["name"],
                                                     {"status": status}, _request_timeout=10)

    def _delete_vmi(self, custom, vmi: dict) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            custom.delete_namespaced_custom_object(*KUBEVIRT, vmi["metadata"]["namespace"], "virtualmachineinstances",
                                                   vmi["metadata"]["name"], _request_timeout=10)
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._power_off_guest(vmi["metadata"]["uid"])
        self._finished.pop(vmi["metadata"]["uid"], None)

    # -- the guest

    def _boot_guest(self, core, vmi: dict) -> None:
        """cloud-init in the guest: the NoCloud user data's runcmd joins the tenant it names."""
        uid, spec = vmi["metadata"]["uid"], vmi.get("spec") or {}
        self._guests[uid] = {}  # booted: it joins once, whatever comes of it
        node = spec.get("hostname") or vmi["metadata"]["name"]
        record = {"vmi": f"{vmi['metadata']['namespace']}/{vmi['metadata']['name']}", "node": node,
                  "endpoint": None, "error": None}
        try:
            user_data = yaml.safe_load(self._user_data(core, vmi) or "") or {}
            commands = (user_data.get("runcmd") or []) if isinstance(user_data, dict) else []
            for command in commands:
                try:
                    endpoint, token = parse_join_command(command if isinstance(command, str) else " ".join(command))
                except ValueError:
                    continue
                # A tenant API given to the lab's QEMU guests as the host's address seen from a guest is this host's.
                endpoint = endpoint.replace(GUEST_HOST, "127.0.0.1", 1) if endpoint.startswith(GUEST_HOST) else endpoint
                record["endpoint"] = endpoint
                kubelet_join(endpoint, token, node, {"node.kubernetes.io/instance-type": "kubevirt"},
                             capacity=_capacity(spec), address="10.244.0.10", sample_pods=False)
                self._guests[uid] = {"endpoint": endpoint, "token": token, "node": node}
                log.info("kubevirt %s: VMI %s joined %s as node %s", self.name, record["vmi"], endpoint, node)
                break
            else:
                record["error"] = "no join command in the cloud-init user data's runcmd"
        except Exception as exc:
            record["error"] = str(exc)
            log.warning("kubevirt %s: VMI %s did not join: %s", self.name, record["vmi"], exc)
        self.joins.append(record)

    @staticmethod
    def _user_data(core, vmi: dict, part: str = "user") -> str | None:
        """The cloudInitNoCloud volume's user data (part "user") or network data ("network"): inline, base64 or
        from its Secret (keys userdata/userData, networkdata/networkData, as KubeVirt reads them)."""
        for volume in (vmi.get("spec") or {}).get("volumes") or []:
            nocloud = volume.get("cloudInitNoCloud")
            if not nocloud:
                continue
            if nocloud.get(f"{part}Data"):
                return nocloud[f"{part}Data"]
            if nocloud.get(f"{part}DataBase64"):
                return base64.b64decode(nocloud[f"{part}DataBase64"]).decode()
            if ref := (nocloud.get(f"{part}DataSecretRef" if part == "network" else "secretRef") or {}).get("name"):
                secret = core.read_namespaced_secret(ref, vmi["metadata"]["namespace"], _request_timeout=10)
                data = secret.data or {}
                value = data.get(f"{part}data") or data.get(f"{part}Data")
                return base64.b64decode(value).decode() if value else None
        return None

    def _launch_guest(self, core, vmi: dict, dvs: dict) -> str | None:
        """virt-launcher: the VMI's QEMU started on its root disk and its NoCloud seed. Returns why not, or None."""
        meta, spec = vmi["metadata"], vmi.get("spec") or {}
        uid, namespace = meta["uid"], meta["namespace"]
        if (self._guests.get(uid) or {}).get("vm") is not None:
            return None  # started at an earlier pass whose status patch did not land
        hostname = spec.get("hostname") or meta["name"]
        volumes = spec.get("volumes") or []
        root = next((v["dataVolume"]["name"] for v in volumes if v.get("dataVolume")), None)
        dv = dvs.get((namespace, root)) if root else None
        disk = self._disks.get(dv["metadata"]["uid"]) if dv else None
        if disk is None or not disk.exists():
            return f"no disk for DataVolume {namespace}/{root}" if root else "no dataVolume volume to boot from"
        try:
            user_data = self._user_data(core, vmi) or "#cloud-config\n{}\n"
            network = self._user_data(core, vmi, "network")
        except Exception as exc:
            return f"cloud-init NoCloud data unreadable: {exc}"
        endpoint, token = self._seed_join(user_data)
        domain = spec.get("domain") or {}
        mac = next((i["macAddress"] for i in (domain.get("devices") or {}).get("interfaces") or []
                    if i.get("macAddress")), None)
        mac = mac or "52:54:00:" + ":".join(f"{b:02x}" for b in hashlib.sha256(uid.encode()).digest()[:3])
        cores = int((domain.get("cpu") or {}).get("cores") or 1)
        name = f"{namespace}-{meta['name']}"
        vm = KubeVirtGuest(name, mac, self.var_dir / "guests" / f"{name}-{uid[:8]}", root_disk=disk,
                           cores=max(1, min(cores, self.guest_cores)), ram_mib=_guest_ram_mib(spec, self.guest_ram_mib))
        meta_data = yaml.safe_dump({"instance-id": f"{meta['name']}.{namespace}", "local-hostname": hostname},
                                   sort_keys=False)
        try:
            vm.prepare(user_data=user_data, meta_data=meta_data, network_config=network)
            vm.power_on(boot="Hdd")
        except (VMError, SeedError, OSError, ValueError) as exc:
            return f"virt-launcher: {exc}"
        if endpoint and endpoint.startswith(GUEST_HOST):  # the tenant API as this host reaches it
            endpoint = endpoint.replace(GUEST_HOST, "127.0.0.1", 1)
        self._guests[uid] = {"vm": vm, "disk": disk, "node": hostname, "endpoint": endpoint, "token": token,
                             "vmi": f"{namespace}/{meta['name']}", "record": None}
        log.info("kubevirt %s: VMI %s/%s: QEMU started (pid %s)", self.name, namespace, meta["name"], vm.proc.pid)
        return None

    @staticmethod
    def _seed_join(user_data: str) -> tuple[str | None, str | None]:
        """(endpoint, token) of the join in the user data's runcmd: what the lab needs to play the tenant's node
        lifecycle controller once the guest is gone. (None, None) without one."""
        try:
            parsed = yaml.safe_load(user_data)
        except yaml.YAMLError:
            return None, None
        commands = (parsed.get("runcmd") or []) if isinstance(parsed, dict) else []
        for command in commands:
            try:
                return parse_join_command(command if isinstance(command, str) else " ".join(command))
            except ValueError:
                continue
        return None, None

    def _follow_guest(self, custom, vmi: dict) -> None:
        """The VMI follows its QEMU: the guest's join said on its console is recorded; a QEMU that ended by itself
        ends the VMI (Succeeded: the guest powered off; Failed: QEMU died)."""
        guest = self._guests.get(vmi["metadata"]["uid"])
        if not guest or guest.get("vm") is None:
            return
        vm = guest["vm"]
        size = vm.console_log.stat().st_size if vm.console_log.exists() else 0
        if guest["record"] is None and size != guest.get("console_size") and \
                f"vmetal-os: node {guest['node']} joined" in vm.console_text():
            guest["record"] = {"vmi": guest["vmi"], "node": guest["node"], "endpoint": guest["endpoint"],
                               "error": None}
            self.joins.append(guest["record"])
        guest["console_size"] = size  # read again only once the console has more to say
        proc = vm.proc
        if proc is None or not vm.exited_by_itself():
            return
        phase = "Succeeded" if proc.returncode == 0 else "Failed"
        self._vmi_phase(custom, vmi, phase, f"QEMU exited {proc.returncode}")
        self._power_off_guest(vmi["metadata"]["uid"])

    def _power_off_guest(self, uid: str) -> None:
        guest = self._guests.pop(uid, None)
        if guest and guest.get("vm") is not None:
            guest["vm"].power_off()  # virt-launcher goes: so does its QEMU
            guest["vm"].seed_disk.unlink(missing_ok=True)
        if not guest or not guest.get("endpoint"):
            return
        try:  # the kubelet stops posting status: the tenant's node lifecycle controller marks it NotReady
            _set_ready(guest["endpoint"], guest["token"], guest["node"], "Unknown", "NodeStatusUnknown",
                       "Kubelet stopped posting node status.")
        except Exception as exc:
            log.info("kubevirt %s: node %s not marked NotReady: %s", self.name, guest["node"], exc)

    # -- for tests

    def vms(self, namespace: str | None = None) -> list[dict]:
        return self.objects("virtualmachines", namespace, *KUBEVIRT)

    def vmis(self, namespace: str | None = None) -> list[dict]:
        return self.objects("virtualmachineinstances", namespace, *KUBEVIRT)

    def data_volumes(self, namespace: str | None = None) -> list[dict]:
        return self.objects("datavolumes", namespace, *CDI)

    def guest(self, namespace: str, name: str) -> KubeVirtGuest | None:
        """The QEMU guest of a running VMI (guests="qemu"), or None."""
        return next((g["vm"] for g in list(self._guests.values()) if g.get("vm") is not None
                     and g["vmi"] == f"{namespace}/{name}"), None)

    def disks(self) -> list[Path]:
        """The DataVolumes' disks on this host (guests="qemu")."""
        return sorted(self._disks.values())
