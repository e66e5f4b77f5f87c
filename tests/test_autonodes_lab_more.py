"""Auto Nodes' remaining acceptance, end to end in the lab (PostgreSQL, a real Celery worker with beat, the lab's
servers, its tenant API with the scheduler and Job controller, `manage.py watch-pods`, Jobs through the official
kubernetes client): a pool's node limit, underutilized consolidation, a tenant API outage in the middle of a
decision, and a claim that fails."""
import time
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from autonodes.choices import DecisionReason, DemandStatus, WatchState
from autonodes.models import PendingPod, TenantWatch
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodePool

from .autonodes_lab_conftest import dynamic_pool, job_pods, node_names, running
from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest", "tests.autonodes_lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

LIMIT_REASON = "not added: limit nodes 4 reached"


@pytest.fixture
def worker_settings() -> dict:
    # The beat's disruption pass every second; its sweep of the demand every 3 s, looking again at pods not decided
    # 2 s after they were seen (as while their tenant's API is down). A claim whose server found the tenant's API
    # unreachable (claims.tenant_check) is tried again after 10 s, not 5 minutes.
    return {"WITH_BEAT": "1", "AUTONODES_DISRUPT_EVERY_S": "1", "AUTONODES_DECIDE_EVERY_S": "3",
            "AUTONODES_SWEEP_NEW_AFTER_S": "2", "TENANT_API_RETRY_S": "10"}


def watching(tenant: str = "two") -> bool:
    return TenantWatch.objects.filter(tenant__name=tenant, state=WatchState.WATCHING).exists()


def launched_claims() -> list[str]:
    return sorted(c for e in Event.objects.filter(kind="decision", data__reason=DecisionReason.LAUNCHED)
                  for c in e.data["claims"])


def admin() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root-admin", "root@example.com", "x" * 20))
    return client


def moment(rfc3339: str) -> datetime:
    return datetime.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def test_six_pods_on_a_pool_limited_to_4_nodes_get_4_servers_and_2_wait_with_the_limit_said(
        lab_factory, celery_worker_process, watcher, apply):
    site = lab_factory(hosts=4, gpu_hosts=4, tenants=["two"])
    wait_hosts("available", 4)
    apply(dynamic_pool(nodes=4), tenant="two")
    watcher()
    wait_for(watching, timeout=30)

    call_command("workload", "submit", "--tenant", "two", "--name", "train-8", "--pods", "6", "--gpus", "8")
    try:
        wait_for(lambda: NodeClaim.objects.filter(pool_name="gpu-auto").count() == 4, timeout=60)
        wait_for(lambda: NodeClaim.objects.filter(pool_name="gpu-auto", phase=ClaimPhase.AVAILABLE).count() == 4,
                 timeout=240)
        wait_for(lambda: len(running(job_pods(site, "two", "train-8"))) == 4, timeout=60)
        wait_for(lambda: sorted(PendingPod.objects.values_list("status", "reason")) ==
                 [(DemandStatus.WAITING, LIMIT_REASON)] * 2, timeout=30)
    except AssertionError:
        demand = "\n".join(f"pod {p}: {p.status} {p.claim_id} {p.reason}" for p in PendingPod.objects.all())
        raise AssertionError(f"the job did not get 4 servers and 2 waiting pods\n{demand}\n{lab_report()}") from None

    claims = list(NodeClaim.objects.filter(pool_name="gpu-auto"))
    pods = job_pods(site, "two", "train-8")
    pending = sorted(f"default/{p['metadata']['name']}" for p in pods if not p["spec"].get("nodeName"))
    assert len(pods) == 6 and len(pending) == 2
    assert {p["spec"]["nodeName"] for p in running(pods)} == {c.node_name for c in claims}  # one pod per server
    assert sorted(str(p) for p in PendingPod.objects.all()) == pending
    assert BareMetalHost.objects.filter(state="provisioned").count() == 4

    # One launch of 4; the limit said for the pods it leaves out, once per change of answer, not at every sweep.
    (decision,) = Event.objects.filter(kind="decision", data__reason=DecisionReason.LAUNCHED)
    assert sorted(decision.data["claims"]) == sorted(c.name for c in claims)
    limited = Event.objects.filter(kind="decision", data__reason=DecisionReason.LIMIT)
    assert limited.exists() and set(pending) <= {p for e in limited for p in e.data["pods"]}
    assert all(LIMIT_REASON in e.message for e in limited)
    reported = limited.count()
    time.sleep(7)  # two sweeps of the waiting pods: still 4 claims, no new report
    assert NodeClaim.objects.count() == 4 and limited.count() == reported

    # What the tenant reads: the API and the pool page.
    client = admin()
    pool = NodePool.objects.get(name="gpu-auto")
    body = client.get(f"/api/v1/pools/{pool.pk}/status/").json()
    assert {(p["pod"], p["state"], p["reason"]) for p in body["demand"]} == {
        (key, "waiting", LIMIT_REASON) for key in pending}
    assert {(lim["resource"], lim["used"], lim["limit"]) for lim in body["limits"]} == {("nodes", 4.0, 4.0)}
    assert sorted(n["claim"] for n in body["nodes"]) == sorted(c.name for c in claims)
    assert all(n["pods"] == 1 for n in body["nodes"])
    html = client.get("/tenants/two/pools/gpu-auto/").content.decode()
    assert LIMIT_REASON in html and all(key.split("/")[1] in html for key in pending)


