"""Kind metal3 with a clusterRef: the console claims BareMetalHosts of an existing Metal3 cluster (the lab's, with
its BMO-like controller), provisions them with the tenant's join, powers them and gives them back."""
import base64
import json
import threading
import time
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client

from claims.models import NodeClaim
from claims.tenant_api import TenantAPI
from lab.kube import TenantAPIServer
from lab.metal3 import GROUP, PLURAL, VERSION, Metal3LabCluster
from machines.choices import DiskProof, MachineState
from machines.clusters import cluster_client
from machines.kinds import Join, KindError, kind_of
from machines.kinds.metal3 import CLAIM_ANNOTATION, Cluster, claim_host
from machines.models import Machine, ProviderSecret
from pools.models import NodeProvider, NodeType, OSImage, Tenant

pytestmark = pytest.mark.django_db
NAMESPACE = "metal3"


@pytest.fixture
def tenant_api():
    with TenantAPIServer("acme") as server:
        yield server


@pytest.fixture
def lab(tenant_api):
    with Metal3LabCluster(tenants=[tenant_api], namespace=NAMESPACE, clean_s=0.2) as cluster:
        yield cluster


@pytest.fixture
def world(lab, tenant_api):
    ProviderSecret.objects.create(namespace="vcluster-platform", name="lab-metal3",
                                  contents=json.dumps({"kubeconfig": lab.kubeconfig()}))
    provider = NodeProvider.objects.create(name="metal3-lab", kind="metal3",
                                           config={"clusterRef": {"cluster": "lab-metal3", "namespace": NAMESPACE}})
    gpu = NodeType.objects.create(name="gpu-bmh", provider=provider, host_selector={"matchLabels": {"role": "gpu"}})
    OSImage.objects.create(name="ubuntu", url="http://images.lab/ubuntu-24.04.raw", checksum="ab" * 32,
                           checksum_type="sha256")
    tenant = Tenant.objects.create(name="acme", kubeconfig=tenant_api.kubeconfig(), api_endpoint=tenant_api.endpoint)
    return SimpleNamespace(provider=provider, gpu=gpu, tenant=tenant, kind=kind_of(provider))


def machine_for(world, name, node_type=None, **properties):
    claim = NodeClaim.objects.create(name=name, tenant=world.tenant, provider=world.provider, pool_name="gpu",
                                     node_type=node_type or world.gpu,
                                     properties={"vcluster.com/os-image": "ubuntu", **properties})
    return Machine.objects.create(claim=claim, provider=world.provider, node_type=node_type or world.gpu,
                                  kind="metal3")


def join_for(tenant_api, node_name):
    """The join machines.services hands a kind: a bootstrap token's join command in cloud-init's runcmd."""
    api = TenantAPI(tenant_api.kubeconfig(), timeout=5)
    token = api.create_bootstrap_token()
    command, _ = api.join("vcluster", tenant_api.endpoint, token.token)
    user_data = "#cloud-config\n" + yaml.safe_dump({"hostname": node_name, "runcmd": [command]}, sort_keys=False)
    return Join(user_data=user_data, node_name=node_name, token_id=token.id)


def hosts(lab, *names, labels=None, **kwargs):
    for name in names:
        lab.add_host(name, labels if labels is not None else {"role": "gpu"}, **kwargs)
    for name in names:
        if name not in lab.slow_inspection:
            lab.wait_state(name, "available", namespace=kwargs.get("namespace"))


def patch_host(lab, name, body):
    return client.CustomObjectsApi(lab._api).patch_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, name, body, _content_type="application/merge-patch+json")


def everything_written(lab):
    """What a console may write on hosts (status aside: the controller's)."""
    items = client.CustomObjectsApi(lab._api).list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    return {h["metadata"]["name"]: (h["spec"], h["metadata"].get("annotations"), h["metadata"].get("labels"))
            for h in items}


