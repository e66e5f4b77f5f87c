"""The lab's Metal3 management cluster: BareMetalHosts (metal3.io/v1alpha1) on the lab's Kubernetes API emulator,
and a controller that walks them through their states as the baremetal-operator does.

What the controller does, one host at a time, every `tick` seconds (it reads and writes through the cluster's
HTTP API with the admin token, as BMO does through its own):

- a new host: registering, then inspecting (held there while its inspection is made slow), preparing, available;
- spec.image set on an available host: provisioning (or a provisioning error when the host is made to fail one:
  state stays provisioning, errorType `provisioning error`, operationalStatus error), then provisioned; powered
  on, it "boots": reads the spec.userData Secret, finds the join command in its runcmd and joins that tenant's
  API as a node named after the user data's hostname (lab.kube.kubelet_join);
- spec.online false: powered off, the node NotReady; true again: it boots again;
- the reboot.metal3.io annotation: power-cycled, the node rejoins, the annotation removed;
- spec.image cleared: deprovisioning (automatedCleaningMode metadata takes `clean_s`, disabled skips cleaning),
  the node stopped, then available again with status.provisioning.image cleared.

It is no BMC emulator: power and disks are states in the status, nothing more.
"""
from __future__ import annotations

import base64
import binascii
import logging
import threading
import time
import uuid

import kmock
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from .kube import KubeletJoinError, TenantAPIServer, kubelet_join, parse_join_command

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "metal3.io", "v1alpha1", "baremetalhosts"
BMH = kmock.resource(GROUP, VERSION, PLURAL)
BMH_INFO = kmock.ResourceInfo(kind="BareMetalHost", singular="baremetalhost", namespaced=True,
                              shortnames={"bmh", "bmhost"}, verbs={"create", "delete", "get", "list", "patch", "watch"},
                              subresources={"status"})
REBOOT_ANNOTATION = "reboot.metal3.io"
MERGE_PATCH = "application/merge-patch+json"


