"""`manage.py workload` submits, lists and deletes a tenant's Job in its own Kubernetes API (the lab's here, through
the official client as on a real cluster), and the demo gives tenant two the dynamic pool that answers it."""
import io

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from kubernetes import client, config

from claims.tenant_api import TenantAPI
from lab.kube import TenantAPIServer, kubelet_join
from pools.models import NodePool, Tenant
from pools.services import tenant_set_api

pytestmark = pytest.mark.django_db


@pytest.fixture
def server():
    with TenantAPIServer("two", termination_s=0.1) as api:
        yield api


@pytest.fixture
def two(server):
    return tenant_set_api(tenant=Tenant(name="two"), api_endpoint=server.endpoint, kubeconfig=server.kubeconfig(),
                          actor="system:test")


@pytest.fixture
def kubectl(server):
    api = config.new_client_from_config_dict(yaml.safe_load(server.kubeconfig()), persist_config=False)
    yield client.CoreV1Api(api), client.BatchV1Api(api)
    api.close()


def workload(*args) -> str:
    out = io.StringIO()
    call_command("workload", *args, stdout=out, stderr=out)
    return out.getvalue()


def refused(*args) -> str:
    with pytest.raises(CommandError) as caught:
        workload(*args)
    return str(caught.value)


def test_submit_creates_a_job_whose_pods_are_unschedulable_while_the_tenant_has_no_nodes(two, kubectl):
    core, batch = kubectl

    printed = workload("submit", "--tenant", "two", "--name", "train-7", "--pods", "3", "--gpus", "8",
                       "--cpu", "4", "--memory", "16Gi")

    assert "job default/train-7 submitted to tenant two: 3 pod(s), each asking for 4 cpu, 16Gi memory, " \
           "8 nvidia.com/gpu" in printed
    job = batch.read_namespaced_job("train-7", "default")
    assert job.spec.parallelism == 3 and job.spec.template.spec.restart_policy == "Never"
    (rule,) = job.spec.pod_failure_policy.rules  # a pod evicted by consolidation does not fail the Job
    assert (rule.action, rule.on_pod_conditions[0].type) == ("Ignore", "DisruptionTarget")
    pods = core.list_namespaced_pod("default", label_selector="job-name=train-7").items
    assert len(pods) == 3
    for pod in pods:
        resources = pod.spec.containers[0].resources
        assert resources.requests == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}
        assert resources.limits == {"nvidia.com/gpu": "8"}  # extended resources: limits too, as the API requires
        (scheduled,) = pod.status.conditions
        assert (scheduled.type, scheduled.status, scheduled.reason) == ("PodScheduled", "False", "Unschedulable")

    listed = workload("list", "--tenant", "two")

    assert "job default/train-7: 3 pod(s): 0 running, 3 pending" in listed
    assert listed.count("Pending: no nodes available to schedule pods") == 3


def test_list_shows_each_pods_node_or_the_schedulers_message(two, server, kubectl):
    workload("submit", "--tenant", "two", "--name", "train-7", "--pods", "3", "--gpus", "8")
    token = TenantAPI(server.kubeconfig()).create_bootstrap_token().token
    kubelet_join(server.endpoint, token, "gpu-01", capacity={"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8"},
                 sample_pods=False)

    listed = workload("list", "--tenant", "two")

    assert "job default/train-7: 3 pod(s): 1 running, 2 pending" in listed
    assert listed.count("Running on gpu-01") == 1
    assert listed.count("Pending: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.") == 2


def test_selectors_tolerations_and_do_not_disrupt_reach_the_pods(two, kubectl):
    core, _ = kubectl

    workload("submit", "--tenant", "two", "--name", "pinned", "--gpus", "1", "--node-selector", "workload=gpu-auto",
             "--toleration", "nvidia.com/gpu=true:NoSchedule", "--toleration", "dedicated", "--do-not-disrupt")

    (pod,) = core.list_namespaced_pod("default", label_selector="job-name=pinned").items
    assert pod.spec.node_selector == {"workload": "gpu-auto"}
    assert [(t.key, t.operator, t.value, t.effect) for t in pod.spec.tolerations] == [
        ("nvidia.com/gpu", "Equal", "true", "NoSchedule"), ("dedicated", "Exists", None, None)]
    assert pod.metadata.annotations == {"karpenter.sh/do-not-disrupt": "true"}


