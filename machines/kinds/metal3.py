"""Kind metal3 with a clusterRef: BareMetalHosts of an existing Metal3 management cluster, claimed as CAPM3 does.

The console never talks to their BMCs: it writes a host's spec (consumerRef, image, userData, online,
automatedCleaningMode, the reboot.metal3.io annotation) and reads its status; the cluster's baremetal-operator
does the rest. Fields and states followed: docs/providers-metal3-cluster.md.
"""
from __future__ import annotations

import base64

from django.conf import settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from claims.drift import image_written
from claims.selectors import claim_image
from pools.models import SERVER_NAME_PROPERTY

from ..choices import DiskProof, MachineState
from . import Join, KindError, Progress

GROUP, VERSION, PLURAL = "metal3.io", "v1alpha1", "baremetalhosts"
API_VERSION = f"{GROUP}/{VERSION}"
MERGE_PATCH = "application/merge-patch+json"
CLAIM_ANNOTATION = "vmetal.dev/claim"  # namespace/name of the NodeClaim holding the host
REBOOT_ANNOTATION = "reboot.metal3.io"  # BMO power-cycles the host and removes it
USER_DATA_KEY = "userData"  # the key BMO reads in the spec.userData Secret
CONSUMER = {"apiVersion": "management.loft.sh/v1", "kind": "NodeClaim"}
CLEANING_MODES = ("metadata", "disabled")
IMAGE_FORMATS = ("raw", "qcow2", "vdi", "vmdk", "live-iso")  # spec.image.format as BMO takes it
FREE_STATES = ("available", "ready")  # older BMO releases said "ready" for available
CLAIM_TRIES = 2  # a 409 on a host still free: read it again and try once more, then the next host


def selector_string(selector: dict) -> str:
    """A Kubernetes LabelSelector as the labelSelector query the API server takes."""
    terms = [f"{key}={value}" for key, value in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(str(v) for v in expr.get("values") or [])
        terms.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key,
                      "DoesNotExist": f"!{key}"}[op])
    return ",".join(terms)


def cleaning_mode(node_type) -> str:
    mode = ((node_type.provider_config if node_type else None) or {}).get("automatedCleaningMode") or "metadata"
    if mode not in CLEANING_MODES:
        raise KindError(f"node type {node_type.name}: automatedCleaningMode must be metadata or disabled, not "
                        f"{mode!r}", retry=False)
    return mode


def _state(host: dict) -> str:
    return ((host.get("status") or {}).get("provisioning") or {}).get("state") or ""


def _consumer(machine) -> dict:
    return {**CONSUMER, "name": machine.claim.name, "namespace": machine.claim.namespace}


def _claim_ref(machine) -> str:
    return f"{machine.claim.namespace}/{machine.claim.name}"


def _ours(host: dict, machine) -> bool:
    ref = (host.get("spec") or {}).get("consumerRef") or {}
    return ref.get("kind") == CONSUMER["kind"] and ref.get("name") == machine.claim.name and \
        ref.get("namespace", machine.claim.namespace) == machine.claim.namespace


def _free(host: dict) -> bool:
    spec = host.get("spec") or {}
    status = host.get("status") or {}
    return (_state(host) in FREE_STATES and not spec.get("consumerRef") and not (spec.get("image") or {}).get("url")
            and not status.get("errorType") and status.get("operationalStatus", "OK") == "OK"
            and not (host.get("metadata") or {}).get("deletionTimestamp"))


class Cluster:
    """The calls made on one Metal3 cluster, each with a timeout; ApiException and unreachable become KindError."""

    def __init__(self, provider, api: client.ApiClient):
        self.provider = provider
        self.objects = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.timeout = settings.TENANT_API_TIMEOUT_S

    def _call(self, what: str, fn, *args, tolerate: tuple[int, ...] = (), **kwargs):
        try:
            return fn(*args, _request_timeout=self.timeout, **kwargs)
        except ApiException as exc:
            if exc.status in tolerate:
                return None
            raise KindError(f"Metal3 cluster of provider {self.provider.name}: {what}: {exc.status} "
                            f"{exc.reason}") from None
        except HTTPError as exc:
            raise KindError(f"Metal3 cluster of provider {self.provider.name} unreachable ({what}): "
                            f"{type(exc).__name__}") from None

    def hosts(self, namespace: str | None, selector: dict) -> list[dict]:
        query = selector_string(selector or {})
        if namespace:
            answer = self._call("list BareMetalHosts", self.objects.list_namespaced_custom_object, GROUP, VERSION,
                                namespace, PLURAL, label_selector=query)
        else:
            answer = self._call("list BareMetalHosts", self.objects.list_cluster_custom_object, GROUP, VERSION,
                                PLURAL, label_selector=query)
        return sorted(answer.get("items") or [], key=lambda h: (h["metadata"].get("namespace", ""),
                                                                h["metadata"]["name"]))

    def host(self, namespace: str, name: str) -> dict | None:
        return self._call(f"get BareMetalHost {namespace}/{name}", self.objects.get_namespaced_custom_object, GROUP,
                          VERSION, namespace, PLURAL, name, tolerate=(404,))

    def patch(self, namespace: str, name: str, body: dict, tolerate: tuple[int, ...] = ()) -> dict | None:
        return self._call(f"patch BareMetalHost {namespace}/{name}", self.objects.patch_namespaced_custom_object,
                          GROUP, VERSION, namespace, PLURAL, name, body, _content_type=MERGE_PATCH,
                          tolerate=tolerate)

    def put_secret(self, namespace: str, name: str, data: dict, annotations: dict) -> None:
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        if self._call(f"create Secret {namespace}/{name}", self.core.create_namespaced_secret, namespace, body,
                      tolerate=(409,)) is None:  # there from an earlier try: its data replaced
            self._call(f"patch Secret {namespace}/{name}", self.core.patch_namespaced_secret, name, namespace,
                       {"data": body["data"]}, _content_type=MERGE_PATCH)

    def delete_secret(self, namespace: str, name: str) -> None:
        self._call(f"delete Secret {namespace}/{name}", self.core.delete_namespaced_secret, name, namespace,
                   tolerate=(404,))


