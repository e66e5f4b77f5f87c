"""A dynamic pool's claim has a launch deadline from its NodeType's measured p95; past it, it is reported once
and kept (never deleted and relaunched: bare metal would loop)."""
import time
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from autonodes.choices import DecisionReason, DemandStatus
from autonodes.launches import launches_check
from autonodes.models import PendingPod
from autonodes.services import tenant_decide
from claims.stats import percentile
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.selectors import launch_deadlines
from claims.reconcile import claims_create
from conftest import DEMO, wait_for
from events.choices import EventKind
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodePool, NodeType

DYNAMIC = """\
privateNodes:
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      dynamic:
        - name: gpu-auto
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          limits:
            nodes: "4"
"""
MIN = 60


@pytest.fixture
def site(apply):
    """The demo's catalogue without hosts (a claim waits for one), and tenant two with a dynamic GPU pool."""
    apply((DEMO / "site.yaml").read_text())
    apply(DYNAMIC, tenant="two")
    return NodePool.objects.get(name="gpu-auto")


def launched(pool: NodePool, node_type: str, minutes: list[float], *, ago_h: float = 1.0) -> None:
    """Claims of `node_type` that reached Available after `minutes` each, the last one `ago_h` hours ago
    (each earlier one an hour before the next)."""
    now = timezone.now()
    for i, m in enumerate(reversed(minutes)):
        available = now - timedelta(hours=ago_h + i)
        claim = NodeClaim.objects.create(name=f"done-{node_type}-{ago_h}-{i}", tenant=pool.tenant, pool=pool,
                                         pool_name=pool.name, provider=pool.provider,
                                         node_type=NodeType.objects.get(name=node_type), phase=ClaimPhase.RELEASED)
        NodeClaim.objects.filter(pk=claim.pk).update(created_at=available - timedelta(minutes=m),
                                                     available_at=available, released_at=available)


def age(claim: NodeClaim, minutes: float) -> None:
    """Make a claim `minutes` old, its deadline moved with its creation."""
    claim.refresh_from_db()
    shift = timezone.now() - timedelta(minutes=minutes) - claim.created_at
    NodeClaim.objects.filter(pk=claim.pk).update(created_at=F("created_at") + shift,
                                                 launch_deadline_at=F("launch_deadline_at") + shift)


def slow_events(claim: NodeClaim):
    return Event.objects.filter(kind=EventKind.DECISION, data__reason=DecisionReason.SLOW, data__claims=[claim.name])


@pytest.mark.django_db
def test_a_type_with_no_launch_measured_gets_the_cap_and_says_why(site, settings):
    settings.AUTONODES_LAUNCH_CAP_S = 3600
    gpu = NodeType.objects.get(name="gpu-server")
    launched(site, "cpu-server", [3])  # another type's history says nothing about this one
    NodeClaim.objects.create(name="never-ready", tenant=site.tenant, pool=site, pool_name=site.name,
                             provider=site.provider, node_type=gpu, phase=ClaimPhase.FAILED)
    deadline = launch_deadlines([gpu])[gpu.pk]
    assert (deadline.seconds, deadline.p95_s, deadline.samples) == (3600, None, 0)
    assert deadline.why == "no gpu-server launch measured yet: the cap, 60 min"


@pytest.mark.django_db
def test_the_deadline_is_the_p95_of_the_last_50_launches_of_the_type_within_floor_and_cap(site, settings):
    settings.AUTONODES_LAUNCH_FLOOR_S, settings.AUTONODES_LAUNCH_CAP_S = 600, 3600
    recent = [10 + (i % 17) for i in range(50)]  # 10 to 26 min
    launched(site, "gpu-server", [240] * 10, ago_h=100)  # older than the last 50: not counted
    launched(site, "gpu-server", recent)
    launched(site, "cpu-server", [2, 3, 4])  # fast: the floor
    gpu, cpu = NodeType.objects.get(name="gpu-server"), NodeType.objects.get(name="cpu-server")
    deadlines = launch_deadlines([gpu, cpu])
    expected = percentile([m * MIN for m in recent], 95)
    assert expected == 25 * MIN
    assert (deadlines[gpu.pk].seconds, deadlines[gpu.pk].p95_s, deadlines[gpu.pk].samples) == \
        (pytest.approx(expected), pytest.approx(expected), 50)
    assert deadlines[gpu.pk].why == "p95 of the last 50 gpu-server launches: 25 min; deadline 25 min"
    assert (deadlines[cpu.pk].seconds, deadlines[cpu.pk].samples) == (600, 3)
    assert deadlines[cpu.pk].why.endswith("deadline 10 min (the floor)")

    settings.AUTONODES_LAUNCH_CAP_S = 1200
    assert launch_deadlines([gpu])[gpu.pk].seconds == 1200
    assert launch_deadlines([gpu])[gpu.pk].why.endswith("deadline 20 min (the cap)")


@pytest.mark.django_db
def test_a_dynamic_pools_new_claim_expects_to_be_ready_by_its_types_p95(site, settings):
    settings.AUTONODES_LAUNCH_FLOOR_S, settings.AUTONODES_LAUNCH_CAP_S = 600, 3600
    launched(site, "gpu-server", [12] * 10)
    claims = claims_create(pool=site, count=2, node_type=NodeType.objects.get(name="gpu-server"), actor="user:test")
    for claim in claims:
        # now + the p95 at creation (created_at is stamped a moment apart)
        assert abs(claim.launch_deadline_at - claim.created_at - timedelta(minutes=12)) < timedelta(seconds=1)
        assert claim.launch_reported_at is None


