"""Fixtures of the Auto Nodes page, API and browser tests: tenant `two` with a dynamic GPU pool, and the rows the
watcher, the decision and the disruption write (PendingPod, TenantWatch, NodeUsage, claims, decision Events),
made here directly in the shapes autonodes/models.py describes. Load with
`pytest_plugins = ["tests.console_conftest", "tests.autonodes_conftest"]`."""
from datetime import timedelta

import pytest
from django.utils import timezone

from autonodes.choices import DecisionReason, DemandStatus, WatchState
from autonodes.live import demand_changed
from autonodes.models import NodeUsage, PendingPod, TenantWatch
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.choices import EventKind, ObjectType
from events.services import event_record
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import NodePool, NodeType, Tenant

TWO_AUTO_YAML = """privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      static:
        - name: cpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: cpu-server
      dynamic:
        - name: train
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          limits:
            nodes: "4"
            nvidia.com/gpu: "32"
          disruption:
            consolidationPolicy: WhenEmpty
            consolidateAfter: 10m
            budgets:
              - nodes: "0"
                schedule: "0 * * * *"
                duration: 1h
              - nodes: "1"
              - nodes: "5"
                schedule: "0 0 1 1 *"
                duration: 1m
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
"""


# The dynamic pool burst (metal3, gpu-server and cpu-server) of a tenant, up to `nodes` nodes: BURST.format(nodes=4).
BURST = """\
privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      dynamic:
        - name: burst
          nodeTypeSelector:
            - property: vcluster.com/node-type
              operator: In
              values: [gpu-server, cpu-server]
          limits:
            nodes: "{nodes}"
"""


@pytest.fixture
def auto_site(users, apply):
    """Tenant two with its static cpu pool and a dynamic pool `train` (gpu-server, up to 4 nodes / 32 GPUs)."""
    apply(TWO_AUTO_YAML, tenant="two")
    Tenant.objects.filter(name="two").update(quota_nodes=None)
    return {"two": Tenant.objects.get(name="two"), "train": NodePool.objects.get(tenant__name="two", name="train"),
            "users": users}


def watch(tenant: Tenant, state: str = WatchState.WATCHING, **fields) -> TenantWatch:
    row, _ = TenantWatch.objects.update_or_create(tenant=tenant, defaults={"state": state, **fields})
    return row


def backing_off(tenant: Tenant) -> TenantWatch:
    return watch(tenant, WatchState.BACKING_OFF, error="tenant API https://10.9.0.2:6443: connection refused",
                 failures=3, retry_at=timezone.now() + timedelta(seconds=40))


def pending(tenant: Tenant, name: str, *, pool=None, status=DemandStatus.NEW, claim=None, reason: str = "",
            gpus: int = 8, namespace: str = "ml", owner: str = "Job/train-7") -> PendingPod:
    return PendingPod.objects.create(
        tenant=tenant, namespace=namespace, name=name, uid=f"uid-{namespace}-{name}", owner=owner,
        requests={"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": str(gpus)}, status=status, pool=pool, claim=claim,
        reason=reason, decided_at=None if status == DemandStatus.NEW else timezone.now())




def claim(pool: NodePool, name: str, *, phase: str = ClaimPhase.AVAILABLE, host: str | None = None,
          step: str = "", age: timedelta = timedelta(minutes=30)) -> NodeClaim:
    """A claim of the pool on the named host (the host made Provisioned, or Provisioning at `step`)."""
    gpu = NodeType.objects.get(name="gpu-server")
    row = NodeClaim.objects.create(name=name, tenant=pool.tenant, pool=pool, pool_name=pool.name,
                                   provider=pool.provider, node_type=gpu, phase=phase, message="")
    fields = {}
    if host:
        bmh = BareMetalHost.objects.get(name=host)
        state = HostState.PROVISIONING if phase in (ClaimPhase.PROVISIONING, ClaimPhase.JOINING) else \
            HostState.PROVISIONED
        flow = {"name": "provision", "step": step, "step_started_at": timezone.now().isoformat(), "state_since": "",
                "done": {}, "data": {}} if step else {}
        BareMetalHost.objects.filter(pk=bmh.pk).update(state=state, flow=flow)
        fields.update(host=bmh, host_name=bmh.name)
        if phase == ClaimPhase.AVAILABLE:
            fields.update(node_name=bmh.name, available_at=timezone.now() - age)
    fields["created_at"] = timezone.now() - age - timedelta(minutes=12)
    NodeClaim.objects.filter(pk=row.pk).update(**fields)
    row.refresh_from_db()
    return row