def test_delete_removes_the_job_and_its_pods_and_a_second_delete_says_not_found(two, kubectl):
    core, batch = kubectl
    workload("submit", "--tenant", "two", "--name", "train-7", "--pods", "2", "--gpus", "8")

    assert "job default/train-7 deleted from tenant two" in workload("delete", "--tenant", "two", "--name", "train-7")

    assert batch.list_namespaced_job("default").items == []
    assert all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod("default").items)
    assert "no jobs in tenant two" in workload("list", "--tenant", "two")
    assert refused("delete", "--tenant", "two", "--name", "train-7") == "tenant two: job default/train-7 not found"


def test_a_job_name_in_use_is_refused(two):
    workload("submit", "--tenant", "two", "--name", "train-7", "--gpus", "8")
    assert refused("submit", "--tenant", "two", "--name", "train-7", "--gpus", "8") == (
        "tenant two: job default/train-7 already exists (delete it first)")


@pytest.mark.parametrize(("flags", "says"), [
    (["--pods", "0"], "--pods 0: at least 1"),
    (["--gpus", "-1"], "--gpus -1: 0 or more"),
    (["--memory", "lots"], "--memory 'lots': not a positive quantity"),
    (["--node-selector", "workload"], "--node-selector 'workload': expected KEY=VALUE"),
    (["--node-selector", "bad key=x"], "--node-selector 'bad key=x'"),
    (["--toleration", "nvidia.com/gpu:Sometimes"], "the effect must be one of NoSchedule, PreferNoSchedule, NoExecute"),
    (["--name", "Train_7"], "--name 'Train_7': lower-case letters"),
])
def test_bad_flags_are_refused_before_anything_is_sent(two, kubectl, flags, says):
    args = ["submit", "--tenant", "two", "--name", "train-7", "--gpus", "8"] + flags
    assert says in refused(*args)
    assert kubectl[1].list_namespaced_job("default").items == []


def test_an_unknown_tenant_or_one_without_an_api_is_refused():
    assert refused("list", "--tenant", "nobody") == "tenant 'nobody' not found"
    Tenant.objects.create(name="three")
    assert "tenant three has no Kubernetes API registered" in refused("submit", "--tenant", "three", "--name", "x")


def test_an_unreachable_tenant_api_is_said_plainly_and_no_credential_is_printed(two, server):
    server.stop()

    said = refused("submit", "--tenant", "two", "--name", "train-7", "--gpus", "8")

    assert said.startswith(f"tenant two: tenant API unreachable: {server.url}")
    assert server.token not in said and "token" not in said.lower()


def test_the_demo_gives_tenant_two_a_dynamic_gpu_pool_that_survives_export_and_apply(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("demo", "--no-hosts", stdout=io.StringIO())

    pool = NodePool.objects.get(tenant__name="two", name="gpu-auto")
    assert (pool.kind, pool.quantity, pool.provider.name) == ("dynamic", None, "metal3")
    assert pool.node_type_selector == [{"property": "vcluster.com/node-type", "value": "gpu-server"}]
    assert pool.limits == {"nodes": "4", "nvidia.com/gpu": "32"}
    assert pool.disruption == {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "2m", "minNodeLifetime": "2m",
                               "budgets": [{"nodes": "100%"}]}
    out = io.StringIO()
    call_command("export", stdout=out)
    exported = out.getvalue()
    assert "name: gpu-auto" in exported
    NodePool.objects.all().delete()
    Tenant.objects.all().delete()
    path = tmp_path / "export.yaml"
    path.write_text(exported)
    call_command("apply", "-f", str(path), stdout=io.StringIO())
    again = io.StringIO()
    call_command("export", stdout=again)
    assert again.getvalue() == exported
