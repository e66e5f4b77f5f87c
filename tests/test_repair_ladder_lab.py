"""The repair ladder in the lab (sushy-tools BMCs, the real agent, the fake GPU tools, a real Celery worker): an
intermittent XID is repaired by the first remedy and the host returns to the pool with its history; a permanent
fault climbs the whole ladder and waits for a person with the summary, and an admin's retest still works."""
import pytest

from conftest import wait_for
from events.models import Event
from hosts import services
from hosts.models import BareMetalHost, HealthCheckRun, RepairAttempt, RepairCase

from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]


@pytest.fixture
def ladder_lab(lab_factory, worker_settings, settings):
    """lab_factory with the repair ladder on (the lab's other tests keep it off), for the worker started next."""
    worker_settings.update(REPAIR_LADDER="1", REPAIR_COLD_OFF_S="1")
    settings.REPAIR_LADDER = True
    return lab_factory


def _wait(predicate, timeout: float) -> None:
    try:
        wait_for(predicate, timeout=timeout)
    except AssertionError:
        raise AssertionError(f"not within {timeout}s\n{lab_report()}") from None


def _transitions(host) -> list[tuple[str, str, str]]:
    return list(Event.objects.filter(host=host, kind="transition").order_by("id")
                .values_list("from_state", "to_state", "actor"))


@pytest.mark.django_db(transaction=True)
def test_an_intermittent_xid_is_repaired_by_a_gpu_reset_and_the_host_returns_with_its_history(
        ladder_lab, celery_worker_process, client, admin_user):
    ladder_lab(hosts=1, gpu_hosts=1, faults={"gpu-01": "xid-intermittent:3"}, disk_bytes=96 * 1024 * 1024)
    _wait(lambda: RepairCase.objects.filter(outcome="repaired").exists(), timeout=90)
    wait_hosts("available", 1, timeout=10)
    host = BareMetalHost.objects.get()
    assert _transitions(host)[-3:] == [("inspecting", "repair", "system:flow"),
                                       ("repair", "repairing", "system:repair"),
                                       ("repairing", "available", "system:repair")]
    case = RepairCase.objects.get()
    assert (case.kind, case.detail, case.failure_step) == ("gpu-xid", "GPU 3", "health_dcgm")
    assert case.ladder == ["gpu-reset", "power-cycle", "retest"] and case.position == 1
    assert case.closed_at is not None and case.closed_by == "system:repair"
    assert case.summary == "gpu-xid on GPU 3: tried gpu-reset (passed); repaired by gpu-reset"
    attempt = RepairAttempt.objects.get()
    assert (attempt.step, attempt.outcome, attempt.position) == ("gpu-reset", "passed", 1)
    assert attempt.started_at < attempt.finished_at
    # Its evidence: the checks it ran again, all passing; the failed run that sent it to repair is the case's.
    runs = {r["suite"]: r["verdict"] for r in attempt.evidence["health_runs"]}
    assert runs == {"gpu-reset": "pass", "gpu-state": "pass", "dcgmi": "pass", "nccl": "pass"}
    failed = HealthCheckRun.objects.get(pk=case.evidence["health_run"])
    assert failed.verdict == "fail" and "XID 94 for GPU 3" in " ".join(failed.reasons)
    # The remedy did not erase again: the failed run's erase had been verified before its GPU check failed.
    steps = dict(Event.objects.filter(host=host, kind="step", data__flow="repair").exclude(message="started")
                 .values_list("step", "message"))
    assert steps["erase"].startswith("done") and steps["health_dcgm"] == "done"
    skipped = Event.objects.filter(host=host, kind="step", data__flow="repair", step="erase", message="done").get()
    assert "verified" in skipped.data["skipped"]

    client.force_login(admin_user)
    page = client.get(f"/hosts/{host.name}/").content.decode()
    assert "Repair history" in page and "gpu-xid on GPU 3" in page and "repaired by gpu-reset" in page


@pytest.mark.django_db(transaction=True)
def test_a_permanent_fault_climbs_the_whole_ladder_and_waits_for_a_person_whose_retest_still_works(
        ladder_lab, celery_worker_process, capsys):
    from django.core.management import call_command

    site = ladder_lab(hosts=1, gpu_hosts=1, faults={"gpu-01": "gpu-dcgm-fail:3"}, disk_bytes=96 * 1024 * 1024)
    _wait(lambda: RepairCase.objects.filter(outcome="waiting").exists(), timeout=240)
    host = BareMetalHost.objects.get()
    assert host.state == "repair"
    case = RepairCase.objects.get()
    assert case.kind == "gpu-health" and case.detail == "GPU 3"
    assert case.summary == ("gpu-health on GPU 3: tried gpu-reset (failed), power-cycle (failed), retest (failed); "
                            "waiting for a person")
    attempts = list(case.attempts.order_by("position"))
    assert [(a.step, a.outcome, a.failed_step) for a in attempts] == [
        ("gpu-reset", "failed", "health_dcgm"), ("power-cycle", "failed", "health_dcgm"),
        ("retest", "failed", "health_dcgm")]
    assert all("faulty memory elements on GPU 3" in a.message for a in attempts)
    # Only the retest erased again (verified, a certificate per disk); the power cycle kept the host off first.
    assert attempts[2].evidence["certificates"] and not attempts[0].evidence["certificates"]
    held = Event.objects.get(host=host, step="cold_off", message="done", data__has_key="held_off_s")
    assert held.data["held_off_s"] >= 1
    waiting = Event.objects.filter(host=host, step="repair_ladder", kind="action").get()
    assert waiting.message == case.summary
    call_command("repair")
    assert case.summary in capsys.readouterr().out

    # A person's retest, as before the ladder: it fails while the GPU is broken, and the ladder does not restart.
    services.host_retest(host=host, actor="user:ops")
    wait_for(lambda: Event.objects.filter(host=host, from_state="retesting", to_state="repair").exists(), timeout=60)
    assert RepairAttempt.objects.count() == 3 and BareMetalHost.objects.get().state == "repair"
    site.set_fault("gpu-01", "")  # the GPU is replaced
    services.host_retest(host=BareMetalHost.objects.get(), actor="user:ops", reason="GPU 3 replaced")
    wait_for(lambda: Event.objects.filter(host=host, from_state="retesting", to_state="repair").count() == 2,
             timeout=60)
    services.host_return_to_service(host=BareMetalHost.objects.get(), actor="user:ops")
    case.refresh_from_db()
    assert (case.outcome, case.closed_by) == ("returned", "user:ops")
    assert RepairAttempt.objects.count() == 3 and BareMetalHost.objects.get().state == "available"


@pytest.mark.django_db(transaction=True)
def test_a_missing_gpu_is_a_sku_case_that_a_cold_power_cycle_does_not_mend(ladder_lab, celery_worker_process):
    ladder_lab(hosts=1, gpu_hosts=1, faults={"gpu-01": "gpu-missing"}, disk_bytes=96 * 1024 * 1024)
    _wait(lambda: RepairCase.objects.filter(outcome="waiting").exists(), timeout=120)
    case = RepairCase.objects.get()
    assert (case.kind, case.failure_step, case.ladder) == ("sku", "sku_check", ["power-cycle"])
    assert case.detail.startswith("GPUs: 7 of 8")
    [attempt] = case.attempts.all()
    assert (attempt.step, attempt.outcome, attempt.failed_step) == ("power-cycle", "failed", "sku_check")
    assert case.summary == f"sku on {case.detail}: tried power-cycle (failed); waiting for a person"
    assert BareMetalHost.objects.get().state == "repair"
