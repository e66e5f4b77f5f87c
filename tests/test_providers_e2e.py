"""External providers end to end, as a platform engineer uses them: manifests applied (the cluster's kubeconfig
Secret, the NodeProvider with its node types, an OS image, a tenant's pool), the reconcile and the machines' looks
as the worker runs them, against the lab's KubeVirt cluster or Metal3 cluster and the tenant's lab API: a claim
Available with its machine recorded, its node Ready in the tenant, power off and on through the API, release, and
the machine gone with its proof said. The manifests round-trip through export. KubeVirt twice: with the lab's
simulated guests, and with a QEMU VM booting the lab OS image that reads its NoCloud seed and joins by itself."""
import io
import shutil
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client

from claims.choices import ClaimPhase as P
from claims.models import NodeClaim
from claims.phases import claims_release
from claims.tenant_api import TenantAPI
from conftest import wait_for
from events.models import Event
from lab import vmimage
from lab.kube import TenantAPIServer
from lab.kubevirt import KubeVirtCluster
from lab.metal3 import Metal3LabCluster
from lab.redfish import GUEST_HOST
from machines.choices import MachineState
from machines.models import Machine, TofuState
from machines.services import claims_fill, machine_advance, machine_power_send
from manifests.export import export_text
from pools.models import Tenant

from .test_vm_lab import alive