@pytest.mark.django_db
def test_a_slow_claim_is_reported_with_its_step_host_and_the_usual_p95_once_and_kept(site, settings):
    settings.AUTONODES_LAUNCH_FLOOR_S, settings.AUTONODES_LAUNCH_CAP_S = 600, 3600
    gpu = NodeType.objects.get(name="gpu-server")
    launched(site, "gpu-server", [12] * 10)
    slow, on_time, failed = claims_create(pool=site, count=3, node_type=gpu, actor="user:test")
    host = BareMetalHost.objects.create(name="gpu-03", bmc_address="redfish://10.0.0.3/redfish/v1/Systems/1",
                                        boot_mac="52:54:00:00:00:03", labels={"role": "gpu"}, state="provisioning",
                                        flow={"name": "provision", "step": "write_image"})
    NodeClaim.objects.filter(pk=slow.pk).update(phase=ClaimPhase.PROVISIONING, host=host, host_name=host.name)
    NodeClaim.objects.filter(pk=failed.pk).update(phase=ClaimPhase.FAILED)
    age(slow, 19)
    age(on_time, 11)
    age(failed, 30)

    assert launches_check() == [slow.name]
    assert launches_check() == []  # once

    claim_event = slow_events(slow).get(object_type="claim")
    pool_event = slow_events(slow).get(object_type="pool")
    assert claim_event.message == ("gpu-server usually ready in 12 min (p95); this one has taken 19 min, at step "
                                   "write_image on gpu-03. Not relaunched: its pods keep waiting for it")
    assert (claim_event.claim_id, claim_event.tenant_id, claim_event.host_id) == (slow.pk, site.tenant_id, host.pk)
    assert (pool_event.object_name, pool_event.tenant_id, pool_event.claim_id) == ("gpu-auto", site.tenant_id, None)
    assert pool_event.message == f"claim {slow.name}: {claim_event.message}"
    assert pool_event.data.items() >= {"pool": "gpu-auto", "node_type": "gpu-server", "host": "gpu-03",
                                       "step": "write_image", "p95_s": 720.0, "deadline_s": 720.0,
                                       "samples": 10}.items()
    slow.refresh_from_db()
    assert slow.phase == ClaimPhase.PROVISIONING and slow.host_id == host.pk and slow.launch_reported_at
    assert not slow_events(on_time).exists() and not slow_events(failed).exists()

    age(on_time, 13)  # now it is late too: reported on its own
    assert launches_check() == [on_time.name]
    assert "this one has taken 13 min, still waiting for a host. Not relaunched" in slow_events(on_time).get(object_type="claim").message
    assert NodeClaim.objects.filter(pool=site).exclude(phase=ClaimPhase.RELEASED).count() == 3  # none added


@pytest.mark.django_db(transaction=True)
def test_the_beat_reports_a_slow_claim_once_and_neither_releases_it_nor_launches_another_for_its_pods(
        site, worker_settings, celery_worker_process, settings):
    """The launch check runs on beat in a real worker (every second here, against a 2 s deadline: the cap, as no
    gpu-server launch is measured). The claim waits for a host that does not exist; its pods stay with it."""
    worker_settings.update(WITH_BEAT="1", AUTONODES_LAUNCH_CHECK_EVERY_S="0.5", AUTONODES_LAUNCH_FLOOR_S="1",
                           AUTONODES_LAUNCH_CAP_S="2", RECONCILE_EVERY_S="1")
    celery_worker_process.kill()
    celery_worker_process.start()
    # The claim is made here with a deadline an hour off, so that the worker's reconcile has said why it waits
    # before the beat's check can find it late, however slow the machine; then its deadline is now.
    settings.AUTONODES_LAUNCH_FLOOR_S, settings.AUTONODES_LAUNCH_CAP_S = 1, 3600
    (claim,) = claims_create(pool=site, count=1, node_type=NodeType.objects.get(name="gpu-server"), actor="user:test")
    pods = [PendingPod.objects.create(tenant=site.tenant, namespace="ml", name=f"train-7-{i}", uid=f"uid-{i}",
                                      owner="Job/train-7", requests={"nvidia.com/gpu": "8"},
                                      status=DemandStatus.LAUNCHED, claim=claim, pool=site) for i in range(3)]
    wait_for(lambda: "no free host" in NodeClaim.objects.get(pk=claim.pk).message, timeout=30)
    NodeClaim.objects.filter(pk=claim.pk).update(launch_deadline_at=timezone.now())

    wait_for(lambda: slow_events(claim).count() == 2, timeout=30)
    event = slow_events(claim).get(object_type="claim")
    assert event.message.startswith("gpu-server has no launch measured yet (allowed 2 s, the cap); this one has taken")
    assert "still waiting for a host (no free host of type gpu-server: 0 of 0 available)" in event.message
    time.sleep(3)  # several more passes of the check (and of the reconciler)
    assert slow_events(claim).count() == 2
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.PENDING
    assert list(NodeClaim.objects.filter(pool=site).values_list("name", flat=True)) == [claim.name]
    # A decision on the same demand keeps the pods on their slow claim: nothing launched a second time.
    decision = tenant_decide(tenant_id=site.tenant_id)
    assert decision.launched == {}
    assert list(NodeClaim.objects.filter(pool=site).values_list("name", flat=True)) == [claim.name]
    for pod in pods:
        pod.refresh_from_db()
        assert (pod.status, pod.claim_id) == (DemandStatus.LAUNCHED, claim.pk)
