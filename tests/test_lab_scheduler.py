"""The lab's tenant API schedules as kube-scheduler does and runs Jobs as the Job controller does, so that Auto Nodes
has real Pending pods to answer: bound where they fit, Unschedulable with kube-scheduler's message where not."""
import io
import itertools
import threading
import time

import pytest
import yaml
from kubernetes import client, config, watch

from claims.tenant_api import TenantAPI
from lab.kube import TenantAPIServer, kubelet_join
from lab.site import LabSite

pytest_plugins = ["tests.lab_conftest"]

GPU_SERVER = {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110"}
CPU_SERVER = {"cpu": "64", "memory": "524288Mi", "pods": "110"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@pytest.fixture
def tenant():
    with TenantAPIServer("acme", termination_s=0.1) as server:
        yield server


@pytest.fixture
def api(tenant):
    api = config.new_client_from_config_dict(yaml.safe_load(tenant.kubeconfig()), persist_config=False)
    yield api
    api.close()


@pytest.fixture
def kubectl(api):
    return client.CoreV1Api(api)


@pytest.fixture
def batch(api):
    return client.BatchV1Api(api)


@pytest.fixture
def join(tenant):
    """join(name, capacity, labels=..., taints=..., ready=...): a node as the lab's kubelet registers it, with the
    pool's labels and taints set as the console's node_labels step sets them."""
    console = TenantAPI(tenant.kubeconfig(), timeout=5)

    def make(name, capacity=GPU_SERVER, labels=None, taints=(), ready=True):
        token = console.create_bootstrap_token().token
        kubelet_join(tenant.endpoint, token, name, ready=ready, capacity=capacity, sample_pods=False)
        if labels or taints:
            console.set_node_labels_and_taints(name, labels or {}, list(taints))
    return make


def pod(name, gpus=0, cpu=None, selector=None, affinity=None, tolerations=None):
    requests = {k: v for k, v in (("cpu", cpu), ("nvidia.com/gpu", str(gpus) if gpus else None)) if v}
    spec = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": requests, "limits": {k: v for k, v in requests.items()
                                                                            if k != "cpu"}}}]}
    if selector:
        spec["nodeSelector"] = selector
    if affinity:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": affinity}]}}}
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def placement(kubectl, name) -> str:
    """The pod's node, or "Unschedulable: <message>"."""
    got = kubectl.read_namespaced_pod(name, "default")
    if got.spec.node_name:
        assert got.status.phase == "Running"
        assert [(c.type, c.status) for c in got.status.conditions if c.type == "PodScheduled"] == [("PodScheduled", "True")]
        return got.spec.node_name
    (scheduled,) = [c for c in got.status.conditions if c.type == "PodScheduled"]
    assert (scheduled.status, scheduled.reason) == ("False", "Unschedulable")
    return f"Unschedulable: {scheduled.message}"


# -- the scheduler


def test_pods_bind_where_they_fit_and_the_rest_are_unschedulable_with_kube_schedulers_message(join, kubectl):
    join("gpu-a")
    join("gpu-b", taints=[GPU_TAINT])
    join("cpu-c", capacity=CPU_SERVER)

    for name in ("train-0", "train-1"):
        kubectl.create_namespaced_pod("default", pod(name, gpus=8))

    assert placement(kubectl, "train-0") == "gpu-a"
    assert placement(kubectl, "train-1") == ("Unschedulable: 0/3 nodes are available: 1 node(s) had untolerated taint "
                                             "{nvidia.com/gpu: true}, 2 Insufficient nvidia.com/gpu.")


def test_with_no_nodes_a_pod_is_unschedulable_and_the_oldest_pending_pod_gets_the_first_free_room(tenant, join, kubectl):
    for name in ("first", "second", "third"):
        kubectl.create_namespaced_pod("default", pod(name, gpus=4))
        time.sleep(0.01)
    assert placement(kubectl, "second") == "Unschedulable: no nodes available to schedule pods"

    join("gpu-a", capacity={**GPU_SERVER, "nvidia.com/gpu": "8"})

    assert [placement(kubectl, n) for n in ("first", "second")] == ["gpu-a", "gpu-a"]
    assert placement(kubectl, "third") == "Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    kubectl.delete_namespaced_pod("first", "default")  # its GPUs are free again
    assert placement(kubectl, "third") == "gpu-a"


