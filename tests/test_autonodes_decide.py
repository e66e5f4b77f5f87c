"""tenant_decide: a tenant's Pending pods become claims of its dynamic pools, each decision an Event; limits, quota
and unservable pods are reported once; two decisions never launch for the same pods; a claim that fails gives its
pods back to the demand and they are decided again (by a real Celery worker)."""
import threading
import uuid

import pytest
from django.db import connection

from autonodes.choices import DecisionReason, DemandStatus, WatchState
from autonodes.models import PendingPod, TenantWatch
from autonodes.services import tenant_decide
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.phases import claims_release, claims_transition
from conftest import wait_for
from events.choices import EventKind
from events.models import Event
from pools.models import NodePool, Tenant

pytestmark = pytest.mark.postgres

DYNAMIC = """\
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
          nodeLabels:
            pool: burst
          limits:
            nodes: "4"
"""


@pytest.fixture
def two(apply, demo_site):
    """Tenant two with the dynamic pool burst (up to 4 nodes of gpu-server or cpu-server): the demo's 4 GPU and
    4 CPU hosts are free."""
    apply(DYNAMIC, tenant="two")
    return Tenant.objects.get(name="two")


def pending(tenant, name, owner="Job/train-7", namespace="ml", **spec):
    requests = spec.pop("requests", {})
    return PendingPod.objects.create(tenant=tenant, namespace=namespace, name=name, uid=str(uuid.uuid4()),
                                     owner=owner, requests=requests, **spec)


def gpu_pods(tenant, n, gpus="8", prefix="train-7"):
    return [pending(tenant, f"{prefix}-{i}", requests={"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": gpus})
            for i in range(n)]


def decisions(tenant, **data):
    events = Event.objects.filter(kind=EventKind.DECISION, tenant_id=tenant.pk).order_by("pk")
    return [e for e in events if all(e.data.get(k) == v for k, v in data.items())]


@pytest.mark.django_db
def test_three_pods_of_eight_gpus_make_three_claims_and_one_event_naming_them(two):
    pods = gpu_pods(two, 3)
    result = tenant_decide(tenant_id=two.pk)
    claims = list(NodeClaim.objects.filter(pool__name="burst").order_by("name"))
    assert len(claims) == 3
    assert {(c.phase, c.node_type.name, c.tenant_id) for c in claims} == {(ClaimPhase.PENDING, "gpu-server", two.pk)}
    assert all({"property": "vcluster.com/node-type", "operator": "In", "values": ["gpu-server"]} in c.requirements
               for c in claims)
    assert sorted(result.launched) == [c.name for c in claims]
    rows = {p.name: p for p in PendingPod.objects.all()}
    assert {p.status for p in rows.values()} == {DemandStatus.LAUNCHED}
    assert len({p.claim_id for p in rows.values()}) == 3  # one pod per 8-GPU node
    assert all(p.pool.name == "burst" and p.decided_at for p in rows.values())
    [event] = decisions(two)
    assert (event.object_type, event.object_name) == ("pool", "burst")
    assert event.message == "added 3 gpu-server for Job/train-7: 3 pods × 8 nvidia.com/gpu"
    assert event.data["reason"] == DecisionReason.LAUNCHED
    assert event.data["node_type"] == "gpu-server"
    assert event.data["pods"] == sorted(f"ml/{p.name}" for p in pods)
    assert sorted(event.data["claims"]) == [c.name for c in claims]

    # The same demand again: nothing new.
    again = tenant_decide(tenant_id=two.pk)
    assert not again.launched and NodeClaim.objects.count() == 3 and len(decisions(two)) == 1
    assert {p.claim_id for p in PendingPod.objects.all()} == {p.claim_id for p in rows.values()}


@pytest.mark.django_db
def test_six_pods_of_eight_gpus_make_four_claims_and_two_wait_on_the_limit_reported_once(two):
    gpu_pods(two, 6)
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.filter(pool__name="burst").count() == 4
    waiting = PendingPod.objects.filter(status=DemandStatus.WAITING)
    assert waiting.count() == 2
    assert {(p.reason, p.pool.name, p.claim_id) for p in waiting} == {("not added: limit nodes 4 reached", "burst", None)}
    [limit] = decisions(two, reason=DecisionReason.LIMIT)
    assert limit.data["pods"] == sorted(f"ml/{p.name}" for p in waiting)
    assert limit.message.startswith("not added: limit nodes 4 reached (2 pods: ml/train-7-")
    # Decided again (the beat's sweep): still waiting, not reported again, nothing launched.
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.count() == 4 and len(decisions(two)) == 2
    # The limit raised: now the 4 GPU hosts are what is missing (each promised to a claim), and the pods say so.
    pool = NodePool.objects.get(name="burst")
    pool.limits = {"nodes": "8"}
    pool.save()
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.count() == 4
    assert {p.reason for p in PendingPod.objects.filter(status=DemandStatus.WAITING)} == {
        "not added: no free host of type gpu-server"}
    [capacity] = decisions(two, reason=DecisionReason.NO_CAPACITY)
    assert len(capacity.data["pods"]) == 2


