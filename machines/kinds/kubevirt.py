"""The kubeVirt kind: per claim a KubeVirt VirtualMachine, its root disk as a CDI DataVolume imported from the claim's
OSImage, and a cloud-init NoCloud Secret carrying the join, in the cluster the provider's clusterRef names.

Everything goes through the official client's CustomObjectsApi (KubeVirt's own Python client is not usable) and
CoreV1Api, with a timeout on every call; errors become KindError with a message that names the object and never a
credential. Field names follow vCluster Platform's NodeProvider spec.kubeVirt (docs/providers-kubevirt.md).
"""
from __future__ import annotations

import base64
import copy
import re

import urllib3
from django.conf import settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pools.models import OS_IMAGE_PROPERTY, OSImage

from ..choices import DiskProof, MachineState
from ..clusters import cluster_client
from . import Join, KindError, Progress, register

KUBEVIRT = ("kubevirt.io", "v1")
CDI = ("cdi.kubevirt.io", "v1beta1")
IMAGE_URL = "kubevirt.vcluster.com/image-url"  # http(s)://… → a CDI http source, docker://… → a registry source
ROOT_DISK_SIZE = "kubevirt.vcluster.com/root-disk-size"  # a quantity: "20Gi"
STORAGE_CLASS = "kubevirt.vcluster.com/storage-class"  # optional: the DataVolume's storage class
CLAIM_LABEL = "vcluster.com/node-claim"
MANAGED_BY = {"app.kubernetes.io/managed-by": "vmetal-console"}
NAMESPACE_STRATEGIES = ("Provider", "VirtualCluster")
QUANTITY_RE = re.compile(r"^\d+(\.\d+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
ROOT_DISK, CLOUD_INIT_DISK = "rootdisk", "cloudinitdisk"
MERGE_PATCH = "application/merge-patch+json"


def deep_merge(base: dict, override: dict) -> dict:
    """override merged into a copy of base as a JSON merge patch (RFC 7386) merges: mappings merge key by key, a
    null removes the key, anything else (lists included) replaces."""
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def vm_template(provider, node_type) -> dict:
    """The VirtualMachine template for a NodeType: its own virtualMachineTemplate replaces the provider's, its
    mergeVirtualMachineTemplate is merged into the provider's."""
    base = (provider.config or {}).get("virtualMachineTemplate") or {}
    own = (node_type.provider_config or {}) if node_type is not None else {}
    if own.get("virtualMachineTemplate"):
        return copy.deepcopy(own["virtualMachineTemplate"])
    return deep_merge(base, own.get("mergeVirtualMachineTemplate") or {})


def _property(name: str, *sources: dict) -> str:
    return next((str(s[name]).strip() for s in sources if isinstance(s, dict) and s.get(name)), "")


def disk_source(claim, node_type) -> tuple[dict, str, str]:
    """(the DataVolume's source, its size, its storage class) from the claim's OSImage; KindError (no retry) when
    the image or a property it needs is missing or wrong."""
    name = (claim.properties or {}).get(OS_IMAGE_PROPERTY) or ""
    if not name:
        raise KindError(f"claim {claim.name}: the pool names no OS image ({OS_IMAGE_PROPERTY})", retry=False)
    image = OSImage.objects.filter(name=name).first()
    if image is None:
        raise KindError(f"claim {claim.name}: OS image {name} not found", retry=False)
    sources = (claim.properties, node_type.properties if node_type else {}, image.properties)
    url = _property(IMAGE_URL, image.properties) or (image.url if image.url.startswith(("http://", "https://"))
                                                    else "")
    if url.startswith(("http://", "https://")):
        source = {"http": {"url": url}}
    elif url.startswith("docker://"):
        source = {"registry": {"url": url}}
    else:
        raise KindError(f"OS image {name}: {IMAGE_URL} must be an http(s):// or docker:// URL, not {url!r}",
                        retry=False)
    size = _property(ROOT_DISK_SIZE, *sources)
    if not size:
        raise KindError(f"OS image {name}: no {ROOT_DISK_SIZE} (on the OS image or the node type), which the VM's "
                        "root disk needs, e.g. 20Gi", retry=False)
    if not QUANTITY_RE.match(size):
        raise KindError(f"OS image {name}: {ROOT_DISK_SIZE} {size!r} is not a size such as 20Gi", retry=False)
    return source, size, _property(STORAGE_CLASS, *sources)


class KubeVirtKind:
    """machines.kinds' protocol for provider kind kubeVirt."""

    # -- plumbing

    @staticmethod
    def _timeout() -> tuple[float, float]:
        return settings.TENANT_API_TIMEOUT_S, settings.TENANT_API_TIMEOUT_S

    def _call(self, provider, what: str, fn, *args, tolerate: tuple[int, ...] = (), **kwargs):
        """fn(*args) with a timeout; None for a tolerated status; KindError for any failure."""
        kwargs.setdefault("_request_timeout", self._timeout())
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            if exc.status in tolerate:
                return None
            retry = exc.status not in (400, 422)  # the cluster refused what we sent: sending it again won't help
            raise KindError(f"KubeVirt cluster of provider {provider.name}: {what}: answered {exc.status} "
                            f"{_reason(exc)}", retry=retry) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KindError(f"KubeVirt cluster of provider {provider.name} unreachable ({what}): "
                            f"{getattr(exc, 'reason', None) or exc}") from None

    def _get(self, provider, api, group_version, plural, namespace, name) -> dict | None:
        return self._call(provider, f"get {plural} {namespace}/{name}",
                          client.CustomObjectsApi(api).get_namespaced_custom_object, *group_version, namespace,
                          plural, name, tolerate=(404,))

    def _namespace(self, machine, api) -> str:
        """Provider (the default): clusterRef.namespace. VirtualCluster: the tenant's own namespace in the KubeVirt
        cluster (vCluster Platform's loft-<project>-v-<name>) when the cluster has it, else clusterRef.namespace."""
        provider, claim = machine.provider, machine.claim
        config = provider.config or {}
        strategy = config.get("namespaceStrategy") or "Provider"
        if strategy not in NAMESPACE_STRATEGIES:
            raise KindError(f"provider {provider.name}: namespaceStrategy {strategy!r} is not one of "
                            f"{', '.join(NAMESPACE_STRATEGIES)}", retry=False)
        fallback = (config.get("clusterRef") or {}).get("namespace") or ""
        if strategy == "VirtualCluster":
            tenant = claim.tenant
            own = f"loft-{tenant.namespace.removeprefix('p-')}-v-{tenant.name}"
            if self._call(provider, f"get Namespace {own}", client.CoreV1Api(api).read_namespace, own,
                          tolerate=(404,)) is not None:
                return own
        if not fallback:
            raise KindError(f"provider {provider.name}: no clusterRef.namespace to make its VirtualMachines in",
                            retry=False)
        return fallback

    # -- the protocol

    def capacity(self, node_type) -> int | None:
        limit = ((node_type.provider_config or {}).get("maxCapacity")
                 or (node_type.provider.config or {}).get("maxCapacity"))
        return int(limit) if limit else None  # 0 or unset: no limit, as vCluster reads an omitted maxCapacity

    def fill(self, machine, join: Join) -> None:
        provider, claim, node_type = machine.provider, machine.claim, machine.node_type
        source, size, storage_class = disk_source(claim, node_type)  # before anything is made
        with cluster_client(provider) as api:
            namespace = machine.namespace or self._namespace(machine, api)
            self._make(machine, api, join, namespace, source, size, storage_class)

    def _make(self, machine, api, join: Join, namespace: str, source: dict, size: str, storage_class: str) -> None:
        provider, claim, node_type = machine.provider, machine.claim, machine.node_type
        name = machine.name or claim.name
        labels = {CLAIM_LABEL: claim.name, **MANAGED_BY}
        secret_name, dv_name = f"{name}-cloud-init", f"{name}-root"
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                  "metadata": {"name": secret_name, "namespace": namespace, "labels": labels},
                  # KubeVirt reads the key userdata (or userData) of a cloudInitNoCloud secretRef
                  "data": {"userdata": base64.b64encode(join.user_data.encode()).decode()}}
        storage: dict = {"resources": {"requests": {"storage": size}}}
        if storage_class:
            storage["storageClassName"] = storage_class
        data_volume = {"apiVersion": "/".join(CDI), "kind": "DataVolume",
                       "metadata": {"name": dv_name, "namespace": namespace, "labels": labels},
                       "spec": {"source": source, "storage": storage}}
        vm = self._vm(vm_template(provider, node_type), name, namespace, labels, join.node_name, dv_name,
                      secret_name, node_type)
        machine.name, machine.namespace = name, namespace
        machine.memory = {**(machine.memory or {}), "node_name": join.node_name}
        machine.made = [{"apiVersion": "v1", "kind": "Secret", "namespace": namespace, "name": secret_name},
                        {"apiVersion": "/".join(CDI), "kind": "DataVolume", "namespace": namespace, "name": dv_name},
                        {"apiVersion": "/".join(KUBEVIRT), "kind": "VirtualMachine", "namespace": namespace,
                         "name": name}]
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        # 409: made by an earlier try. The seed gets this try's join (its token may be new); the rest stays.
        if self._call(provider, f"create Secret {namespace}/{secret_name}", core.create_namespaced_secret,
                      namespace, secret, tolerate=(409,)) is None:
            self._call(provider, f"update Secret {namespace}/{secret_name}", core.patch_namespaced_secret,
                       secret_name, namespace, {"data": secret["data"]}, _content_type=MERGE_PATCH)
        self._call(provider, f"create DataVolume {namespace}/{dv_name}", custom.create_namespaced_custom_object,
                   *CDI, namespace, "datavolumes", data_volume, tolerate=(409,))
        self._call(provider, f"create VirtualMachine {namespace}/{name}", custom.create_namespaced_custom_object,
                   *KUBEVIRT, namespace, "virtualmachines", vm, tolerate=(409,))

    @staticmethod
    def _vm(template: dict, name: str, namespace: str, labels: dict, hostname: str, dv_name: str,
            secret_name: str, node_type) -> dict:
        vm = copy.deepcopy(template)
        vm["apiVersion"], vm["kind"] = "/".join(KUBEVIRT), "VirtualMachine"
        meta = vm.setdefault("metadata", {})
        for key in ("uid", "resourceVersion", "creationTimestamp", "generateName"):
            meta.pop(key, None)
        meta.update(name=name, namespace=namespace, labels={**(meta.get("labels") or {}), **labels})
        spec = vm.setdefault("spec", {})
        spec.pop("running", None)  # deprecated; runStrategy is the one that says whether it runs
        spec["runStrategy"] = "Always"
        template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **labels}
        vmi = spec["template"].setdefault("spec", {})
        vmi["hostname"] = hostname  # the node name the join uses is the guest's hostname
        domain = vmi.setdefault("domain", {})
        resources = (node_type.resources or {}) if node_type is not None else {}
        if resources.get("cpu") and not (domain.get("cpu") or {}).get("cores"):
            domain.setdefault("cpu", {})["cores"] = int(float(resources["cpu"]))
        if (resources.get("memory") and not (domain.get("memory") or {}).get("guest")
                and not ((domain.get("resources") or {}).get("requests") or {}).get("memory")):
            domain.setdefault("memory", {})["guest"] = str(resources["memory"])
        disks = domain.setdefault("devices", {}).setdefault("disks", [])
        volumes = [v for v in vmi.get("volumes") or [] if v.get("name") not in (ROOT_DISK, CLOUD_INIT_DISK)]
        vmi["volumes"] = [{"name": ROOT_DISK, "dataVolume": {"name": dv_name}},
                          {"name": CLOUD_INIT_DISK, "cloudInitNoCloud": {"secretRef": {"name": secret_name}}},
                          *volumes]
        named = {d.get("name") for d in disks}
        if ROOT_DISK not in named:
            disks.insert(0, {"name": ROOT_DISK, "disk": {"bus": "virtio"}, "bootOrder": 1})
        if CLOUD_INIT_DISK not in named:
            disks.append({"name": CLOUD_INIT_DISK, "disk": {"bus": "virtio"}})
        return vm

    def progress(self, machine) -> Progress:
        provider, namespace, name = machine.provider, machine.namespace, machine.name
        node_name = (machine.memory or {}).get("node_name", "")
        if not name:
            return Progress(MachineState.CREATING, "not made yet")
        dv_name = next((m["name"] for m in machine.made or [] if m.get("kind") == "DataVolume"), f"{name}-root")
        with cluster_client(provider) as api:
            vm = self._get(provider, api, KUBEVIRT, "virtualmachines", namespace, name)
            if vm is None:
                return Progress(MachineState.FAILED, f"VirtualMachine {namespace}/{name} is gone: it was deleted "
                                                     "outside the console")
            dv = self._get(provider, api, CDI, "datavolumes", namespace, dv_name) or {}
            vmi = self._get(provider, api, KUBEVIRT, "virtualmachineinstances", namespace, name)
        printable = (vm.get("status") or {}).get("printableStatus", "")
        dv_status = dv.get("status") or {}
        details = {"printableStatus": printable, "dataVolume": dv_status.get("phase", ""),
                   "importProgress": dv_status.get("progress", ""),
                   "vmi": (vmi or {}).get("status", {}).get("phase", "")}
        if not dv:
            return Progress(MachineState.FAILED, f"DataVolume {namespace}/{dv_name} is gone: it was deleted outside "
                                                 "the console", details=details)
        if dv_status.get("phase") == "Failed":
            why = next((c.get("message") for c in dv_status.get("conditions") or [] if c.get("message")), "")
            return Progress(MachineState.FAILED, f"the root disk's import failed (DataVolume {namespace}/{dv_name})"
                                                 + (f": {why}" if why else ""), details=details)
        if (vm.get("spec") or {}).get("runStrategy") == "Halted":
            if vmi is None:
                return Progress(MachineState.STOPPED, "stopped (runStrategy Halted)", node_name, details)
            return Progress(MachineState.STOPPED, "stopping", node_name, details)
        if dv_status.get("phase") != "Succeeded":
            progress = dv_status.get("progress", "")
            return Progress(MachineState.CREATING, f"importing the root disk ({dv_status.get('phase') or 'Pending'}"
                                                   + (f", {progress}" if progress not in ("", "N/A") else "") + ")",
                            details=details)
        phase = details["vmi"]
        if phase == "Running":
            return Progress(MachineState.RUNNING, "running", node_name, details)
        if phase == "Failed":
            return Progress(MachineState.CREATING, "the VirtualMachineInstance failed; KubeVirt starts it again "
                                                   "(runStrategy Always)", details=details)
        return Progress(MachineState.CREATING, f"VirtualMachineInstance {phase or 'not created yet'}"
                        + (f" ({printable})" if printable else ""), details=details)

    def power(self, machine, action: str) -> None:
        """on/off: the VM's runStrategy (Always / Halted), as virtctl start/stop set it; reboot: the VMI is
        deleted and KubeVirt starts a new one for a VM whose runStrategy is Always (a cold restart)."""
        provider, namespace, name = machine.provider, machine.namespace, machine.name
        if action not in ("on", "off", "reboot"):
            raise KindError(f"power action must be on, off or reboot, not {action!r}", retry=False)
        with cluster_client(provider) as api:
            custom = client.CustomObjectsApi(api)
            if action == "reboot":
                self._call(provider, f"restart VirtualMachineInstance {namespace}/{name}",
                           custom.delete_namespaced_custom_object, *KUBEVIRT, namespace, "virtualmachineinstances",
                           name, tolerate=(404,))
                return
            strategy = "Always" if action == "on" else "Halted"
            self._call(provider, f"set runStrategy {strategy} on VirtualMachine {namespace}/{name}",
                       custom.patch_namespaced_custom_object, *KUBEVIRT, namespace, "virtualmachines", name,
                       {"spec": {"runStrategy": strategy}}, _content_type=MERGE_PATCH)

    def release(self, machine) -> bool:
        provider = machine.provider
        with cluster_client(provider) as api:
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            gone = 0
            for made in reversed(machine.made or []):  # the VM first: it holds the disk and the seed
                namespace, name, kind = made["namespace"], made["name"], made["kind"]
                what = f"{kind} {namespace}/{name}"
                if kind == "Secret":
                    self._call(provider, f"delete {what}", core.delete_namespaced_secret, name, namespace,
                               tolerate=(404,))
                    left = self._call(provider, f"get {what}", core.read_namespaced_secret, name, namespace,
                                      tolerate=(404,))
                else:
                    group_version = tuple(made["apiVersion"].split("/"))
                    plural = kind.lower() + "s"
                    self._call(provider, f"delete {what}", custom.delete_namespaced_custom_object, *group_version,
                               namespace, plural, name, tolerate=(404,))
                    left = self._get(provider, api, group_version, plural, namespace, name)
                    if kind == "VirtualMachine" and left is None:  # gone once its running instance is gone too
                        left = self._get(provider, api, KUBEVIRT, "virtualmachineinstances", namespace, name)
                gone += left is None
        return gone == len(machine.made or [])

    def disk_proof(self, machine) -> str:
        return DiskProof.DESTROYED  # the root disk is the DataVolume's PVC, deleted with it


def _reason(exc: ApiException) -> str:
    import json

    try:
        return json.loads(exc.body).get("message") or str(exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


register("kubeVirt", KubeVirtKind())