class Metal3LabCluster:
    """A Metal3 management cluster on 127.0.0.1 with its controller.

    with Metal3LabCluster(tenants=[tenant_api]) as cluster:
        cluster.add_host("gpu-01", {"role": "gpu"})
        cluster.kubeconfig()                      # for the console's ProviderSecret
    """

    def __init__(self, name: str = "metal3", *, namespace: str = "metal3", tenants=(), tick: float = 0.02,
                 step_s: float = 0.05, clean_s: float = 0.2) -> None:
        self.server = TenantAPIServer(name)
        self.namespace = namespace
        self.tenants: list[TenantAPIServer] = list(tenants)  # whose API a booting host may join
        self.tick = tick
        self.step_s = step_s  # how long each step of registering, inspecting, provisioning takes
        self.clean_s = clean_s  # metadata cleaning during deprovisioning
        self.slow_inspection: set[str] = set()  # hosts held in inspecting until taken out of this set
        self.fail_provisioning: dict[str, str] = {}  # host -> the error message its next provisioning fails with
        # host -> (tenant, node) its OS joined as, until it is deprovisioned; a reboot comes back as the same node
        self.nodes: dict[str, tuple[TenantAPIServer, str]] = {}
        self.boots: dict[str, int] = {}  # host -> how many times its OS booted (reboots counted)
        self._since: dict[str, tuple[str, float]] = {}  # host -> (state, when it entered it)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._api: client.ApiClient | None = None

    def __enter__(self) -> Metal3LabCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> Metal3LabCluster:
        self.server.start()
        self.server.call(lambda emu: emu.resources.__setitem__(BMH, BMH_INFO))
        config = client.Configuration()
        config.host = self.server.url
        config.api_key = {"BearerToken": f"Bearer {self.server.token}"}
        self._api = client.ApiClient(config)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"metal3-{self.server.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        if self._api is not None:
            self._api.close()
            self._api = None
        self.server.stop()

    def kubeconfig(self) -> str:
        return self.server.kubeconfig()

    @property
    def _objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self._api)

    # -- for tests and the lab site

    def add_host(self, name: str, labels: dict | None = None, *, annotations: dict | None = None,
                 namespace: str | None = None, slow_inspection: bool = False) -> dict:
        """A BareMetalHost as an operator writes one: its BMC, boot MAC, offline; the controller registers it."""
        if slow_inspection:
            self.slow_inspection.add(name)
        index = sum(map(ord, name)) % 250
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BareMetalHost",
                "metadata": {"name": name, "labels": dict(labels or {}), "annotations": dict(annotations or {})},
                "spec": {"online": False, "bootMACAddress": f"52:54:00:00:00:{index:02x}",
                         "bmc": {"address": f"redfish+http://10.1.0.{index}/redfish/v1/Systems/{name}",
                                 "credentialsName": f"{name}-bmc-secret"},
                         "automatedCleaningMode": "metadata"}}
        return self._objects.create_namespaced_custom_object(GROUP, VERSION, namespace or self.namespace, PLURAL, body)

    def host(self, name: str, namespace: str | None = None) -> dict:
        return self._objects.get_namespaced_custom_object(GROUP, VERSION, namespace or self.namespace, PLURAL, name)

    def wait_state(self, name: str, state: str, timeout: float = 10, namespace: str | None = None) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            host = self.host(name, namespace)
            if _state(host) == state:
                return host
            if time.monotonic() > deadline:
                raise TimeoutError(f"BareMetalHost {name} is {_state(host)!r}, not {state!r}, after {timeout}s")
            time.sleep(self.tick)

    # -- the controller

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            try:
                hosts = self._objects.list_cluster_custom_object(GROUP, VERSION, PLURAL, _request_timeout=5)
            except (ApiException, HTTPError) as exc:
                log.warning("metal3 lab: cannot list BareMetalHosts: %s", type(exc).__name__)
                continue
            for host in hosts.get("items") or []:
                try:
                    self._reconcile(host)
                except (ApiException, HTTPError) as exc:  # the next tick tries again
                    log.warning("metal3 lab: %s: %s", host["metadata"]["name"], type(exc).__name__)

    def _status(self, host: dict, status: dict) -> None:
        meta = host["metadata"]
        self._objects.patch_namespaced_custom_object_status(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"],
                                                            {"status": status}, _content_type=MERGE_PATCH,
                                                            _request_timeout=5)

    def _enter(self, host: dict, state: str, **status) -> None:
        self._since[host["metadata"]["name"]] = (state, time.monotonic())
        self._status(host, {"provisioning": {"state": state}, **status})

    def _waited(self, host: dict, seconds: float) -> bool:
        state, since = self._since.get(host["metadata"]["name"], (None, 0.0))
        if state != _state(host):  # found in this state (a restart): the wait starts now
            self._since[host["metadata"]["name"]] = (_state(host), time.monotonic())
            return seconds <= 0
        return time.monotonic() - since >= seconds

    def _reconcile(self, host: dict) -> None:
        name = host["metadata"]["name"]
        spec, status = host.get("spec") or {}, host.get("status") or {}
        state = _state(host)
        image = (spec.get("image") or {}).get("url")
        if not state:
            self._enter(host, "registering", ID=str(uuid.uuid4()), operationalStatus="OK", errorType="",
                        errorMessage="", errorCount=0, poweredOn=False, goodCredentials={})
        elif state == "registering" and self._waited(host, self.step_s):
            self._enter(host, "inspecting")
        elif state == "inspecting" and name not in self.slow_inspection and self._waited(host, self.step_s):
            self._enter(host, "preparing", hardware={"hostname": name, "cpu": {"count": 64},
                                                     "ramMebibytes": 524288})
        elif state == "preparing" and self._waited(host, self.step_s):
            self._enter(host, "available")
        elif state == "available" and image:
            self._enter(host, "provisioning", provisioning={"state": "provisioning", "image": spec["image"]})
        elif state == "provisioning":
            self._provisioning(host, spec, status, image)
        elif state == "provisioned":
            self._provisioned(host, spec, status, image)
        elif state == "deprovisioning":
            wait = self.clean_s if spec.get("automatedCleaningMode", "metadata") == "metadata" else 0
            if self._waited(host, wait):
                self._enter(host, "available", provisioning={"state": "available", "image": None}, poweredOn=False)

    def _provisioning(self, host: dict, spec: dict, status: dict, image: str | None) -> None:
        name = host["metadata"]["name"]
        if not image:  # taken back while provisioning, or after its error: BMO deprovisions and clears the error
            self._enter(host, "deprovisioning", errorType="", errorMessage="", operationalStatus="OK")
        elif status.get("errorType"):
            pass  # BMO would retry with a backoff; the lab holds the error until the image is cleared
        elif name in self.fail_provisioning:
            self._status(host, {"errorType": "provisioning error", "errorMessage": self.fail_provisioning[name],
                                "operationalStatus": "error", "errorCount": int(status.get("errorCount") or 0) + 1})
        elif self._waited(host, self.step_s):
            self._enter(host, "provisioned", poweredOn=bool(spec.get("online")))
            if spec.get("online"):
                self._boot(host)

    def _provisioned(self, host: dict, spec: dict, status: dict, image: str | None) -> None:
        name = host["metadata"]["name"]
        annotations = host["metadata"].get("annotations") or {}
        if not image:
            self._shutdown(name, forget=True)
            self._enter(host, "deprovisioning", poweredOn=False)
        elif REBOOT_ANNOTATION in annotations:
            self._shutdown(name)
            self._status(host, {"poweredOn": bool(spec.get("online"))})
            if spec.get("online"):
                self._boot(host)
            meta = host["metadata"]
            done = {"metadata": {"annotations": {REBOOT_ANNOTATION: None}}}
            self._objects.patch_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, name, done,
                                                         _content_type=MERGE_PATCH, _request_timeout=5)
        elif spec.get("online") and not status.get("poweredOn"):
            self._status(host, {"poweredOn": True})
            self._boot(host)
        elif not spec.get("online") and status.get("poweredOn"):
            self._shutdown(name)
            self._status(host, {"poweredOn": False})

    # -- the operating system on a provisioned host

    def _user_data(self, host: dict) -> dict:
        ref = (host.get("spec") or {}).get("userData") or {}
        if not ref.get("name"):
            return {}
        try:
            secret = client.CoreV1Api(self._api).read_namespaced_secret(
                ref["name"], ref.get("namespace") or host["metadata"]["namespace"], _request_timeout=5)
            text = base64.b64decode((secret.data or {}).get("userData") or "").decode()
            return yaml.safe_load(text) or {}
        except (ApiException, binascii.Error, UnicodeDecodeError, yaml.YAMLError) as exc:
            log.warning("metal3 lab: %s: user data unreadable: %s", host["metadata"]["name"], type(exc).__name__)
            return {}

    def _boot(self, host: dict) -> None:
        """First boot: cloud-init runs the join command of runcmd against the tenant API it names. Later boots: the
        kubelet posts Ready again."""
        name = host["metadata"]["name"]
        self.boots[name] = self.boots.get(name, 0) + 1  # counted before the node shows it: tests wait on the node
        if name in self.nodes:
            tenant, node_name = self.nodes[name]
            try:
                tenant.kubelet_start(node_name)
            except KubeletJoinError as exc:
                log.warning("metal3 lab: %s: kubelet cannot post its status: %s", name, exc)
            return
        user_data = self._user_data(host)
        node_name = user_data.get("hostname") or name
        for command in user_data.get("runcmd") or []:
            text = command if isinstance(command, str) else " ".join(command)
            try:
                endpoint, token = parse_join_command(text)
            except ValueError:
                continue
            tenant = next((t for t in self.tenants if t.endpoint == endpoint), None)
            if tenant is None:
                log.warning("metal3 lab: %s: join command names an unknown tenant API %s", name, endpoint)
                return
            try:
                kubelet_join(endpoint, token, node_name, {"node.kubernetes.io/instance-type": "metal3-lab"})
            except KubeletJoinError as exc:
                log.warning("metal3 lab: %s: join failed: %s", name, exc)
                return
            self.nodes[name] = (tenant, node_name)
            return

    def _shutdown(self, name: str, *, forget: bool = False) -> None:
        node = self.nodes.pop(name, None) if forget else self.nodes.get(name)
        if node is not None:
            tenant, node_name = node
            try:
                tenant.kubelet_stop(node_name)
            except KubeletJoinError:
                pass  # the node is gone already (drained and deleted)


def _state(host: dict) -> str:
    return ((host.get("status") or {}).get("provisioning") or {}).get("state") or ""