def claim_host(cluster: Cluster, candidates: list[dict], annotations: dict, consumer: dict) -> dict | None:
    """The first candidate this call takes, or None. Each patch carries the resourceVersion the host was read at, so
    of two consoles (or workers) patching the same host one gets 409: it reads the host again, and goes on to the
    next when another took it."""
    for host in candidates:
        meta = host["metadata"]
        for _ in range(CLAIM_TRIES):
            if not _free(host):
                break
            body = {"metadata": {"resourceVersion": meta["resourceVersion"], "annotations": annotations},
                    "spec": {"consumerRef": consumer}}
            taken = cluster.patch(meta["namespace"], meta["name"], body, tolerate=(404, 409))
            if taken is not None:
                return taken
            host = cluster.host(meta["namespace"], meta["name"])
            if host is None:
                break
            meta = host["metadata"]
    return None


class Metal3Cluster:
    """The Kind (machines.kinds) of an external metal3 provider. `connect` is machines.clusters.cluster_client,
    handed in by machines.apps: that module raises this package's KindError, so importing it here would close a
    circle between machines.kinds and machines.clusters."""

    def __init__(self, connect):
        self.connect = connect

    @staticmethod
    def _namespace(provider) -> str | None:
        return ((provider.config or {}).get("clusterRef") or {}).get("namespace") or None

    def capacity(self, node_type) -> int | None:
        provider = node_type.provider
        with self.connect(provider) as api:
            return len(Cluster(provider, api).hosts(self._namespace(provider), node_type.host_selector))

    def fill(self, machine, join: Join) -> None:
        provider, claim = machine.provider, machine.claim
        image, problem = claim_image(claim)
        if problem:
            raise KindError(f"OS image: {problem[1]}", retry=False)
        mode = cleaning_mode(machine.node_type)
        spec = {"online": True, "image": {"url": image.url, "checksum": image.checksum}}
        if image.checksum_type:
            spec["image"]["checksumType"] = image.checksum_type
        if image.format in IMAGE_FORMATS:
            spec["image"]["format"] = image.format
        with self.connect(provider) as api:
            cluster = Cluster(provider, api)
            host = cluster.host(machine.namespace, machine.name) if machine.name else None
            if host is None or not _ours(host, machine):
                host = self._claim(cluster, machine, mode)
            namespace, name = host["metadata"]["namespace"], host["metadata"]["name"]
            secret = machine.memory["secret"]
            cluster.put_secret(namespace, secret, {USER_DATA_KEY: join.user_data},
                               {CLAIM_ANNOTATION: _claim_ref(machine)})
            spec["userData"] = {"name": secret, "namespace": namespace}
            cluster.patch(namespace, name, {"spec": spec})
        image_written(claim=claim, image=image)
        machine.memory["node_name"] = join.node_name

    def _claim(self, cluster: Cluster, machine, mode: str) -> dict:
        provider, claim, node_type = machine.provider, machine.claim, machine.node_type
        selector = node_type.host_selector if node_type else {}
        candidates = cluster.hosts(self._namespace(provider), selector)
        pinned = (claim.properties or {}).get(SERVER_NAME_PROPERTY)
        if pinned:
            candidates = [h for h in candidates if h["metadata"]["name"] == pinned]
        host = claim_host(cluster, candidates, {CLAIM_ANNOTATION: _claim_ref(machine)}, _consumer(machine))
        if host is None:
            what = f"BareMetalHost {pinned}" if pinned else "BareMetalHost"
            raise KindError(f"no free {what} matches node type {node_type.name if node_type else '?'} "
                            f"({selector_string(selector) or 'any labels'}) in the Metal3 cluster of provider "
                            f"{provider.name}")
        namespace, name = host["metadata"]["namespace"], host["metadata"]["name"]
        before = {k: v for k, v in ((host["metadata"].get("annotations") or {}).items()) if k != CLAIM_ANNOTATION}
        machine.name, machine.namespace = name, namespace
        machine.memory = {**(machine.memory or {}), "annotations": before, "secret": f"{claim.name}-user-data",
                          "cleaning": mode}
        machine.made = [{"apiVersion": API_VERSION, "kind": "BareMetalHost", "namespace": namespace, "name": name,
                         "claimed": True},  # given back on release, not deleted
                        {"apiVersion": "v1", "kind": "Secret", "namespace": namespace,
                         "name": machine.memory["secret"]}]
        if machine.pk:  # the host is ours now: never lose the record of it, whatever fails next
            machine.save(update_fields=["name", "namespace", "memory", "made"])
        return host

    def progress(self, machine) -> Progress:
        node_name = (machine.memory or {}).get("node_name", "")
        if not machine.name:
            return Progress(MachineState.CREATING, "no BareMetalHost claimed yet", node_name)
        with self.connect(machine.provider) as api:
            host = Cluster(machine.provider, api).host(machine.namespace, machine.name)
        where = f"BareMetalHost {machine.namespace}/{machine.name}"
        if host is None:
            return Progress(MachineState.FAILED, f"{where} is gone", node_name)
        if not _ours(host, machine):
            return Progress(MachineState.FAILED, f"{where} is no longer held by claim {_claim_ref(machine)}",
                            node_name)
        status, spec = host.get("status") or {}, host.get("spec") or {}
        state = _state(host)
        details = {"state": state, "operationalStatus": status.get("operationalStatus", ""),
                   "poweredOn": bool(status.get("poweredOn")), "errorCount": status.get("errorCount", 0)}
        if status.get("errorType") or status.get("operationalStatus") == "error":
            message = f"{where}: {status.get('errorType') or 'error'}: {status.get('errorMessage') or 'no message'}"
            return Progress(MachineState.FAILED, message, node_name, details)
        if state == "provisioned":
            if spec.get("online") is False and not status.get("poweredOn"):
                return Progress(MachineState.STOPPED, f"{where}: provisioned, powered off", node_name, details)
            return Progress(MachineState.RUNNING, f"{where}: provisioned", node_name, details)
        return Progress(MachineState.CREATING, f"{where}: {state or 'not yet registered'}", node_name, details)

    def power(self, machine, action: str) -> None:
        if action == "on":
            body = {"spec": {"online": True}}
        elif action == "off":
            body = {"spec": {"online": False}}
        elif action == "reboot":  # BMO power-cycles the host, then removes the annotation
            body = {"metadata": {"annotations": {REBOOT_ANNOTATION: ""}}}
        else:
            raise KindError(f"unknown power action {action!r}", retry=False)
        if not machine.name:
            raise KindError("no BareMetalHost claimed yet")
        with self.connect(machine.provider) as api:
            if Cluster(machine.provider, api).patch(machine.namespace, machine.name, body, tolerate=(404,)) is None:
                raise KindError(f"BareMetalHost {machine.namespace}/{machine.name} is gone", retry=False)

    def release(self, machine) -> bool:
        memory = machine.memory or {}
        with self.connect(machine.provider) as api:
            cluster = Cluster(machine.provider, api)
            if not machine.name:
                return True
            host = cluster.host(machine.namespace, machine.name)
            if memory.get("secret"):
                cluster.delete_secret(machine.namespace, memory["secret"])
            if host is None or not _ours(host, machine):
                return True  # gone, or given back already
            before = memory.get("annotations") or {}
            now = host["metadata"].get("annotations") or {}
            restore = {k: before.get(k) for k in now if k != CLAIM_ANNOTATION and now[k] != before.get(k)}
            restore.update({k: v for k, v in before.items() if now.get(k) != v})
            spec = host.get("spec") or {}
            mode = memory.get("cleaning") or cleaning_mode(machine.node_type)
            if spec.get("image") or spec.get("userData") or spec.get("online") or restore or \
                    spec.get("automatedCleaningMode") != mode:
                # Clearing the image is what makes BMO deprovision (and clean, per automatedCleaningMode).
                cluster.patch(machine.namespace, machine.name, {
                    "metadata": {"annotations": restore},
                    "spec": {"image": None, "userData": None, "online": False, "automatedCleaningMode": mode}})
                return False
            status = host.get("status") or {}
            if status.get("errorType") and _state(host) == "deprovisioning":
                raise KindError(f"BareMetalHost {machine.namespace}/{machine.name}: {status['errorType']}: "
                                f"{status.get('errorMessage') or 'no message'}")
            if _state(host) not in FREE_STATES or ((status.get("provisioning") or {}).get("image") or {}).get("url"):
                return False  # still deprovisioning
            cluster.patch(machine.namespace, machine.name, {"metadata": {"annotations": {CLAIM_ANNOTATION: None}},
                                                            "spec": {"consumerRef": None}})
            return True

    def disk_proof(self, machine) -> str:
        mode = (machine.memory or {}).get("cleaning") or cleaning_mode(machine.node_type)
        return DiskProof.NONE if mode == "disabled" else DiskProof.METAL3_CLEANING