@pytest.mark.django_db
def test_hosts_held_for_a_static_pools_kept_data_are_not_counted_as_free(two, apply, seed_block):
    from datetime import timedelta

    from django.utils import timezone

    from hosts.models import BareMetalHost

    apply(seed_block, tenant="one")
    static = NodePool.objects.get(tenant__name="one", name="gpu")
    gpu_hosts = BareMetalHost.objects.filter(name__startswith="gpu-")
    held = list(gpu_hosts.order_by("name").values_list("pk", flat=True)[:3])
    BareMetalHost.objects.filter(pk__in=held).update(kept_for_pool=static,
                                                     kept_until=timezone.now() + timedelta(hours=1))
    gpu_pods(two, 2)
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.filter(pool__name="burst").count() == 1  # one GPU host is free, three are held
    assert {p.reason for p in PendingPod.objects.filter(status=DemandStatus.WAITING)} == {
        "not added: no free host of type gpu-server"}


@pytest.mark.django_db
def test_a_cpu_pod_gets_a_cpu_server_not_a_gpu_server(two):
    gpu_pods(two, 1)
    pending(two, "web-0", owner="Deployment/web", requests={"cpu": "8", "memory": "16Gi"})
    tenant_decide(tenant_id=two.pk)
    assert PendingPod.objects.get(name="web-0").claim.node_type.name == "cpu-server"
    assert PendingPod.objects.get(name="train-7-0").claim.node_type.name == "gpu-server"
    [cpu] = decisions(two, node_type="cpu-server")
    assert cpu.message == "added 1 cpu-server for Deployment/web: 1 pod × 8 cpu, 16Gi memory"


@pytest.mark.django_db
def test_pods_that_fit_a_claim_in_flight_launch_nothing_more(two):
    gpu_pods(two, 1, gpus="4", prefix="half")
    tenant_decide(tenant_id=two.pk)
    [claim] = NodeClaim.objects.all()
    more = gpu_pods(two, 1, gpus="4", prefix="other")
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.count() == 1
    more[0].refresh_from_db()
    assert (more[0].status, more[0].claim_id) == (DemandStatus.LAUNCHED, claim.pk)
    assert more[0].reason == f"fits on claim {claim.name}: waits for its node, on its way (Pending)"


@pytest.mark.django_db
def test_the_tenant_quota_counts_static_pools_and_live_dynamic_claims(two):
    Tenant.objects.filter(pk=two.pk).update(quota_nodes=2)
    gpu_pods(two, 3)
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.count() == 2
    [waiting] = PendingPod.objects.filter(status=DemandStatus.WAITING)
    assert waiting.reason == "not added: the tenant's node quota is reached"
    assert decisions(two, reason=DecisionReason.QUOTA)


@pytest.mark.django_db
def test_an_unservable_pod_is_reported_once_and_decided_again_when_a_pool_changes(two, apply):
    pending(two, "huge", requests={"nvidia.com/gpu": "16"})
    pending(two, "picky", owner="Job/h200", requests={"nvidia.com/gpu": "8"}, node_selector={"accelerator": "h200"})
    tenant_decide(tenant_id=two.pk)
    assert not NodeClaim.objects.exists()
    huge, picky = PendingPod.objects.get(name="huge"), PendingPod.objects.get(name="picky")
    assert (huge.status, huge.reason) == (
        DemandStatus.UNSERVABLE, "no NodeType fits pod ml/huge: asks 16 nvidia.com/gpu, largest type has 8")
    assert (picky.status, picky.reason) == (
        DemandStatus.UNSERVABLE, "no pool matches pod ml/picky: pool burst: nodeSelector accelerator=h200 does not match")
    [no_type] = decisions(two, reason=DecisionReason.NO_NODE_TYPE)
    assert (no_type.object_name, no_type.data["pods"]) == ("burst", ["ml/huge"])
    [no_pool] = decisions(two, reason=DecisionReason.NO_POOL)
    assert (no_pool.object_type, no_pool.object_name, no_pool.data["pods"]) == ("tenant", "two", ["ml/picky"])
    tenant_decide(tenant_id=two.pk)
    assert len(decisions(two)) == 2  # not again
    apply(DYNAMIC.replace("pool: burst", "pool: burst\n            accelerator: h200"), tenant="two")
    tenant_decide(tenant_id=two.pk)
    picky.refresh_from_db()
    assert picky.status == DemandStatus.LAUNCHED and picky.claim.node_type.name == "gpu-server"
    assert PendingPod.objects.get(name="huge").status == DemandStatus.UNSERVABLE
    assert len(decisions(two)) == 3  # the launch; huge's unchanged verdict is not reported again


