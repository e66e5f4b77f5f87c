"""Builders shared by the test modules: hosts, pools and rails as rows, manifests as users write them, the release
gate's evidence, the agent's side of the protocol, the admin's forms. Test modules import these, never each other."""
import json
import threading
from datetime import timedelta

import yaml
from django.contrib.messages import get_messages
from django.forms import CheckboxInput
from django.utils import timezone

from agent.client import ConsoleClient
from claims.models import NodeClaim
from events.models import Event
from hosts.boot.ramdisk import ramdisk_boot_start
from hosts.models import BareMetalHost
from hosts.services import host_transition
from hosts.topology import RACK_LABEL, RAIL_GROUP_LABEL
from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant


# --- hosts and pools, as rows ---

IMAGE = "ubuntu2404-20260926"  # the demo site's OSImage: a claim needs one before it gets a host


def make_hosts(n: int, role: str = "gpu", start: int = 0):
    BareMetalHost.objects.bulk_create([
        BareMetalHost(name=f"{role}-{i:05d}", bmc_address=f"redfish://10.0.{i // 250}.{i % 250}/redfish/v1/Systems/1",
                      boot_mac=f"52:54:{(i >> 24) & 255:02x}:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}"
                      if role == "gpu" else f"52:55:00:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}",
                      labels={"role": role}, state="available")
        for i in range(start, start + n)
    ])


def make_pool(tenant_name: str, quantity: int, node_type: str = "gpu-server", pool_name: str = "gpu") -> NodePool:
    tenant, _ = Tenant.objects.get_or_create(
        name=tenant_name, defaults={"provider_properties": {"metal3": {"vcluster.com/os-image": IMAGE}}})
    return NodePool.objects.create(tenant=tenant, name=pool_name, provider=NodeProvider.objects.get(name="metal3"),
                                   quantity=quantity,
                                   node_type_selector=[{"property": "vcluster.com/node-type", "value": node_type}])


def make_rails(sizes: dict[str, int], *, rack: dict[str, str] | None = None, start: int = 0,
               bmc: str = "redfish://10.1.{a}.{b}/redfish/v1/Systems/1") -> None:
    """Free gpu hosts on each rail group: {"r1": 3, ...}; `rack`: a rack label per rail."""
    hosts, i = [], start
    for rail, n in sizes.items():
        for _ in range(n):
            labels = {"role": "gpu", RAIL_GROUP_LABEL: rail}
            if rack:
                labels[RACK_LABEL] = rack[rail]
            hosts.append(BareMetalHost(name=f"gpu-{i:05d}", labels=labels, state="available",
                                       bmc_address=bmc.format(a=i // 250, b=i % 250, i=i),
                                       boot_mac=f"52:54:01:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}"))
            i += 1
    BareMetalHost.objects.bulk_create(hosts)


# --- manifests, as users apply them ---

BMH = """\
---
apiVersion: v1
kind: Secret
metadata: {{name: new-bmc, namespace: metal3}}
data: {{username: YWRtaW4=, password: c2VjcmV0}}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: new-host
  namespace: metal3
spec:
  bmc:
    address: {address}
    credentialsName: {credentials}
  bootMACAddress: 52:54:00:aa:bb:cc
"""


def bmh(name: str, mac: str, status: dict | None = None) -> str:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-bmc", "namespace": "metal3"},
              "stringData": {"username": f"user-{name}", "password": f"pw-{name}-7c1d"}}
    host = {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": name, "namespace": "metal3", "labels": {"role": "gpu"}},
            "spec": {"bmc": {"address": f"redfish+http://127.0.0.1:8099/redfish/v1/Systems/{name}",
                             "credentialsName": f"{name}-bmc"}, "bootMACAddress": mac}}
    if status is not None:
        host["metadata"]["annotations"] = {"baremetalhost.metal3.io/status": json.dumps(status)}
    return yaml.safe_dump_all([secret, host])


LIST_FORM = """\
privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      static:
        - name: gpu-rack1
          quantity: 2
          nodeTypeSelector:
            - property: vcluster.com/node-type
              operator: In
              values: [gpu-server]
            - property: topology.kubernetes.io/zone
              operator: DoesNotExist
          nodeLabels:
            workload: gpu
          taints:
            - key: nvidia.com/gpu
              value: "true"
              effect: NoSchedule
          terminationGracePeriod: 30s
      dynamic:
        - name: burst
          nodeTypeSelector:
            - property: vcluster.com/node-type
              operator: NotIn
              values: [cpu-server]
          limits:
            nodes: "4"
            nvidia.com/gpu: "32"
          disruption:
            consolidationPolicy: WhenEmpty
            consolidateAfter: 10m
            budgets:
              - nodes: "20%"
          expireAfter: 720h
          weight: 10
"""


GATED_TYPE = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: gpu-secure
spec:
  providerRef: metal3
  bareMetalHosts:
    selector:
      matchLabels: {role: gpu}
  cleaning:
    policy: secure
    fallback: full
    eraseConcurrency: 8
    eraseVerifyShare: 0.05
    eraseVerifyFull: true
  healthCheck:
    dcgmLevel: 3
    ncclMinBusbwGBps: 400