pytest_plugins = ["tests.vm_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)
# TCG on 2 shared cores: the OS image's boot to its node Ready took 25-125 s (tests/test_vm_images.py).
GUEST_BOOT_S = 240

FAKE_TOFU = Path(__file__).resolve().parent / "fixtures" / "fake_tofu"

# A cluster's kubeconfig, as a clusterRef names it.
CLUSTER_SECRET = """
apiVersion: v1
kind: Secret
metadata: {{name: {cluster}, namespace: vcluster-platform}}
stringData:
  kubeconfig: |
{kubeconfig}
"""
KUBEVIRT_SITE = """
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {{name: kubevirt}}
spec:
  kubeVirt:
    clusterRef: {{cluster: kv-lab, namespace: vms}}
    virtualMachineTemplate:
      spec:
        template:
          spec:
            domain: {{cpu: {{cores: 2}}, memory: {{guest: 4Gi}}}}
    nodeTypes:
      - name: vm-small
        resources: {{cpu: "2", memory: 4Gi}}
        maxCapacity: 3
        mergeVirtualMachineTemplate:
          spec: {{template: {{metadata: {{labels: {{size: small}}}}}}}}
---
apiVersion: management.loft.sh/v1
kind: OSImage
metadata: {{name: ubuntu-vm}}
spec:
  properties:
    metal3.vcluster.com/image-url: https://images.example/ubuntu.qcow2
    metal3.vcluster.com/image-checksum: "{checksum}"
    kubevirt.vcluster.com/image-url: https://images.example/ubuntu.qcow2
    kubevirt.vcluster.com/root-disk-size: 20Gi
"""
METAL3_SITE = """
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {{name: far-metal3}}
spec:
  metal3:
    clusterRef: {{cluster: far-site, namespace: metal3}}
    nodeTypes:
      - name: far-gpu
        resources: {{cpu: "64", nvidia.com/gpu: "8"}}
        bareMetalHosts: {{selector: {{matchLabels: {{role: gpu}}}}}}
        automatedCleaningMode: metadata
---
apiVersion: management.loft.sh/v1
kind: OSImage
metadata: {{name: ubuntu-vm}}
spec:
  properties:
    metal3.vcluster.com/image-url: http://images.lab/ubuntu-24.04.raw
    metal3.vcluster.com/image-checksum: "{checksum}"
"""
TERRAFORM_SITE = """
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {{name: cloud}}
spec:
  terraform:
    nodeTemplate:
      inline: |
        # fake-tofu: lab-machine
        variable "vcluster" {{ type = any }}
        output "power" {{ value = var.vcluster.powerState }}
    nodeTypes:
      - name: cloud-small
        resources: {{cpu: "2", memory: 4Gi}}
        maxCapacity: 2
---
apiVersion: management.loft.sh/v1
kind: OSImage
metadata: {{name: ubuntu-vm}}
spec:
  properties:
    metal3.vcluster.com/image-url: https://images.example/ubuntu.qcow2
    metal3.vcluster.com/image-checksum: "{checksum}"
"""
POOL = """
privateNodes:
  autoNodes:
    - provider: {provider}
      properties: {{vcluster.com/os-image: ubuntu-vm}}
      static:
        - name: workers
          quantity: 1
"""


def with_cluster(site: str, cluster: str, kubeconfig: str, checksum: str) -> str:
    indented = "\n".join("    " + line for line in kubeconfig.splitlines())
    return CLUSTER_SECRET.format(cluster=cluster, kubeconfig=indented) + "---" + site.format(checksum=checksum)


def looks_until(predicate, timeout: float = 30, interval: float = 0.1):
    """What the worker does: the beat's pass, then a look at every machine, until the predicate holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        claims_fill()
        for machine in Machine.objects.exclude(state=MachineState.GONE):
            machine_advance(machine_id=machine.pk)
        if value := predicate():
            return value
        time.sleep(interval)
    raise AssertionError(f"not within {timeout}s: {[(c.name, c.phase, c.message) for c in NodeClaim.objects.all()]}"
                         f" {[(m.name, m.state, m.message) for m in Machine.objects.all()]}")


def ready(tenant_api, name: str) -> str | None:
    node = TenantAPI(tenant_api.kubeconfig()).get_node(name)
    return next((c["status"] for c in (node or {}).get("status", {}).get("conditions", []) if c["type"] == "Ready"),
                None)


def power(claim, action: str) -> None:
    """A tenant's admin asks (the API); the worker sends it."""
    from django.contrib.auth.models import User
    admin = User.objects.filter(is_superuser=True).first() or User.objects.create_superuser("e2e-admin", password="x")
    client = Client()
    client.force_login(admin)
    answer = client.post(f"/api/v1/claims/{claim.pk}/power/", {"action": action}, content_type="application/json")
    assert answer.status_code == 200, answer.content
    request = Event.objects.filter(claim_id=claim.pk, data__action=action).latest("pk")
    assert machine_power_send(machine_id=claim.machine.pk, request_id=request.pk) == "ok"


def life(apply, tenant_api, site_text: str, provider: str, proof: str) -> None:
    lines = apply(site_text)
    assert any("nodeprovider" in line and "created" in line for line in lines), lines
    apply(POOL.format(provider=provider), tenant="alpha")
    Tenant.objects.filter(name="alpha").update(api_endpoint=tenant_api.endpoint, kubeconfig=tenant_api.kubeconfig())
    call_command("reconcile", stdout=io.StringIO())
    claim = looks_until(lambda: NodeClaim.objects.filter(phase=P.AVAILABLE).first())
    machine = Machine.objects.get(claim=claim)
    assert machine.made and machine.state == MachineState.RUNNING
    assert ready(tenant_api, claim.node_name) == "True"
    answer = Client()
    from django.contrib.auth.models import User
    answer.force_login(User.objects.create_superuser("reader", password="x"))
    shown = answer.get(f"/api/v1/claims/{claim.pk}/").json()
    assert shown["machine"]["name"] == machine.name and shown["machine"]["kind"] == machine.kind
    assert shown["proof"]["kind"] == proof and not shown["proof"]["final"]
    assert shown["power"] == {"state": "On"}
    page = answer.get(f"/claims/{claim.name}/").content.decode()
    assert machine.name in page and "Proof of erase" in page and shown["proof"]["text"] in page

    power(claim, "power-off")
    looks_until(lambda: ready(tenant_api, claim.node_name) != "True")
    off = Machine.objects.get(pk=machine.pk)
    assert off.power == "Off" and off.outputs.get("power", "Off") == "Off"  # a workspace's outputs follow
    power(claim, "power-on")
    looks_until(lambda: ready(tenant_api, claim.node_name) == "True")
    assert answer.get(f"/api/v1/claims/{claim.pk}/").json()["power"] == {"state": "On"}

    exported = export_text()
    assert f"name: {provider}" in exported
    assert "token:" not in exported  # the kubeconfig's credentials never leave: the Secret is exported redacted

    claims_release(claims=[NodeClaim.objects.get(pk=claim.pk)], actor="user:e2e", reason="done")
    looks_until(lambda: NodeClaim.objects.get(pk=claim.pk).phase == P.RELEASED)
    machine.refresh_from_db()
    assert machine.state == MachineState.GONE and machine.disk_proof == proof
    assert TenantAPI(tenant_api.kubeconfig()).get_node(claim.node_name) is None
    assert answer.get(f"/api/v1/claims/{claim.pk}/").json()["proof"]["final"] is True


@pytest.fixture
def tenant_api():
    with TenantAPIServer("alpha") as server:
        yield server


def test_a_kubevirt_pool_gets_a_vm_that_joins_powers_off_and_on_and_goes_at_release(apply, tenant_api):
    with KubeVirtCluster("kv-lab") as cluster:
        life(apply, tenant_api, with_cluster(KUBEVIRT_SITE, "kv-lab", cluster.kubeconfig(), "0" * 64),
             "kubevirt", "destroyed")
        assert not cluster.objects("virtualmachines", "vms", group="kubevirt.io", version="v1")


@pytest.mark.vm
@pytest.mark.skipif(not shutil.which("qemu-system-x86_64"),
                    reason="qemu-system-x86_64 is not installed (Debian: qemu-system-x86, qemu-utils)")
@pytest.mark.timeout(600)  # two boots of the OS image under TCG (measured: see the printed timings)
def test_a_kubevirt_pool_gets_a_qemu_vm_whose_os_reads_its_seed_joins_by_itself_powers_off_and_on_and_goes(
        apply, tenant_api, images, tmp_path):
    started = time.monotonic()
    with KubeVirtCluster("kv-lab", guests="qemu", os_image=images.path(vmimage.OS_IMAGE),
                         var_dir=tmp_path / "kubevirt") as cluster:
        apply(with_cluster(KUBEVIRT_SITE, "kv-lab", cluster.kubeconfig(), "0" * 64))
        apply(POOL.format(provider="kubevirt"), tenant="alpha")
        # The VIP the guest joins: the tenant API as a QEMU guest reaches this host.
        Tenant.objects.filter(name="alpha").update(api_endpoint=f"{GUEST_HOST}:{tenant_api.port}",
                                                   kubeconfig=tenant_api.kubeconfig())
        call_command("reconcile", stdout=io.StringIO())

        def console() -> str:
            guests = [cluster.guest(v["metadata"]["namespace"], v["metadata"]["name"]) for v in cluster.vmis()]
            return "\n".join(g.console_text()[-3000:] for g in guests if g is not None)

        try:
            claim = looks_until(lambda: NodeClaim.objects.filter(phase=P.AVAILABLE).first(), GUEST_BOOT_S, 1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nthe guest's console:\n{console()}") from None
        joined_s = time.monotonic() - started
        machine = Machine.objects.get(claim=claim)
        assert machine.made and machine.state == MachineState.RUNNING
        guest = cluster.guest(machine.namespace, machine.name)
        node = TenantAPI(tenant_api.kubeconfig()).get_node(claim.node_name)
        # Only the guest says these: its OS image's name, the Debian kernel it booted, the address QEMU's DHCP
        # gave it, the seed it found on its second disk and the join on its console.
        info = node["status"]["nodeInfo"]
        assert (info["osImage"], info["kernelVersion"]) == ("vMetal OS (Debian 12 packages)", images.kernel_version)
        assert {"type": "InternalIP", "address": "10.0.2.15"} in node["status"]["addresses"]
        text = guest.console_text()
        assert "seed found on /dev/vdb" in text, text[-3000:]
        assert f"vmetal-os: node {claim.node_name} joined {GUEST_HOST}:{tenant_api.port}, Ready" in text
        assert [j["node"] for j in cluster.joins] == [claim.node_name]
        first_pid, first_boot = guest.proc.pid, info["bootID"]
        [disk] = cluster.disks()

        power(claim, "power-off")
        looks_until(lambda: ready(tenant_api, claim.node_name) != "True", 60, 1)
        [vm] = cluster.vms(machine.namespace)
        assert vm["spec"]["runStrategy"] == "Halted"
        wait_for(lambda: cluster.vms(machine.namespace)[0]["status"]["printableStatus"] == "Stopped", timeout=20)
        assert not alive(first_pid) and cluster.guest(machine.namespace, machine.name) is None and disk.exists()
        mark = time.monotonic()
        power(claim, "power-on")
        try:
            looks_until(lambda: ready(tenant_api, claim.node_name) == "True", GUEST_BOOT_S, 1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nthe guest's console:\n{console()}") from None
        rejoined_s = time.monotonic() - mark
        node = TenantAPI(tenant_api.kubeconfig()).get_node(claim.node_name)
        assert node["status"]["nodeInfo"]["bootID"] != first_boot  # a new boot of the guest joined again
        second = cluster.guest(machine.namespace, machine.name)
        second_pid = second.proc.pid
        assert second_pid != first_pid and second.root_disk == disk

        claims_release(claims=[NodeClaim.objects.get(pk=claim.pk)], actor="user:e2e", reason="done")
        looks_until(lambda: NodeClaim.objects.get(pk=claim.pk).phase == P.RELEASED, 60, 1)
        machine.refresh_from_db()
        assert machine.state == MachineState.GONE and machine.disk_proof == "destroyed"
        assert TenantAPI(tenant_api.kubeconfig()).get_node(claim.node_name) is None
        ns = machine.namespace
        assert not cluster.vms(ns) and not cluster.vmis(ns) and not cluster.data_volumes(ns)
        assert not [s for s in cluster.objects("secrets", ns) if s["metadata"]["name"].startswith(machine.name)]
        wait_for(lambda: not disk.exists() and not cluster.disks(), timeout=20)
        assert not alive(second_pid)
    print(f"KubeVirt with a QEMU guest: claim Available (node Ready) {joined_s:.0f} s after the manifests, "
          f"Ready again {rejoined_s:.0f} s after power-on; whole test {time.monotonic() - started:.0f} s")


def test_a_pool_on_an_existing_metal3_cluster_gets_one_of_its_hosts_and_gives_it_back(apply, tenant_api):
    with Metal3LabCluster(tenants=[tenant_api], namespace="metal3", clean_s=0.2) as cluster:
        cluster.add_host("far-gpu-1", {"role": "gpu"})
        cluster.add_host("far-cpu-1", {"role": "cpu"})
        cluster.wait_state("far-gpu-1", "available")
        life(apply, tenant_api, with_cluster(METAL3_SITE, "far-site", cluster.kubeconfig(), "ab" * 32),
             "far-metal3", "metal3-cleaning")
        cluster.wait_state("far-gpu-1", "available")


def test_a_pool_on_opentofu_templates_gets_a_workspace_whose_machine_joins_and_is_destroyed_at_release(
        apply, tenant_api, live_server, settings, tmp_path):
    """OpenTofu is the stand-in (tests/fixtures/fake_tofu) with a template whose resource is a lab machine: cloud-init
    from var.vcluster.userData joins the tenant, powerState Off stops its kubelet."""
    wrapper = tmp_path / "tofu"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_TOFU} \"$@\"\n")
    wrapper.chmod(0o755)
    settings.TOFU_BINARY, settings.TOFU_WORKDIR = str(wrapper), tmp_path / "work"
    settings.TOFU_STATE_URL = f"{live_server.url}/api/v1/tofu/state"
    life(apply, tenant_api, TERRAFORM_SITE.format(checksum="0" * 64), "cloud", "destroyed")
    assert Machine.objects.get().outputs == {}  # forgotten with the workspace
    assert not TofuState.objects.exists()  # destroyed, and its state forgotten


def test_manifests_of_each_kind_round_trip_through_export(apply):
    apply(with_cluster(KUBEVIRT_SITE, "kv-lab", "apiVersion: v1\nkind: Config\nclusters: []", "0" * 64))
    apply(with_cluster(METAL3_SITE, "far-site", "apiVersion: v1\nkind: Config\nclusters: []", "ab" * 32))
    apply("""
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {name: cloud}
spec:
  terraform:
    timeout: 30m
    nodeTemplate:
      git: {repository: "https://git.example.com/t.git", tag: v1, subPath: nodes, fetchInterval: 5m}
    nodeTypes:
      - name: cloud-small
        maxCapacity: 4
        nodeTemplate: {inline: 'resource "null_resource" "n" {}'}
""")
    first = export_text()
    assert "kubeVirt:" in first and "terraform:" in first and "clusterRef:" in first
    assert "mergeVirtualMachineTemplate" in first and "fetchInterval: 5m" in first
    assert "automatedCleaningMode: metadata" in first
    lines = apply(first)
    assert not [line for line in lines if "configured" in line or "created" in line], lines
    assert export_text() == first


@pytest.mark.parametrize("block, message", [
    ("kubeVirt: {namespaceStrategy: Provider}", "clusterRef"),
    ("terraform: {timeout: 5m}", "needs an OpenTofu template"),
    ("terraform: {nodeTemplate: {inline: x, git: {repository: r}}}", "either inline or git"),
    ("terraform: {nodeTemplate: {git: {repository: r, tag: a, branch: b}}}", "one of branch, tag or commit"),
    ("kubeVirt: {clusterRef: {cluster: c}, maxCapacity: 99999999999}", "maxCapacity"),
    ("bcm: {}", "not supported by this console"),
    ("metal3: {clusterRef: {cluster: c}, nodeTypes: [{name: t, automatedCleaningMode: sometimes}]}",
     "automatedCleaningMode"),
])
def test_a_bad_provider_is_refused_with_file_document_and_line_and_nothing_changes(apply, block, message):
    from django.core.management.base import CommandError

    from pools.models import NodeProvider
    text = f"apiVersion: management.loft.sh/v1\nkind: NodeProvider\nmetadata: {{name: bad}}\nspec:\n  {block}\n"
    with pytest.raises(CommandError) as refused:
        apply(text)
    assert message in str(refused.value) and "manifest0.yaml" in str(refused.value) and "(line 5)" in str(refused.value)
    assert not NodeProvider.objects.filter(name="bad").exists()