def wait_progress(kind, machine, state, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        progress = kind.progress(machine)
        if progress.state == state:
            return progress
        assert time.monotonic() < deadline, f"machine is {progress.state} ({progress.message}), not {state}"
        time.sleep(0.02)


def node_ready(tenant_api, name):
    node = next((n for n in tenant_api.objects("nodes") if n["metadata"]["name"] == name), None)
    return node is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in (node.get("status") or {}).get("conditions") or [])


def eventually(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.02)


def fill(world, machine, join):
    world.kind.fill(machine, join)
    machine.save()


def test_capacity_counts_the_hosts_its_selector_matches_in_the_cluster_ref_namespace(world, lab):
    hosts(lab, "gpu-01", "gpu-02", "gpu-03")
    hosts(lab, "cpu-01", labels={"role": "cpu"})
    hosts(lab, "gpu-elsewhere", namespace="other")
    any_role = NodeType.objects.create(name="any-bmh", provider=world.provider, host_selector={
        "matchExpressions": [{"key": "role", "operator": "In", "values": ["gpu", "cpu"]}]})

    assert world.kind.capacity(world.gpu) == 3
    assert world.kind.capacity(any_role) == 4


def test_fill_claims_a_free_matching_host_which_provisions_and_joins_the_tenant(world, lab, tenant_api):
    hosts(lab, "cpu-01", labels={"role": "cpu"})
    hosts(lab, "gpu-01", "gpu-02")
    patch_host(lab, "gpu-01", {"spec": {"consumerRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                                        "kind": "Metal3Machine", "name": "theirs",
                                                        "namespace": "capi"}}})
    machine = machine_for(world, "one-abcde")
    join = join_for(tenant_api, "acme-one-abcde")

    fill(world, machine, join)

    assert (machine.name, machine.namespace) == ("gpu-02", NAMESPACE)
    host = lab.host("gpu-02")
    assert host["spec"]["consumerRef"] == {"apiVersion": "management.loft.sh/v1", "kind": "NodeClaim",
                                           "name": "one-abcde", "namespace": "p-default"}
    assert host["metadata"]["annotations"][CLAIM_ANNOTATION] == "p-default/one-abcde"
    assert host["spec"]["image"] == {"url": "http://images.lab/ubuntu-24.04.raw", "checksum": "ab" * 32,
                                     "checksumType": "sha256", "format": "raw"}
    assert host["spec"]["userData"] == {"name": "one-abcde-user-data", "namespace": NAMESPACE}
    assert host["spec"]["online"] is True
    secret = client.CoreV1Api(lab._api).read_namespaced_secret("one-abcde-user-data", NAMESPACE)
    assert base64.b64decode(secret.data["userData"]).decode() == join.user_data
    assert lab.host("gpu-01")["spec"]["consumerRef"]["name"] == "theirs"  # another's host is left alone
    assert "consumerRef" not in lab.host("cpu-01")["spec"]

    progress = wait_progress(world.kind, machine, MachineState.RUNNING)

    assert progress.node_name == "acme-one-abcde"
    assert progress.details["state"] == "provisioned"
    eventually(lambda: node_ready(tenant_api, "acme-one-abcde"))
    fill(world, machine, join)  # idempotent: the same host, nothing new claimed
    assert machine.name == "gpu-02" and "consumerRef" not in lab.host("cpu-01")["spec"]


