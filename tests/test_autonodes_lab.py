"""Auto Nodes' acceptance, end to end in the lab: a Job's Pending pods seen by the pod watcher (`manage.py
watch-pods`), one decision in a real Celery worker, bare-metal servers installed and joined, the pods bound by the
tenant's scheduler; the Job deleted, the empty nodes released by the beat's disruption pass, drained, erased and
back in the pool. PostgreSQL, the tenant API through the official kubernetes client (`manage.py workload`)."""
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command

from autonodes.choices import DecisionReason, WatchState
from autonodes.models import PendingPod, TenantWatch
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.selectors import launch_deadlines
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost

from .autonodes_lab_conftest import dynamic_pool, job_pods, node_names
from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest", "tests.autonodes_lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

# "Add GPU servers when training jobs are Pending, up to 4", and give them back 2 s after they are empty.
POOL = dynamic_pool(nodes=4, policy="WhenEmpty", after="2s")


@pytest.fixture
def worker_settings() -> dict:
    return {"WITH_BEAT": "1", "AUTONODES_DISRUPT_EVERY_S": "1", "AUTONODES_DECIDE_EVERY_S": "5"}


def test_a_job_of_3_pods_x_8_gpus_gets_3_servers_and_gives_them_back_erased_once_deleted(
        lab_factory, celery_worker_process, watcher, apply):
    site = lab_factory(hosts=3, gpu_hosts=3, tenants=["two"])
    wait_hosts("available", 3)
    apply(POOL, tenant="two")
    watcher()
    wait_for(lambda: TenantWatch.objects.filter(tenant__name="two", state=WatchState.WATCHING).exists(), timeout=30)

    call_command("workload", "submit", "--tenant", "two", "--name", "train-7", "--pods", "3", "--gpus", "8")
    try:
        wait_for(lambda: NodeClaim.objects.filter(pool_name="gpu-auto").count() == 3, timeout=60)
        wait_for(lambda: NodeClaim.objects.filter(pool_name="gpu-auto", phase=ClaimPhase.AVAILABLE).count() == 3,
                 timeout=180)
        wait_for(lambda: len(job_pods(site, "two", "train-7")) == 3 and all(
            p["spec"].get("nodeName") and p["status"].get("phase") == "Running"
            for p in job_pods(site, "two", "train-7")), timeout=60)
    except AssertionError:
        raise AssertionError(f"the job did not get its servers\n{lab_report()}") from None

    # One decision, for the three pods, naming the three claims; one pod per 8-GPU server.
    claims = list(NodeClaim.objects.filter(pool_name="gpu-auto").order_by("name"))
    (decision,) = Event.objects.filter(kind="decision", data__reason=DecisionReason.LAUNCHED)
    assert sorted(decision.data["claims"]) == [c.name for c in claims]
    assert len(decision.data["pods"]) == 3 and all(p.startswith("default/train-7-") for p in decision.data["pods"])
    assert decision.message == "added 3 gpu-server for Job/train-7: 3 pods × 8 nvidia.com/gpu"
    assert {c.node_type.name for c in claims} == {"gpu-server"}
    assert len({p["spec"]["nodeName"] for p in job_pods(site, "two", "train-7")}) == 3
    assert {p["spec"]["nodeName"] for p in job_pods(site, "two", "train-7")} == {c.node_name for c in claims}
    wait_for(lambda: not PendingPod.objects.filter(tenant__name="two").exists(), timeout=15)  # bound: demand gone
    hosts = {c.host_name for c in claims}

    call_command("workload", "delete", "--tenant", "two", "--name", "train-7")
    try:
        wait_for(lambda: NodeClaim.objects.filter(pool_name="gpu-auto", phase=ClaimPhase.RELEASED).count() == 3,
                 timeout=240)
        wait_hosts("available", 3)
    except AssertionError:
        raise AssertionError(f"the empty nodes were not given back\n{lab_report()}") from None
    released = Event.objects.filter(kind="decision", data__reason=DecisionReason.EMPTY)
    assert sorted(c for e in released for c in e.data["claims"]) == [c.name for c in claims]
    assert not node_names(site, "two") & {c.node_name for c in claims}  # drained and deleted from the tenant
    for host in hosts:  # erased by the release gate (the lab image began with this marker)
        assert site.read_disk(host, 0, 16) != b"VMETAL-LAB-IMAGE"  # purged: content indeterminate
    assert set(BareMetalHost.objects.values_list("state", flat=True)) == {"available"}

    # Launch deadlines: with no gpu-server launch measured, these claims had the cap; none was reported slow.
    # Their three launches are now the type's history: the next claim's deadline is their p95, held at the floor.
    cap = timedelta(seconds=settings.AUTONODES_LAUNCH_CAP_S)
    # (The deadline is set on insert, from the clock read just before created_at's: within a second of it.)
    assert all(abs(c.launch_deadline_at - c.created_at - cap) < timedelta(seconds=1) and c.launch_reported_at is None
               for c in claims), [(c.created_at, c.launch_deadline_at, c.launch_reported_at) for c in claims]
    assert not Event.objects.filter(data__reason=DecisionReason.SLOW).exists()
    deadline = launch_deadlines([claims[0].node_type])[claims[0].node_type_id]
    assert deadline.samples == 3 and deadline.p95_s < settings.AUTONODES_LAUNCH_FLOOR_S
    assert deadline.seconds == settings.AUTONODES_LAUNCH_FLOOR_S