@pytest.mark.django_db
def test_a_tenant_whose_api_is_down_is_not_decided_for_and_its_pods_say_so(two):
    TenantWatch.objects.create(tenant=two, state=WatchState.BACKING_OFF, error="connection refused")
    gpu_pods(two, 2)
    result = tenant_decide(tenant_id=two.pk)
    assert result.skipped and not NodeClaim.objects.exists() and not decisions(two)
    assert set(PendingPod.objects.values_list("status", "reason")) == {
        (DemandStatus.NEW, "not decided: the tenant's API is unreachable; decisions resume when the watch reconnects")}
    TenantWatch.objects.filter(tenant=two).update(state=WatchState.WATCHING)
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.count() == 2


@pytest.mark.django_db
def test_no_free_host_makes_pods_wait_for_capacity(two):
    from hosts.models import BareMetalHost

    BareMetalHost.objects.filter(labels__role="gpu").exclude(name="gpu-01").update(state="maintenance")
    gpu_pods(two, 2)
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.count() == 1
    [waiting] = PendingPod.objects.filter(status=DemandStatus.WAITING)
    assert waiting.reason == "not added: no free host of type gpu-server"


@pytest.mark.django_db(transaction=True)
def test_two_decisions_at_once_on_one_tenant_never_launch_a_pod_twice(two):
    gpu_pods(two, 3)
    barrier = threading.Barrier(2)
    errors = []

    def decide():
        try:
            barrier.wait()
            tenant_decide(tenant_id=two.pk)
        except Exception as exc:  # noqa: BLE001 (any failure of a thread is asserted below)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=decide) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert NodeClaim.objects.count() == 3
    assert len(decisions(two, reason=DecisionReason.LAUNCHED)) == 1
    assert len(set(PendingPod.objects.values_list("claim_id", flat=True))) == 3


@pytest.mark.django_db
def test_a_claim_that_fails_or_is_released_before_its_node_is_ready_gives_its_pods_back(two):
    gpu_pods(two, 3)
    tenant_decide(tenant_id=two.pk)
    failed, released, kept = (PendingPod.objects.get(name=f"train-7-{i}").claim for i in range(3))
    claims_transition(claims=[failed], to_phase=ClaimPhase.FAILED, actor="test", reason="RetriesExhausted",
                      message="gave up after 3 attempt(s)")
    claims_release(claims=[NodeClaim.objects.get(pk=released.pk)], actor="test", reason="pool shrank")
    pods = {p.name: p for p in PendingPod.objects.all()}
    assert (pods["train-7-0"].status, pods["train-7-0"].claim_id) == (DemandStatus.NEW, None)
    assert pods["train-7-0"].reason == f"its claim {failed.name} failed (gave up after 3 attempt(s)); deciding again"
    assert (pods["train-7-1"].status, pods["train-7-1"].claim_id) == (DemandStatus.NEW, None)
    assert pods["train-7-1"].reason == f"its claim {released.name} was released (pool shrank); deciding again"
    assert (pods["train-7-2"].status, pods["train-7-2"].claim_id) == (DemandStatus.LAUNCHED, kept.pk)
    # Decided again: new claims for the two, the failed claim no longer counts against the limit.
    tenant_decide(tenant_id=two.pk)
    assert NodeClaim.objects.exclude(phase__in=[ClaimPhase.FAILED, ClaimPhase.RELEASED]).count() == 3
    assert set(PendingPod.objects.values_list("status", flat=True)) == {DemandStatus.LAUNCHED}