def usage(claim_row: NodeClaim, *, pods: int = 0, empty_since=None, next_action: str = "", next_action_at=None,
          do_not_disrupt: bool = False) -> NodeUsage:
    row, _ = NodeUsage.objects.update_or_create(claim=claim_row, defaults={
        "pods": pods, "requested": {"nvidia.com/gpu": str(8 * min(pods, 1))}, "empty_since": empty_since,
        "next_action": next_action, "next_action_at": next_action_at, "do_not_disrupt": do_not_disrupt,
        "checked_at": timezone.now()})
    demand_changed(tenant_id=claim_row.tenant_id, pool_ids=[claim_row.pool_id])
    return row


def decision(pool: NodePool, message: str, *, reason: str = DecisionReason.LAUNCHED, pods=(), claims=()):
    return event_record(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=pool.name,
                        tenant_id=pool.tenant_id, actor="system:autonodes", message=message,
                        data={"reason": str(reason), "pool": pool.name, "pods": list(pods), "claims": list(claims),
                              "node_type": "gpu-server"})


def tenant_decision(tenant: Tenant, message: str, *, pods=()):
    """What the decision records when no pool matches a pod: a decision about the tenant (reason NoPool)."""
    return event_record(kind=EventKind.DECISION, object_type=ObjectType.TENANT, object_name=tenant.name,
                        tenant_id=tenant.pk, actor="system:autonodes", message=message,
                        data={"reason": DecisionReason.NO_POOL.value, "pool": None, "pods": list(pods), "claims": []})


@pytest.fixture
def auto_rows(auto_site):
    """A dynamic pool mid-way through a job: two nodes Ready (one running pods, one empty and due for release),
    one being installed, pods waiting, provisioning, ready and unservable, three decisions."""
    two, train = auto_site["two"], auto_site["train"]
    watch(two, connected_at=timezone.now() - timedelta(minutes=5))
    busy = claim(train, "two-busy1", host="gpu-01")
    empty = claim(train, "two-empty1", host="gpu-02")
    installing = claim(train, "two-inst1", phase=ClaimPhase.PROVISIONING, host="gpu-03", step="write_image",
                       age=timedelta(minutes=3))
    usage(busy, pods=1, next_action="kept: 1 pod runs on it")
    released_at = timezone.now() + timedelta(minutes=10)
    usage(empty, pods=0, empty_since=timezone.now() - timedelta(minutes=2),
          next_action="empty since 12:03, released at 12:13 unless a pod arrives", next_action_at=released_at)
    pods = {
        "provisioning": pending(two, "train-7-0", pool=train, status=DemandStatus.LAUNCHED, claim=installing),
        "ready": pending(two, "train-7-1", pool=train, status=DemandStatus.LAUNCHED, claim=empty),
        "waiting": pending(two, "train-7-2", pool=train, status=DemandStatus.WAITING,
                           reason="not added: limit nvidia.com/gpu 32 reached"),
        "unservable": pending(two, "huge-0", status=DemandStatus.UNSERVABLE, gpus=16, owner="Job/huge",
                              reason="no NodeType fits pod ml/huge-0: asks 16 nvidia.com/gpu, largest type has 8"),
    }
    decisions = [
        decision(train, "added 1 gpu-server for Job/train-7: 1 pod × 8 nvidia.com/gpu", pods=["ml/train-7-0"],
                 claims=["two-inst1"]),
        decision(train, "not added: limit nvidia.com/gpu 32 reached", reason=DecisionReason.LIMIT,
                 pods=["ml/train-7-2"]),
        decision(train, "no NodeType fits pod ml/huge-0: asks 16 nvidia.com/gpu, largest type has 8",
                 reason=DecisionReason.NO_NODE_TYPE, pods=["ml/huge-0"]),
    ]
    return {**auto_site, "claims": {"busy": busy, "empty": empty, "installing": installing}, "pods": pods,
            "decisions": decisions, "released_at": released_at}