def test_power_off_on_and_reboot_go_to_the_host(world, lab, tenant_api):
    hosts(lab, "gpu-01")
    machine = machine_for(world, "one-abcde")
    fill(world, machine, join_for(tenant_api, "node-a"))
    wait_progress(world.kind, machine, MachineState.RUNNING)
    eventually(lambda: node_ready(tenant_api, "node-a"))

    world.kind.power(machine, "off")
    assert lab.host("gpu-01")["spec"]["online"] is False
    wait_progress(world.kind, machine, MachineState.STOPPED)
    assert not node_ready(tenant_api, "node-a")

    world.kind.power(machine, "on")
    wait_progress(world.kind, machine, MachineState.RUNNING)
    eventually(lambda: node_ready(tenant_api, "node-a"))

    boots = lab.boots["gpu-01"]
    world.kind.power(machine, "reboot")
    eventually(lambda: "reboot.metal3.io" not in lab.host("gpu-01")["metadata"]["annotations"])
    assert lab.boots["gpu-01"] == boots + 1
    eventually(lambda: node_ready(tenant_api, "node-a"))
    with pytest.raises(KindError, match="unknown power action"):
        world.kind.power(machine, "hibernate")


@pytest.mark.parametrize("mode, proof", [("metadata", DiskProof.METAL3_CLEANING), ("disabled", DiskProof.NONE)])
def test_release_clears_image_and_user_data_cleans_and_gives_the_host_back_as_it_was(world, lab, tenant_api, mode,
                                                                                       proof):
    world.gpu.provider_config = {"automatedCleaningMode": mode}
    world.gpu.save()
    hosts(lab, "gpu-01", annotations={"team": "infra"})
    machine = machine_for(world, "one-abcde")
    fill(world, machine, join_for(tenant_api, "node-a"))
    wait_progress(world.kind, machine, MachineState.RUNNING)
    patch_host(lab, "gpu-01", {"metadata": {"annotations": {"team": "tenant-acme", "debug": "on"}}})

    assert world.kind.release(machine) is False  # deprovisioning begins
    host = lab.host("gpu-01")
    assert "image" not in host["spec"] and "userData" not in host["spec"]
    assert host["spec"]["automatedCleaningMode"] == mode
    with pytest.raises(client.ApiException):
        client.CoreV1Api(lab._api).read_namespaced_secret("one-abcde-user-data", NAMESPACE)

    deadline = time.monotonic() + 10
    while not world.kind.release(machine):
        assert time.monotonic() < deadline
        time.sleep(0.02)

    host = lab.host("gpu-01")
    assert host["status"]["provisioning"]["state"] == "available"
    assert "consumerRef" not in host["spec"]
    assert host["metadata"]["annotations"] == {"team": "infra"}
    assert not node_ready(tenant_api, "node-a")
    assert world.kind.disk_proof(machine) == proof
    assert world.kind.release(machine) is True  # again: nothing left to do
    other = machine_for(world, "two-fghij")
    fill(world, other, join_for(tenant_api, "node-b"))  # the host is free for the next claim
    assert other.name == "gpu-01"


def test_a_provisioning_error_fails_the_machine_with_the_operators_message(world, lab, tenant_api):
    hosts(lab, "gpu-01")
    lab.fail_provisioning["gpu-01"] = "Image provisioning failed: checksum mismatch"
    machine = machine_for(world, "one-abcde")
    fill(world, machine, join_for(tenant_api, "node-a"))

    progress = wait_progress(world.kind, machine, MachineState.FAILED)

    assert progress.message == ("BareMetalHost metal3/gpu-01: provisioning error: Image provisioning failed: "
                                "checksum mismatch")
    deadline = time.monotonic() + 10
    while not world.kind.release(machine):  # a failed host is given back too
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert "consumerRef" not in lab.host("gpu-01")["spec"]


def test_a_host_still_inspecting_is_not_taken_until_it_is_available(world, lab, tenant_api):
    hosts(lab, "gpu-01", slow_inspection=True)
    lab.wait_state("gpu-01", "inspecting")
    machine = machine_for(world, "one-abcde")

    with pytest.raises(KindError, match="no free BareMetalHost matches node type gpu-bmh") as excinfo:
        fill(world, machine, join_for(tenant_api, "node-a"))
    assert excinfo.value.retry is True
    assert "consumerRef" not in lab.host("gpu-01")["spec"]

    lab.slow_inspection.discard("gpu-01")
    lab.wait_state("gpu-01", "available")
    fill(world, machine, join_for(tenant_api, "node-a"))
    assert machine.name == "gpu-01"


