"""Auto Nodes on an external provider, end to end: a tenant's dynamic pool on a kubeVirt NodeProvider (the lab's
KubeVirt cluster, simulated guests). A Job's Pending pods are seen by the pod watcher (`manage.py watch-pods`), one
decision in a real Celery worker creates the claims of the pool's NodeType, the worker's beat gives each a
VirtualMachine (machines.services.claims_fill) whose guest joins the tenant; the claims go Available with their
machines recorded and the pods run there. The Job deleted, the empty nodes are given back and the VMs deleted."""
import pytest
from django.core.management import call_command

from autonodes.choices import WatchState
from autonodes.models import TenantWatch
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from lab.kube import TenantAPIServer
from lab.kubevirt import KubeVirtCluster
from machines.choices import MachineState
from machines.models import Machine
from pools.models import Tenant
from pools.services import tenant_set_api

from .autonodes_lab_conftest import running
from .test_providers_e2e import KUBEVIRT_SITE, with_cluster

pytest_plugins = ["tests.autonodes_lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

# "Add 2-CPU VMs when pods are Pending, up to 3", given back 2 s after they are empty.
POOL = """\
privateNodes:
  autoNodes:
    - provider: kubevirt
      properties:
        vcluster.com/os-image: ubuntu-vm
      dynamic:
        - name: vm-auto
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: vm-small
          limits:
            nodes: "3"
          disruption:
            consolidationPolicy: WhenEmpty
            consolidateAfter: 2s
            minNodeLifetime: 0s
"""


@pytest.fixture
def worker_settings() -> dict:
    return {"WITH_BEAT": "1", "MACHINES_RECONCILE_EVERY_S": "1", "AUTONODES_DISRUPT_EVERY_S": "1",
            "AUTONODES_DECIDE_EVERY_S": "5", "NODE_READY_POLL_S": "1", "DRAIN_DEADLINE_S": "20",
            "DRAIN_GRACE_S": "1", "DRAIN_POLL_S": "1"}


@pytest.fixture
def tenant_api():
    with TenantAPIServer("alpha") as server:
        yield server


@pytest.fixture
def cluster():
    with KubeVirtCluster("kv-lab") as kubevirt:
        yield kubevirt


def report() -> str:
    return "\n".join([f"claim {c.name}: {c.phase} {c.node_type} {c.reason} {c.message}" for c in NodeClaim.objects.all()]
                     + [f"machine {m.name}: {m.state} {m.message}" for m in Machine.objects.all()])


def test_pending_pods_get_kubevirt_vms_that_join_and_go_once_the_job_is_deleted(
        apply, tenant_api, cluster, celery_worker_process, watcher):
    apply(with_cluster(KUBEVIRT_SITE, "kv-lab", cluster.kubeconfig(), "0" * 64))
    apply(POOL, tenant="alpha")
    tenant_set_api(tenant=Tenant.objects.get(name="alpha"), api_endpoint=tenant_api.endpoint,
                   kubeconfig=tenant_api.kubeconfig(), actor="user:test")
    watcher()
    wait_for(lambda: TenantWatch.objects.filter(tenant__name="alpha", state=WatchState.WATCHING).exists(), timeout=30)

    # Two pods of 1.5 CPU: one per 2-CPU VM.
    call_command("workload", "submit", "--tenant", "alpha", "--name", "web", "--pods", "2", "--cpu", "1500m",
                 "--memory", "1Gi")
    try:
        wait_for(lambda: NodeClaim.objects.filter(pool_name="vm-auto", phase=ClaimPhase.AVAILABLE).count() == 2,
                 timeout=120)
        pods = wait_for(lambda: (lambda p: p if len(p) == 2 else None)(running(
            [p for p in tenant_api.objects("pods") if (p["metadata"].get("labels") or {}).get("job-name") == "web"])),
            timeout=60)
    except AssertionError:
        raise AssertionError(f"the pods did not get their VMs\n{report()}") from None
    claims = list(NodeClaim.objects.filter(pool_name="vm-auto").select_related("node_type"))
    assert len(claims) == 2 and {c.node_type.name for c in claims} == {"vm-small"}
    machines = Machine.objects.filter(claim__in=claims)
    assert {(m.kind, m.state, m.node_type.name) for m in machines} == {("kubeVirt", MachineState.RUNNING, "vm-small")}
    assert {p["spec"]["nodeName"] for p in pods} == {c.node_name for c in claims}
    assert len(cluster.vms("vms")) == 2

    call_command("workload", "delete", "--tenant", "alpha", "--name", "web")
    try:
        wait_for(lambda: NodeClaim.objects.filter(pool_name="vm-auto", phase=ClaimPhase.RELEASED).count() == 2,
                 timeout=120)
    except AssertionError:
        raise AssertionError(f"the empty VMs were not given back\n{report()}") from None
    assert set(Machine.objects.values_list("state", flat=True)) == {MachineState.GONE}
    assert not cluster.vms("vms")