def test_node_selector_and_required_affinity_pick_the_node_with_the_labels(join, kubectl):
    join("gpu-a", labels={"workload": "gpu", "zone": "r1"})
    join("gpu-b", labels={"workload": "gpu-auto", "zone": "r2"})

    kubectl.create_namespaced_pod("default", pod("by-selector", gpus=1, selector={"workload": "gpu-auto"}))
    kubectl.create_namespaced_pod("default", pod("by-affinity", gpus=1, affinity=[
        {"key": "zone", "operator": "In", "values": ["r1"]}]))
    kubectl.create_namespaced_pod("default", pod("nowhere", gpus=1, selector={"workload": "inference"}))

    assert placement(kubectl, "by-selector") == "gpu-b"
    assert placement(kubectl, "by-affinity") == "gpu-a"
    assert placement(kubectl, "nowhere") == ("Unschedulable: 0/2 nodes are available: 2 node(s) didn't match Pod's "
                                             "node affinity/selector.")


def test_a_tainted_node_takes_only_pods_that_tolerate_its_taint(join, kubectl):
    join("gpu-t", taints=[GPU_TAINT])

    kubectl.create_namespaced_pod("default", pod("plain", gpus=1))
    kubectl.create_namespaced_pod("default", pod("tolerant", gpus=1, tolerations=[
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]))

    assert placement(kubectl, "plain") == ("Unschedulable: 0/1 nodes are available: 1 node(s) had untolerated taint "
                                           "{nvidia.com/gpu: true}.")
    assert placement(kubectl, "tolerant") == "gpu-t"


def test_a_cordoned_or_not_ready_node_gets_nothing_until_it_is_schedulable_and_ready(tenant, join, kubectl):
    join("gpu-cordoned")
    join("gpu-joining", ready=False)
    kubectl.patch_node("gpu-cordoned", {"spec": {"unschedulable": True}})

    kubectl.create_namespaced_pod("default", pod("waits", gpus=8))

    assert placement(kubectl, "waits") == ("Unschedulable: 0/2 nodes are available: 1 node(s) had untolerated taint "
                                           "{node.kubernetes.io/not-ready: }, 1 node(s) were unschedulable.")
    tenant.kubelet_stop("gpu-joining")  # Ready=Unknown: still nothing
    assert "{node.kubernetes.io/unreachable: }" in placement(kubectl, "waits")
    kubectl.patch_node("gpu-cordoned", {"spec": {"unschedulable": None}})
    assert placement(kubectl, "waits") == "gpu-cordoned"


def test_a_node_joining_binds_a_pending_pod_and_a_watcher_sees_each_verdict(join, kubectl):
    kubectl.create_namespaced_pod("default", pod("train-0", gpus=8))
    since = kubectl.list_namespaced_pod("default").metadata.resource_version
    seen, stream = [], watch.Watch()

    def follow():
        for event in stream.stream(kubectl.list_namespaced_pod, "default", resource_version=since, timeout_seconds=10):
            conditions = event["raw_object"]["status"].get("conditions") or [{}]
            seen.append((event["type"], event["raw_object"]["spec"].get("nodeName"), conditions[0].get("message")))
            if event["raw_object"]["spec"].get("nodeName"):
                stream.stop()
    watcher = threading.Thread(target=follow)
    watcher.start()
    time.sleep(0.3)

    join("gpu-a", capacity=CPU_SERVER)  # no GPUs: each new verdict (a new message) is an event, no binding
    join("gpu-b")
    watcher.join(10)

    *waiting, bound = seen
    assert bound[:2] == ("MODIFIED", "gpu-b") and placement(kubectl, "train-0") == "gpu-b"
    assert ("MODIFIED", None, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.") in waiting
    assert all(kind == "MODIFIED" and node is None for kind, node, _ in waiting)
    messages = [message for _, _, message in waiting]
    assert all(a != b for a, b in itertools.pairwise(messages))  # a pass that decides nothing new writes nothing


def test_a_lab_servers_node_reports_its_hardware_and_a_dynamic_pools_node_starts_empty(tenant, kubectl):
    site = LabSite(hosts=8)
    assert [h.role for h in site.hosts.values()].count("gpu") == 6  # tenant one's gpu pool and 4 for tenant two
    gpu, cpu = site.hosts["gpu-01"], site.hosts["cpu-01"]
    assert gpu.allocatable() == {"cpu": "192", "memory": "2097152Mi", "pods": "110", "nvidia.com/gpu": "8"}
    assert "nvidia.com/gpu" not in cpu.allocatable()
    console = TenantAPI(tenant.kubeconfig(), timeout=5)

    kubelet_join(tenant.endpoint, console.create_bootstrap_token().token, "gpu-01", capacity=gpu.allocatable(),
                 sample_pods=False)

    node = kubectl.read_node("gpu-01")
    assert node.status.allocatable["nvidia.com/gpu"] == "8" and node.status.capacity["cpu"] == "192"
    assert [p.metadata.name for p in kubectl.list_pod_for_all_namespaces().items] == ["kube-proxy-gpu-01"]


# -- the Job controller


def job(name, pods, gpus=8):
    template = pod("x", gpus=gpus)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "template": {"metadata": {"labels": {"app": name}},
                                                       "spec": {**template["spec"], "restartPolicy": "Never"}}}}


