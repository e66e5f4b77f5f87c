"""Health tiers per NodeType (issue 15.2): `handover` on every provision (a failure sends the host to repair and
gives the claim another host at once), `release` between tenants, `intake` after the first inspection and after
repair (a burn-in), `idle` on a beat tick (pre-empted by a claim within seconds); each HealthCheckRun tagged
with its tier; the timing page shows each tier's duration; the manifest's `health:` block validated."""
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from claims.charts import tier_timings
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import DEMO, wait_for
from events.models import Event
from hosts import services
from hosts.models import BareMetalHost, HealthCheckRun
from hosts.tasks import idle_checks_start
from manifests.export import export_text
from pools.health_tiers import node_type_tiers
from pools.models import NodePool, NodeType
from pools.services import pool_set_quantity

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
MiB = 1024 * 1024
DISK = 96 * MiB


def site_with(health_yaml: str) -> str:
    """demo/site.yaml with `health:` under gpu-server (indented as its other fields)."""
    text = (DEMO / "site.yaml").read_text()
    block = "".join(f"        {line}\n" for line in health_yaml.strip("\n").splitlines())
    return text.replace("        displayName: 8x H200 GPU server\n",
                        "        displayName: 8x H200 GPU server\n        health:\n" + block, 1)


def tiers_of(host: BareMetalHost, flow_id: str | None = None) -> dict[tuple[str, str], str]:
    runs = HealthCheckRun.objects.filter(host=host, **({"flow_id": flow_id} if flow_id else {}))
    return {(r.tier, r.suite): r.verdict for r in runs}


def to_repair(name: str) -> Event:
    return Event.objects.filter(host__name=name, kind="transition", to_state="repair").latest("id")


# --- the manifest ----------------------------------------------------------------------------------------

GOOD = """\
  handover: {}
  release: {dcgmLevel: 2, ncclMinBusbwGBps: 420, budget: 15m}
  intake: {dcgmLevel: 4, burnIn: 2h, budget: 4h}
  idle: {interval: 12h, hostsAtOnce: 3}
"""


@pytest.mark.django_db
def test_the_tiers_are_applied_exported_as_written_and_filled_with_their_defaults(apply, demo_site):
    gpu = NodeType.objects.get(name="gpu-server")
    assert list(node_type_tiers(gpu)) == ["release"]  # today's behaviour: the one release gate
    assert node_type_tiers(gpu)["release"]["dcgmLevel"] == gpu.health_dcgm_level
    apply(site_with(GOOD))
    gpu.refresh_from_db()
    tiers = node_type_tiers(gpu)
    assert list(tiers) == ["handover", "release", "intake", "idle"]
    assert (tiers["handover"]["dcgmLevel"], tiers["handover"]["gpus"], tiers["handover"]["budget_s"]) == (1, True, 300)
    assert (tiers["release"]["ncclMinBusbwGBps"], tiers["intake"]["burnIn_s"], tiers["idle"]["interval_s"]) == (
        420, 7200, 43200)
    assert "burnIn: 2h" in export_text()
    assert "nodetype/gpu-server unchanged" in apply(site_with(GOOD))


@pytest.mark.django_db
def test_the_release_tier_fails_its_next_check_once_past_its_budget(apply, demo_site):
    """health.release.budget (15m by default) covers the gate's GPU checks together, timed from the first: a gate
    whose checks started 16 minutes ago fails at its next check, to repair, before asking the agent anything."""
    from hosts.engine.flow import Run
    from hosts.engine.flow import StepFailed
    from hosts.flows.steps import step_gpu_reset, step_health_dcgm, step_health_nccl
    from hosts.gate import cleaning

    host = BareMetalHost.objects.get(name="gpu-01")
    gate = cleaning.gate_for(host)
    assert (gate["health"]["budget"], gate["health"]["budget_s"]) == ("15m", 900)
    gate["previous"] = None
    gate["health"]["nccl_min_busbw_gbps"] = 400.0  # the demo's gpu-server sets none: NCCL would be skipped
    for step in (step_gpu_reset, step_health_dcgm, step_health_nccl):
        started = (timezone.now() - timedelta(minutes=16)).isoformat()
        host.flow = {"name": "release", "step": step.__name__, "data": {"gate": {
            **gate, "health": {**gate["health"], "started_at": started}}}}
        host.save(update_fields=["flow"])
        with pytest.raises(StepFailed) as failed:
            step(Run(host))
        assert failed.value.repair and failed.value.message.startswith(
            "the release health check ran past its budget of 15m (9"), failed.value.message
        assert failed.value.evidence["tier"] == "release"