"""


GATED_PROVIDER = """\
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata:
  name: rack2
spec:
  metal3:
    nodeTypes:
      - name: rack2-gpu
        cleaning: {policy: metadata}
        healthCheck: {dcgmLevel: 0, ncclMinBusbwGBps: 350.5}
"""


def gate(name: str) -> tuple:
    return tuple(NodeType.objects.filter(name=name).values_list(
        "cleaning_policy", "cleaning_fallback", "erase_concurrency", "erase_verify_share", "erase_verify_full",
        "health_dcgm_level", "health_nccl_min_busbw_gbps").get())


# --- the release gate's evidence ---

GATE = {"node_type": "gpu-server", "policy": {"method": "secure", "fallback": "full", "source": "NodeType gpu-server"}}


def erased(**changes) -> dict:
    """One disk as the agent's `erase` reports it: NVMe crypto erase."""
    disk = {"name": "nvme0n1", "ok": True, "serial": "S7GPU011", "model": "SAMSUNG MZWLO3T8HCLS", "vendor": None,
            "type": "nvme", "size_bytes": 3840755982336, "requested": "secure", "method": "secure",
            "method_type": "Purge", "method_details": "NVMe Format NVM, Secure Erase Setting 2: cryptographic erase",
            "tool": "nvme-cli", "tool_version": "nvme version 2.8", "attempts": [], "fallback_from": None,
            "commands": ["nvme id-ctrl /dev/nvme0n1 -o json", "nvme format /dev/nvme0n1 --ses=2 --force"],
            "started_at": "2026-11-29T10:00:00Z", "ended_at": "2026-11-29T10:00:09Z", "expectation": "changed"}
    disk.update(changes)
    return {"disks": [disk]}


def verified(**changes) -> dict:
    disk = {"name": "nvme0n1", "serial": "S7GPU011", "expectation": "changed", "mode": "sampled", "direct_io": True,
            "canaries": {"planted": 64, "checked": 64, "survived": 0, "survivors": []},
            "samples": {"count": 586, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0},
            "bytes_read": 38666240, "passed": True, "findings": []}
    disk.update(changes)
    return {"disks": [disk], "passed": disk["passed"]}


# --- the agent's side of the protocol ---

def boot(host) -> str:
    """The console powers the host into the ramdisk: a new boot, whose secret the boot path delivers."""
    return ramdisk_boot_start(host=host, flow_id=f"flow-{host.name}").secret


def post(client, path, body, token=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    response = client.post(path, json.dumps(body), content_type="application/json", **headers)
    return response.status_code, response.json()


def lookup(client, host, secret=None):
    status, body = post(client, "/agent/lookup", {"macs": [host.boot_mac.upper()], "boot_id": "boot-1",
                                                  "boot_secret": secret or host.boot_secret})
    assert status == 200, body
    return body


def warm_agent(url: str, name: str = "gpu-01"):
    """gpu-01 booted into the ramdisk, its agent's session open (the real agent client), then available and warm,
    as the gate's keep_warm step leaves it. Returns the host and the agent's client and session."""
    host = BareMetalHost.objects.get(name=name)
    host_transition(host=host, to_state="inspecting", actor="test")
    client = ConsoleClient(url, timeout=5)
    session = client.lookup([host.boot_mac], "boot-1", boot(host))
    BareMetalHost.objects.filter(pk=host.pk).update(warm_since=timezone.now(),
                                                    warm_until=timezone.now() + timedelta(minutes=30))
    host_transition(host=BareMetalHost.objects.get(pk=host.pk), to_state="available", actor="test")
    return BareMetalHost.objects.get(pk=host.pk), client, session


def ask_in_thread(client, session) -> dict:
    """The agent's idle ask, in a thread: {"answer": ..., "error": ...} once it is answered."""
    box = {}

    def ask():
        try:
            box["answer"] = client.heartbeat(session, status="idle")
        except Exception as exc:  # noqa: BLE001 - the test reads it
            box["error"] = exc

    box["thread"] = threading.Thread(target=ask, daemon=True)
    box["thread"].start()
    return box


# --- the admin's forms ---

def form_data(page) -> dict:
    """The change form's fields, and its inlines' rows, as the browser would post them back unchanged."""
    forms = [page.context["adminform"].form]
    for inline in page.context["inline_admin_formsets"]:
        forms += [inline.formset.management_form, *inline.formset.initial_forms]
    data = {}
    for field in (field for form in forms for field in form if not field.field.disabled):
        value = field.value()
        if isinstance(field.field.widget, CheckboxInput):
            if value:
                data[field.html_name] = "on"
        else:
            data[field.html_name] = "" if value is None else value
    return data


def messages_of(response) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in get_messages(response.wsgi_request)]


# --- the database ---

def empty_the_database():
    for model in (NodeClaim, NodePool, BareMetalHost, NodeEnvironment, Tenant, NodeType, OSImage, NodeProvider):
        model.objects.all().delete()
    Event.objects.all().delete()  # QuerySet.delete: the append-only guard is on the instance
    assert not any(m.objects.exists() for m in (NodeProvider, Tenant, BareMetalHost))