def test_an_underutilized_node_is_released_its_pod_moves_to_the_other_before_the_erase_ends(
        lab_factory, celery_worker_process, watcher, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["two"])
    wait_hosts("available", 2)
    apply(dynamic_pool(nodes=2, policy="WhenEmptyOrUnderutilized", after="2s"), tenant="two")
    watcher()
    wait_for(watching, timeout=30)

    # A Job of 2 pods × 4 GPUs on two servers: a 4-GPU filler gets the first server, the Job's first pod takes the
    # rest of it and its second pod a server of its own; then the filler goes, leaving each server half used.
    call_command("workload", "submit", "--tenant", "two", "--name", "filler", "--pods", "1", "--gpus", "4")
    try:
        wait_for(lambda: len(running(job_pods(site, "two", "filler"))) == 1, timeout=180)
        call_command("workload", "submit", "--tenant", "two", "--name", "train", "--pods", "2", "--gpus", "4")
        wait_for(lambda: len(running(job_pods(site, "two", "train"))) == 2, timeout=180)
    except AssertionError:
        raise AssertionError(f"the jobs did not get their servers\n{lab_report()}") from None
    first, second = NodeClaim.objects.filter(pool_name="gpu-auto").order_by("created_at")
    assert {p["spec"]["nodeName"] for p in job_pods(site, "two", "train")} == {first.node_name, second.node_name}
    assert not Event.objects.filter(kind="decision", data__reason=DecisionReason.UNDERUTILIZED).exists()

    call_command("workload", "delete", "--tenant", "two", "--name", "filler")
    try:
        decision = wait_for(lambda: Event.objects.filter(
            kind="decision", data__reason=DecisionReason.UNDERUTILIZED).first(), timeout=30)
        (name,) = decision.data["claims"]
        released = NodeClaim.objects.get(name=name)
        kept = second if released == first else first
        # The drain evicts its pod; the Job controller makes a new one; the scheduler puts it on the other server.
        wait_for(lambda: [p["spec"]["nodeName"] for p in running(job_pods(site, "two", "train"))]
                 == [kept.node_name] * 2, timeout=60)
        host = BareMetalHost.objects.get(name=released.host_name)
        rebound = datetime.now(UTC)
        seen = host.state
        wait_for(lambda: NodeClaim.objects.get(pk=released.pk).phase == ClaimPhase.RELEASED, timeout=120)
        wait_hosts("available", 1)
    except AssertionError:
        raise AssertionError(f"the underutilized node was not given back\n{lab_report()}") from None

    (moved,) = decision.data["moves"].items()
    assert moved[1] == kept.node_name and moved[0].startswith("default/train-")
    assert decision.message.startswith(f"released {released.name}: underutilized, its 1 pod(s) fit on "
                                       f"{kept.node_name}")
    assert site.tenants["two"].evictions() and all(p.startswith("default/train-")
                                                   for p, _ in site.tenants["two"].evictions())
    # Order: the pod ran on the kept server before the released one's erase ended (and while it was not back).
    assert seen != "available"
    erased = Event.objects.filter(host=host, kind="step", step="verify_erase", message="done",
                                  data__flow="deprovision").order_by("created_at").last()
    assert erased is not None and rebound < erased.created_at, lab_report()
    newest = max(moment(p["status"]["startTime"]) for p in running(job_pods(site, "two", "train")))
    assert newest <= erased.created_at.replace(microsecond=0)
    host.refresh_from_db()
    assert host.state == "available" and site.read_disk(host.name, 0, 16) != b"VMETAL-LAB-IMAGE"  # purged, gate passed
    assert released.node_name not in node_names(site, "two") and kept.node_name in node_names(site, "two")
    assert NodeClaim.objects.get(pk=kept.pk).phase == ClaimPhase.AVAILABLE
    assert NodeClaim.objects.count() == 2  # the moved pod needed no new server