@pytest.mark.django_db
@pytest.mark.parametrize("bad, where, message", [
    ("  handover: {dcgmLevel: 5}\n", "health.handover.dcgmLevel", "dcgmi diag levels here are 0 (not run) to 4"),
    ("  intake: {dcgmLevel: 2}\n", "health.intake.dcgmLevel", "3 or 4"),
    ("  intake: {burnIn: forever}\n", "health.intake.burnIn", "'forever' is not a duration"),
    ("  idle: {interval: 0s}\n", "health.idle.interval", "must be longer than 0s"),
    ("  idle: {hostsAtOnce: 0}\n", "health.idle.hostsAtOnce", "must be a whole number, 1 or more"),
    ("  handover: {links: yes please}\n", "health.handover.links", "must be true or false"),
    ("  release: {ncclMinBusbwGBps: -1}\n", "health.release.ncclMinBusbwGBps", "a bus bandwidth in GB/s above 0"),
    ("  handover: {burnIn: 1h}\n", "health.handover.burnIn", "unknown field; expected budget, dcgmLevel, gpus, links"),
    ("  weekly: {}\n", "health.weekly", "unknown tier; expected handover, release, intake, idle"),
])
def test_a_bad_health_block_is_refused_with_its_place_and_changes_nothing(apply, demo_site, bad, where, message):
    before = list(NodeType.objects.order_by("name").values_list("name", "health", "updated_at"))
    with pytest.raises(CommandError) as info:
        apply(site_with(bad), names=["site.yaml"])
    text = str(info.value)
    assert f"spec.metal3.nodeTypes[0].{where}" in text and message in text, text
    assert list(NodeType.objects.order_by("name").values_list("name", "health", "updated_at")) == before


# --- in the lab -------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_handover_runs_on_every_provision_and_a_failure_gives_the_claim_another_host_at_once(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["one"], disk_bytes=DISK, health={"handover": {}})
    wait_hosts("available", 2, timeout=120)
    site.set_fault("gpu-01", "gpu-xid:2")  # breaks while it waits in the pool; the allocator takes it first
    apply(gpu_pool(1), tenant="one")
    claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=120)
    assert claim.host_name == "gpu-02", lab_report()
    assert claim.failed_hosts == [] and claim.phase == ClaimPhase.AVAILABLE  # not spent against its tries

    failed = to_repair("gpu-01")
    assert failed.from_state == "provisioning" and failed.step == "handover_dcgm", lab_report()
    assert failed.data["tier"] == "handover"
    evidence = HealthCheckRun.objects.get(pk=failed.data["evidence"]["health_run"])
    assert (evidence.tier, evidence.suite, evidence.verdict) == ("handover", "dcgmi", "fail")
    back = Event.objects.get(object_name=claim.name, from_state="Provisioning", to_state="Pending")
    assert "host gpu-01: provision failed at handover_dcgm" in back.message and "trying another host" in back.message
    # Nothing was written on gpu-01: its handover failed before the image.
    assert not Event.objects.filter(host__name="gpu-01", step="write_image").exists()

    gpu02 = BareMetalHost.objects.get(name="gpu-02")
    provision = Event.objects.filter(host=gpu02, step="handover_dcgm", message="done").latest("id").data["flow_id"]
    assert tiers_of(gpu02, provision) == {("handover", "gpus"): "pass", ("handover", "nvlink"): "pass",
                                          ("handover", "dcgmi"): "pass"}
    assert HealthCheckRun.objects.get(flow_id=provision, suite="dcgmi").thresholds == {"dcgm_level": 1}

    # Release: the release tier between tenants, as before.
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")
    wait_for(lambda: BareMetalHost.objects.get(name="gpu-02").state == "available", timeout=90)
    release = Event.objects.filter(host=gpu02, step="health_nccl", message="done").latest("id").data["flow_id"]
    assert tiers_of(gpu02, release) == {("release", "gpu-reset"): "pass", ("release", "gpu-state"): "pass",
                                        ("release", "dcgmi"): "pass", ("release", "nccl"): "pass"}

    # The timing page shows each tier's duration.
    timings = tier_timings()
    print("tier durations:", [(t["tier"], round(t["p50"], 2), t["n"]) for t in timings])
    assert {t["tier"] for t in timings} == {"handover", "release"}
    client = Client()
    client.force_login(User.objects.create_superuser("ops", password="x"))
    page = client.get("/timing/").content.decode()
    assert 'data-tier="handover"' in page and 'data-tier="release"' in page