def test_of_two_consoles_claiming_from_the_same_stale_list_only_one_takes_the_host(world, lab):
    hosts(lab, "gpu-01")
    consumer = {"apiVersion": "management.loft.sh/v1", "kind": "NodeClaim", "namespace": "p-default"}
    with cluster_client(world.provider) as api:
        cluster = Cluster(world.provider, api)
        seen = cluster.hosts(NAMESPACE, world.gpu.host_selector)  # both read it free

        first = claim_host(cluster, seen, {CLAIM_ANNOTATION: "p-default/one"}, {**consumer, "name": "one"})
        second = claim_host(cluster, seen, {CLAIM_ANNOTATION: "p-default/two"}, {**consumer, "name": "two"})

    assert first["metadata"]["name"] == "gpu-01"
    assert second is None
    assert lab.host("gpu-01")["spec"]["consumerRef"]["name"] == "one"


def test_two_workers_racing_for_one_free_host_one_wins(world, lab):
    hosts(lab, "gpu-01")
    consumer = {"apiVersion": "management.loft.sh/v1", "kind": "NodeClaim", "namespace": "p-default"}
    barrier, won = threading.Barrier(2), {}

    def worker(name, cluster):
        seen = cluster.hosts(NAMESPACE, world.gpu.host_selector)
        barrier.wait()
        won[name] = claim_host(cluster, seen, {CLAIM_ANNOTATION: f"p-default/{name}"}, {**consumer, "name": name})

    # Each worker its own client (the kubeconfig read here: the database stays in the test's thread).
    with cluster_client(world.provider) as one, cluster_client(world.provider) as two:
        threads = [threading.Thread(target=worker, args=(name, Cluster(world.provider, api)))
                   for name, api in (("one", one), ("two", two))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)

    winners = [name for name, host in won.items() if host is not None]
    assert len(won) == 2 and len(winners) == 1
    assert lab.host("gpu-01")["spec"]["consumerRef"]["name"] == winners[0]
    assert lab.host("gpu-01")["metadata"]["annotations"][CLAIM_ANNOTATION] == f"p-default/{winners[0]}"


def test_bad_inputs_are_refused_before_any_host_is_touched(world, lab, tenant_api):
    hosts(lab, "gpu-01", "gpu-02")
    before = everything_written(lab)
    join = join_for(tenant_api, "node-a")

    no_image = machine_for(world, "no-image", **{"vcluster.com/os-image": "missing"})
    with pytest.raises(KindError, match="OS image: OS image missing not found") as excinfo:
        fill(world, no_image, join)
    assert excinfo.value.retry is False

    OSImage.objects.create(name="no-checksum", url="http://images.lab/x.raw", checksum="")
    unverified = machine_for(world, "unverified", **{"vcluster.com/os-image": "no-checksum"})
    with pytest.raises(KindError, match="has no url or no checksum"):
        fill(world, unverified, join)

    odd = NodeType.objects.create(name="odd", provider=world.provider, host_selector={"matchLabels": {"role": "gpu"}},
                                  provider_config={"automatedCleaningMode": "sometimes"})
    with pytest.raises(KindError, match="automatedCleaningMode must be metadata or disabled"):
        fill(world, machine_for(world, "odd-one", node_type=odd), join)

    ProviderSecret.objects.all().delete()
    machine = machine_for(world, "one-abcde")
    with pytest.raises(KindError, match="no kubeconfig for cluster lab-metal3") as excinfo:
        fill(world, machine, join)
    assert excinfo.value.retry is False
    with pytest.raises(KindError, match="no kubeconfig"):
        world.kind.capacity(world.gpu)

    assert everything_written(lab) == before
    assert machine.name == "" and machine.made == []