def job_pods(kubectl, name, live=True):
    pods = kubectl.list_namespaced_pod("default", label_selector=f"job-name={name}").items
    return sorted((p for p in pods if not (live and p.metadata.deletion_timestamp)), key=lambda p: p.metadata.name)


def test_the_official_client_discovers_batch_v1_jobs(api):
    assert "batch" in [g.name for g in client.ApisApi(api).get_api_versions().groups]
    assert {r.name: r.kind for r in client.BatchV1Api(api).get_api_resources().resources}["jobs"] == "Job"


def test_a_job_keeps_its_pods_running_and_replaces_an_evicted_one(join, kubectl, batch):
    join("gpu-a")
    join("gpu-b")
    created = batch.create_namespaced_job("default", job("train-7", 3))

    pods = job_pods(kubectl, "train-7")
    assert len(pods) == 3
    for p in pods:
        assert p.metadata.name.startswith("train-7-") and p.metadata.labels["app"] == "train-7"
        (owner,) = p.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == ("Job", "train-7", created.metadata.uid, True)
        assert p.spec.containers[0].resources.requests == {"nvidia.com/gpu": "8"}
    assert sorted(placement(kubectl, p.metadata.name) for p in pods) == [
        "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", "gpu-a", "gpu-b"]
    assert batch.read_namespaced_job("train-7", "default").status.active == 3

    evicted = next(p for p in pods if p.spec.node_name == "gpu-a")
    kubectl.create_namespaced_pod_eviction(evicted.metadata.name, "default", client.V1Eviction(
        metadata=client.V1ObjectMeta(name=evicted.metadata.name, namespace="default")))

    now = job_pods(kubectl, "train-7")
    assert len(now) == 3 and evicted.metadata.name not in [p.metadata.name for p in now]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(p.spec.node_name == "gpu-a" for p in job_pods(kubectl, "train-7")):
        time.sleep(0.05)  # the evicted pod terminates; then the oldest Pending pod takes its GPUs
    assert sorted(p.spec.node_name or "-" for p in job_pods(kubectl, "train-7")) == ["-", "gpu-a", "gpu-b"]


def test_deleting_a_job_deletes_its_pods(join, kubectl, batch):
    join("gpu-a")
    batch.create_namespaced_job("default", job("train-7", 2))
    batch.create_namespaced_job("default", job("other", 1, gpus=0))

    batch.delete_namespaced_job("train-7", "default", propagation_policy="Background")

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and job_pods(kubectl, "train-7", live=False):
        time.sleep(0.05)
    assert job_pods(kubectl, "train-7", live=False) == []
    assert len(job_pods(kubectl, "other")) == 1
    assert [j.metadata.name for j in batch.list_namespaced_job("default").items] == ["other"]


# -- the whole loop in the lab: a dynamic pool's claim becomes a node that takes the Pending pod


@pytest.mark.django_db(transaction=True)
def test_a_dynamic_pools_server_joins_with_its_gpus_and_no_sample_pods_and_takes_the_pending_pod(
        lab_factory, celery_worker_process, apply):
    from django.core.management import call_command
    from django.db import transaction

    from claims.choices import ClaimPhase
    from claims.models import NodeClaim
    from claims.reconcile import claims_create
    from conftest import DEMO, wait_for
    from pools.models import NodePool

    from .lab_conftest import wait_hosts

    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["two"])
    apply((DEMO / "tenant-two.yaml").read_text(), tenant="two")
    wait_hosts("available", 1)
    call_command("workload", "submit", "--tenant", "two", "--name", "train-7", "--gpus", "8", stdout=io.StringIO())
    kubectl = client.CoreV1Api(config.new_client_from_config_dict(
        yaml.safe_load(site.tenants["two"].kubeconfig()), persist_config=False))
    (waiting,) = kubectl.list_namespaced_pod("default", label_selector="job-name=train-7").items
    assert placement(kubectl, waiting.metadata.name) == "Unschedulable: no nodes available to schedule pods"

    with transaction.atomic():  # what a decision does for that pod
        (claim,) = claims_create(pool=NodePool.objects.get(name="gpu-auto"), count=1, actor="system:test")
    wait_for(lambda: NodeClaim.objects.get(pk=claim.pk).phase == ClaimPhase.AVAILABLE, timeout=180)

    node = kubectl.read_node("gpu-01")
    assert node.status.allocatable == {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110"}
    assert node.metadata.labels["workload"] == "gpu-auto"
    assert placement(kubectl, waiting.metadata.name) == "gpu-01"
    on_node = kubectl.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-01").items
    assert sorted(p.metadata.name for p in on_node) == sorted(["kube-proxy-gpu-01", waiting.metadata.name])