@pytest.mark.django_db(transaction=True)
def test_intake_runs_a_burn_in_on_a_new_host_and_after_repair_and_burnin_fail_fails_only_the_intake(
        lab_factory, celery_worker_process):
    site = lab_factory(hosts=2, gpu_hosts=2, faults={"gpu-02": "burnin-fail:4"}, disk_bytes=DISK,
                       health={"intake": {"dcgmLevel": 3, "burnIn": "1s"}})
    wait_hosts("available", 1, timeout=120)
    wait_hosts("repair", 1, timeout=60)
    gpu01, gpu02 = BareMetalHost.objects.get(name="gpu-01"), BareMetalHost.objects.get(name="gpu-02")
    assert gpu01.state == "available", lab_report()
    burnin = HealthCheckRun.objects.get(host=gpu01, tier="intake")
    assert (burnin.suite, burnin.verdict, burnin.thresholds) == ("burn-in", "pass", {"dcgm_level": 3, "burn_in_s": 1})
    assert burnin.parsed["passes"] >= 1

    failed = to_repair("gpu-02")
    assert failed.from_state == "inspecting" and failed.step == "intake_burnin", lab_report()
    assert "Targeted Stress" in failed.message or "stress level" in failed.message, failed.message
    # Only the intake failed: the release gate's DCGM level 2 and NCCL passed on the same host.
    inspect = failed.data["flow_id"]
    assert tiers_of(gpu02, inspect) == {("release", "gpu-reset"): "pass", ("release", "gpu-state"): "pass",
                                        ("release", "dcgmi"): "pass", ("release", "nccl"): "pass",
                                        ("intake", "burn-in"): "fail"}

    # After repair (the GPU replaced): the retest runs the intake again, and passes.
    site.set_fault("gpu-02", "")
    services.host_retest(host=gpu02, actor="user:ops")
    wait_for(lambda: Event.objects.filter(host=gpu02, from_state="retesting", to_state="repair").exists(), timeout=90)
    retest = to_repair("gpu-02")
    assert retest.data.get("retest") == "passed", lab_report()
    assert tiers_of(gpu02, retest.data["flow_id"])[("intake", "burn-in")] == "pass"


@pytest.mark.django_db(transaction=True)
def test_idle_checks_run_on_a_beat_tick_and_a_claim_pre_empts_one_within_seconds(
        lab_factory, celery_worker_process, apply):
    lab_factory(hosts=1, gpu_hosts=1, tenants=["one"], disk_bytes=DISK, power_delay=(1.5, 2),
                health={"idle": {"interval": "1s", "hostsAtOnce": 1}})
    wait_hosts("available", 1, timeout=120)
    host = BareMetalHost.objects.get()
    idle_checks_start.delay()  # what the beat's tick sends
    wait_for(lambda: Event.objects.filter(host=host, from_state="available", to_state="checking").exists(),
             timeout=20)
    assert services.hosts_idle_check_start().started == []  # one at a time (hostsAtOnce), and not checked again yet
    wait_for(lambda: Event.objects.filter(host=host, from_state="checking", to_state="available").exists(),
             timeout=60)
    idle = Event.objects.filter(host=host, step="idle_dcgm", message="done").latest("id").data["flow_id"]
    assert tiers_of(host, idle) == {("idle", "gpus"): "pass", ("idle", "nvlink"): "pass", ("idle", "dcgmi"): "pass"}

    # The next tick checks it again (its interval passed); a claim arrives in the middle and takes the host.
    time.sleep(1)
    assert services.hosts_idle_check_start().started == ["gpu-01"]
    wait_for(lambda: BareMetalHost.objects.get().flow.get("step") in ("power_on_pxe", "agent_lookup"), timeout=20)
    apply(gpu_pool(1), tenant="one")
    # Taken from the check at once, not after it: the check's own end (checking → available) never comes.
    wait_for(lambda: BareMetalHost.objects.get().state == "provisioning", timeout=20)
    moved = Event.objects.filter(host=host, from_state="checking", to_state="provisioning").get()
    assert "idle health check is abandoned" in moved.message
    claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=120)
    assert claim.host_name == "gpu-01", lab_report()
    assert not Event.objects.filter(host=host, from_state="checking", to_state__in=["available", "repair"],
                                    id__gt=moved.id).exists()