@pytest.mark.parametrize("when", ["in the batch window", "with the claims in flight"])
def test_the_tenant_api_going_down_mid_decision_launches_once_loses_no_claim_and_resumes(
        when, lab_factory, celery_worker_process, watcher, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["two"])
    wait_hosts("available", 2)
    apply(dynamic_pool(nodes=4), tenant="two")
    api = site.tenants["two"]
    # The batch stays open 5 s after the last pod: the outage begins inside it (the watch fails within a second or
    # two of the stop), so its decision finds the tenant's API away.
    watcher(AUTONODES_WATCH_BACKOFF_MAX_S="2", AUTONODES_BATCH_IDLE_S="5")
    wait_for(watching, timeout=30)

    call_command("workload", "submit", "--tenant", "two", "--name", "train-9", "--pods", "2", "--gpus", "8")
    wait_for(lambda: PendingPod.objects.count() == 2, timeout=20)
    if when == "with the claims in flight":  # decided; the servers are being installed when the API goes
        wait_for(lambda: NodeClaim.objects.count() == 2, timeout=30)
    api.stop()
    try:
        down = wait_for(lambda: TenantWatch.objects.filter(tenant__name="two",
                                                           state=WatchState.BACKING_OFF).first(), timeout=20)
        assert down.error.startswith("tenant API unreachable") and api.token not in down.error
        # While it is down (sweeps of the demand every 3 s): it keeps backing off, nothing is launched again.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert NodeClaim.objects.count() == (0 if when == "in the batch window" else 2)
            time.sleep(0.2)
        watch = TenantWatch.objects.get(tenant__name="two")
        assert watch.state == WatchState.BACKING_OFF and watch.failures >= 2
        if when == "in the batch window":  # the batch's decision and the sweeps left the pods undecided, saying why
            assert all("the tenant's API is unreachable" in p.reason for p in PendingPod.objects.all())
    finally:
        api.start(keep_objects=True)  # the same port and objects: an outage, not a new cluster
    back = Event.objects.order_by("-pk").values_list("pk", flat=True).first()

    try:
        wait_for(watching, timeout=30)
        wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=240)
        wait_for(lambda: len(running(job_pods(site, "two", "train-9"))) == 2, timeout=60)
        wait_for(lambda: not PendingPod.objects.exists(), timeout=20)
    except AssertionError:
        raise AssertionError(f"the decisions did not resume\n{lab_report()}") from None
    claims = sorted(NodeClaim.objects.values_list("name", flat=True))
    assert len(claims) == 2 and launched_claims() == claims  # launched once; each launched claim served
    (launch,) = Event.objects.filter(kind="decision", data__reason=DecisionReason.LAUNCHED)
    assert (launch.pk > back) == (when == "in the batch window")  # decided once the watch was back, or before
    assert {p["spec"]["nodeName"] for p in job_pods(site, "two", "train-9")} == set(
        NodeClaim.objects.values_list("node_name", flat=True))
    assert not NodeClaim.objects.filter(phase=ClaimPhase.FAILED).exists()
    assert TenantWatch.objects.get(tenant__name="two").failures == 0


@pytest.fixture
def image_blamed_at_once(worker_settings):
    worker_settings["IMAGE_FAILURE_HOSTS"] = "1"  # one failed write blames the image (its checksum), not the host


def test_a_claim_that_fails_gives_its_pod_back_to_the_demand_and_a_new_claim_serves_it(
        image_blamed_at_once, lab_factory, celery_worker_process, watcher, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["two"])
    wait_hosts("available", 2)
    apply(site.manifests().replace(site.images[0].sha256, "f" * 64))  # the OSImage's checksum is wrong
    apply(dynamic_pool(nodes=4), tenant="two")
    watcher()
    wait_for(watching, timeout=30)

    call_command("workload", "submit", "--tenant", "two", "--name", "train-3", "--pods", "1", "--gpus", "8")
    try:
        failed = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.FAILED).first(), timeout=180)
        assert failed.reason == "ImageFailed" and "checksum mismatch" in failed.message
        # Its pod is demand again, and the next decision launches a new claim for it.
        again = wait_for(lambda: NodeClaim.objects.exclude(pk=failed.pk).first(), timeout=30)
    except AssertionError:
        raise AssertionError(f"the failed claim's pod was not decided again\n{lab_report()}") from None
    (pod,) = PendingPod.objects.all()
    wait_for(lambda: PendingPod.objects.filter(pk=pod.pk, status=DemandStatus.LAUNCHED, claim=again).exists(),
             timeout=10)
    first, second = Event.objects.filter(kind="decision", data__reason=DecisionReason.LAUNCHED).order_by("pk")
    assert first.data["claims"] == [failed.name] and second.data["claims"] == [again.name]
    assert first.data["pods"] == second.data["pods"] == [str(pod)]

    apply(site.manifests())  # the checksum fixed: the new claim gets a server, the pod runs there
    try:
        wait_for(lambda: NodeClaim.objects.filter(pk=again.pk, phase=ClaimPhase.AVAILABLE).exists(), timeout=240)
        wait_for(lambda: [p["spec"]["nodeName"] for p in running(job_pods(site, "two", "train-3"))]
                 == [NodeClaim.objects.get(pk=again.pk).node_name], timeout=60)
        wait_for(lambda: not PendingPod.objects.exists(), timeout=20)
    except AssertionError:
        raise AssertionError(f"the new claim did not serve the pod\n{lab_report()}") from None
    assert NodeClaim.objects.count() == 2 and launched_claims() == sorted([failed.name, again.name])