@pytest.mark.django_db(transaction=True)
def test_a_failed_claim_is_decided_again_by_a_worker(apply, demo_site, celery_worker_process):
    # The pool's OS image is not there yet: its claims wait for it, so no host is provisioned during the test.
    apply(DYNAMIC.replace("ubuntu2404-20260926", "not-uploaded-yet"), tenant="two")
    two = Tenant.objects.get(name="two")
    gpu_pods(two, 2)
    tenant_decide(tenant_id=two.pk)
    pod = PendingPod.objects.get(name="train-7-0")
    claim = pod.claim
    assert pod.status == DemandStatus.LAUNCHED and claim is not None
    claims_transition(claims=[claim], to_phase=ClaimPhase.FAILED, actor="test", reason="RetriesExhausted",
                      message="gave up after 3 attempt(s)")
    # Back to the demand in the failing transaction; the worker's decision gives it a new claim.
    wait_for(lambda: PendingPod.objects.get(name="train-7-0").claim_id not in (None, claim.pk), timeout=30)
    pod.refresh_from_db()
    assert pod.status == DemandStatus.LAUNCHED and pod.claim.phase == ClaimPhase.PENDING
    assert NodeClaim.objects.filter(pool__name="burst").count() == 3  # 2 live, 1 failed
    launches = [e for e in decisions(two, reason=DecisionReason.LAUNCHED) if "ml/train-7-0" in e.data["pods"]]
    assert len(launches) == 2 and launches[1].actor == "system:autonodes"


@pytest.mark.django_db
def test_the_sweep_looks_again_at_waiting_pods_and_new_ones_no_batch_decided(two, settings):
    from datetime import timedelta

    from django.utils import timezone

    from autonodes.services import tenants_to_decide

    three = Tenant.objects.create(name="three")
    fresh = pending(three, "fresh")
    assert tenants_to_decide() == []  # inside its batch window: the watcher's decision comes
    PendingPod.objects.filter(pk=fresh.pk).update(updated_at=timezone.now() - timedelta(seconds=60))
    assert tenants_to_decide() == [three.pk]  # a decision that never came
    gpu_pods(two, 5)
    tenant_decide(tenant_id=two.pk)
    PendingPod.objects.filter(tenant=three).delete()
    assert tenants_to_decide() == [two.pk]  # one waits on the limit


@pytest.mark.django_db
def test_a_pod_still_pending_after_its_node_is_ready_is_decided_again(two):
    from datetime import timedelta

    from django.utils import timezone

    from autonodes.services import tenants_to_decide

    gpu_pods(two, 1)
    tenant_decide(tenant_id=two.pk)
    pod = PendingPod.objects.get()
    first = pod.claim
    # Ready a minute ago: within the grace, the tenant's scheduler may still bind it.
    NodeClaim.objects.filter(pk=first.pk).update(phase=ClaimPhase.AVAILABLE,
                                                 available_at=timezone.now() - timedelta(seconds=60))
    assert tenants_to_decide() == []
    tenant_decide(tenant_id=two.pk)
    assert PendingPod.objects.get().claim_id == first.pk
    # Ready for longer than the grace, and the pod is still Pending: what runs there is not known to fit it.
    long_ago = timezone.now() - timedelta(seconds=600)
    NodeClaim.objects.filter(pk=first.pk).update(available_at=long_ago)
    PendingPod.objects.update(decided_at=long_ago)
    assert tenants_to_decide() == [two.pk]
    tenant_decide(tenant_id=two.pk)
    pod.refresh_from_db()
    assert pod.status == DemandStatus.LAUNCHED and pod.claim_id not in (None, first.pk)


@pytest.mark.django_db
def test_a_pod_whose_ready_node_was_taken_by_another_pod_is_decided_again_without_the_grace(two):
    from datetime import timedelta

    from django.utils import timezone

    from autonodes.models import NodeUsage
    from autonodes.services import tenants_to_decide

    gpu_pods(two, 2)
    NodePool.objects.filter(name="burst").update(limits={"nodes": "1"})
    tenant_decide(tenant_id=two.pk)
    launched = PendingPod.objects.get(status=DemandStatus.LAUNCHED)
    claim = launched.claim
    ready = timezone.now() - timedelta(seconds=10)  # well within the grace
    NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.AVAILABLE, available_at=ready)
    # The scheduler bound the other pod (it was waiting) there: it left the demand; the node's 8 GPUs are in use.
    PendingPod.objects.exclude(pk=launched.pk).delete()
    usage = NodeUsage.objects.create(claim=claim, pods=1, requested={"nvidia.com/gpu": "8"},
                                     checked_at=ready + timedelta(seconds=1))
    assert tenants_to_decide() == []  # read too soon after Ready to tell
    NodeUsage.objects.filter(pk=usage.pk).update(checked_at=timezone.now())
    assert tenants_to_decide() == [two.pk]
    tenant_decide(tenant_id=two.pk)
    launched.refresh_from_db()
    assert (launched.status, launched.claim_id, launched.reason) == (
        DemandStatus.WAITING, None, "not added: limit nodes 1 reached")
    assert NodeClaim.objects.count() == 1

    NodeUsage.objects.filter(pk=usage.pk).update(requested={})  # had it room, it would have stayed on that node
    launched.delete()
    gpu_pods(two, 1, prefix="train-8")
    tenant_decide(tenant_id=two.pk)
    assert PendingPod.objects.get().claim_id == claim.pk


