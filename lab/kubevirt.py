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
"""
from __future__ import annotations

import base64
import logging
import threading
import time
import urllib.error
import urllib.request

import kmock
import yaml

from .redfish import GUEST_HOST
from .kube import (RESOURCES, TenantAPIServer, TenantEmulator, _api_client, _close, _set_ready, kubelet_join,
                   parse_join_command)

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


def _capacity(vmi_spec: dict) -> dict:
    """The node's capacity as the guest's kubelet reports it: the domain's cores and memory."""
    domain = vmi_spec.get("domain") or {}
    capacity = {"cpu": str((domain.get("cpu") or {}).get("cores") or 1)}
    memory = ((domain.get("memory") or {}).get("guest")
              or ((domain.get("resources") or {}).get("requests") or {}).get("memory"))
    if memory:
        capacity["memory"] = str(memory)
    return capacity


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
    """

    emulator_class = KubeVirtEmulator

    def __init__(self, name: str = "kubevirt", *, import_s: float = 0.3, tick_s: float = 0.05,
                 check_urls: bool = False, **kwargs) -> None:
        super().__init__(name, **kwargs)
        self.import_s = import_s  # how long an import takes
        self.tick_s = tick_s
        self.check_urls = check_urls  # ask each http(s) image URL before importing it (the lab site's images)
        self.failing_urls: set[str] = set()
        self.joins: list[dict] = []  # every guest join: {"vmi", "node", "endpoint", "error"}
        self._imports: dict[str, float] = {}  # DataVolume uid -> when its import began
        self._guests: dict[str, dict] = {}  # running VMI uid -> {"endpoint", "token", "node"} once it joined
        self._controller: threading.Thread | None = None
        self._halt = threading.Event()

    def fail_import(self, url: str) -> None:
        """DataVolumes importing this URL end Failed, as CDI's importer does on a 404."""
        self.failing_urls.add(url)

    def start(self, timeout: float = 10, **kwargs) -> KubeVirtCluster:
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
        super().stop(timeout)

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
        for key, vm in vms.items():
            self._reconcile_vm(custom, core, vm, vmis.get(key), dvs)

    def _import(self, custom, dv: dict) -> None:
        meta, status = dv["metadata"], dv.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        source = (dv.get("spec") or {}).get("source") or {}
        url = (source.get("http") or source.get("registry") or {}).get("url", "")
        began = self._imports.setdefault(meta["uid"], time.monotonic())
        why = self._import_error(url) if not status.get("phase") else None
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
                self._vmi_phase(custom, vmi, VMI_PHASES[VMI_PHASES.index(phase) + 1])
                printable = "Starting"
            else:
                printable = "Running" if phase == "Running" else phase
                if phase == "Running" and vmi["metadata"]["uid"] not in self._guests:
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

    def _vmi_phase(self, custom, vmi: dict, phase: str) -> None:
        status: dict = {"phase": phase}
        if phase in ("Scheduled", "Running"):
            status["nodeName"] = HOST_NODE
        if phase == "Running":
            status["interfaces"] = [{"name": "default", "ipAddress": "10.244.0.10"}]
            status["conditions"] = [{"type": "Ready", "status": "True"}]
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
    def _user_data(core, vmi: dict) -> str | None:
        for volume in (vmi.get("spec") or {}).get("volumes") or []:
            nocloud = volume.get("cloudInitNoCloud")
            if not nocloud:
                continue
            if nocloud.get("userData"):
                return nocloud["userData"]
            if nocloud.get("userDataBase64"):
                return base64.b64decode(nocloud["userDataBase64"]).decode()
            if ref := (nocloud.get("secretRef") or {}).get("name"):
                secret = core.read_namespaced_secret(ref, vmi["metadata"]["namespace"], _request_timeout=10)
                data = secret.data or {}
                value = data.get("userdata") or data.get("userData")  # KubeVirt reads either key
                return base64.b64decode(value).decode() if value else None
        return None

    def _power_off_guest(self, uid: str) -> None:
        guest = self._guests.pop(uid, None)
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