def pod_seen(row: PendingPod, message: str = "", node: str = "") -> dict:
    """The pod of `row` as the tenant's watch shows it: Pending with the scheduler's `message`, or bound to `node`."""
    if node:
        status = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    else:
        status = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable", "message": message}]}
    return {"metadata": {"name": row.name, "namespace": row.namespace, "uid": row.uid},
            "spec": {"containers": [{"name": "c", "resources": {"requests": row.requests}}],
                     **({"nodeName": node} if node else {})},
            "status": status}


NO_ROOM = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 No "
           "preemption victims found for incoming pod.")


@pytest.mark.django_db
def test_a_pod_left_pending_by_the_pool_limit_when_its_node_was_taken_names_the_limit_without_the_grace(two):
    from datetime import timedelta

    from django.utils import timezone

    from autonodes.demand import demand_observe
    from autonodes.models import NodeUsage
    from autonodes.selectors import pod_state

    NodePool.objects.filter(name="burst").update(limits={"nodes": "1"})
    for row in gpu_pods(two, 2):  # as the watcher first saw them
        demand_observe(tenant_id=two.pk, pod=pod_seen(row, "0/0 nodes are available: no nodes available."))
    tenant_decide(tenant_id=two.pk)
    launched = PendingPod.objects.get(status=DemandStatus.LAUNCHED)
    other = PendingPod.objects.get(status=DemandStatus.WAITING)
    claim = launched.claim
    ready = timezone.now() - timedelta(seconds=10)  # well within the bind grace
    NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.AVAILABLE, available_at=ready,
                                                 node_name="two-nqgqf")
    # Its use was read before the scheduler placed anything there: free, as far as the console knows.
    NodeUsage.objects.create(claim=claim, pods=0, requested={}, checked_at=ready + timedelta(seconds=6))
    launched.refresh_from_db()
    assert pod_state(launched).label == "node ready, binding"

    # The scheduler gives the node to the other pod (it was waiting first) and tells this one there is no room.
    assert not demand_observe(tenant_id=two.pk, pod=pod_seen(other, node="two-nqgqf")).is_new_demand
    seen = demand_observe(tenant_id=two.pk, pod=pod_seen(launched, NO_ROOM))
    assert seen.is_new_demand  # the watcher's batch: a decision within seconds
    launched.refresh_from_db()
    state = pod_state(launched)
    assert (state.label, state.detail) == (
        "deciding", f"its node two-nqgqf was given to other pods (the scheduler: {NO_ROOM}); deciding again")

    tenant_decide(tenant_id=two.pk)
    launched.refresh_from_db()
    assert (launched.status, launched.claim_id, launched.reason) == (
        DemandStatus.WAITING, None, "not added: limit nodes 1 reached")
    assert pod_state(launched).detail == "not added: limit nodes 1 reached"
    assert NodeClaim.objects.count() == 1


@pytest.mark.django_db
def test_a_scheduler_message_naming_a_taint_or_read_just_after_ready_keeps_the_pod_on_its_node(two):
    from datetime import timedelta

    from django.utils import timezone

    from autonodes.demand import demand_observe
    from autonodes.services import tenants_to_decide

    [row] = gpu_pods(two, 1)
    demand_observe(tenant_id=two.pk, pod=pod_seen(row, "0/0 nodes are available: no nodes available."))
    tenant_decide(tenant_id=two.pk)
    row.refresh_from_db()
    claim = row.claim
    NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.AVAILABLE,
                                                 available_at=timezone.now() - timedelta(seconds=2))
    # Just after Ready: the message may be of before the node (the watch's latency).
    assert not demand_observe(tenant_id=two.pk, pod=pod_seen(row, NO_ROOM)).is_new_demand
    NodeClaim.objects.filter(pk=claim.pk).update(available_at=timezone.now() - timedelta(seconds=10))
    # A Ready node still tainted not-ready: the message cannot tell which node; it is not room.
    taint = "0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }."
    assert not demand_observe(tenant_id=two.pk, pod=pod_seen(row, taint)).is_new_demand
    row.refresh_from_db()
    assert (row.status, row.claim_id) == (DemandStatus.LAUNCHED, claim.pk)
    assert tenants_to_decide() == []
    tenant_decide(tenant_id=two.pk)
    row.refresh_from_db()
    assert (row.status, row.claim_id) == (DemandStatus.LAUNCHED, claim.pk)
