"""A provision that fails by its claim's fault before anything is written (the tenant's VIP unreachable at
check_tenant_api) returns its host without an erase: no ramdisk boot, no release gate, no new certificate (the
last one stands), powered off or kept warm, with "nothing was written: no erase needed" on its timeline. A failure
after a disk-writing command was queued still cleans in full (tests/test_image_failures.py in the lab). The lab
tests run the real agent, sushy-tools BMCs and a Celery worker on the real broker."""
import pytest
from django.core.management import call_command

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.engine.agent import DISK_WRITTEN, agent_command
from hosts.engine.flow import Run, StepFailed, Waiting
from hosts.lifecycle import FLOWS
from hosts.models import AgentSession, BareMetalHost, EraseCertificate

from .lab_conftest import gpu_pool, lab_report, wait_hosts
from .lab_conftest import closed_port, lab_tenant_api

pytest_plugins = ["tests.lab_conftest"]

NOTHING_WRITTEN = "nothing was written: no erase needed"


def powered(site, host: str) -> str:
    return site.redfish.state(host)["power_state"]


def power_events(site, since: int) -> list[dict]:
    return [e for e in site.redfish.events(since) if e.get("system") in (None, "gpu-01")]


def last_power_seq(site) -> int:
    return max((e.get("seq", 0) for e in site.redfish.events()), default=0)


def deprovision_steps(host: BareMetalHost) -> list[str]:
    return list(Event.objects.filter(host=host, kind="step", message="started", data__flow="deprovision")
                .order_by("id").values_list("step", flat=True))


def spared_release(host: BareMetalHost) -> Event:
    """The host's move back to the pool after the failed provision (the deprovision flow's end)."""
    return wait_for(lambda: Event.objects.filter(host=host, kind="transition", from_state="deprovisioning",
                                                 to_state="available").first(), timeout=90)


def certificate_ids(host: BareMetalHost) -> list[str]:
    return sorted(c.certificate_id for c in EraseCertificate.objects.filter(host=host))


@pytest.mark.django_db(transaction=True)
def test_a_wrong_vip_sends_the_host_back_without_an_erase_and_fixing_it_lets_the_claim_become_available(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    standing = certificate_ids(host)
    assert standing, "its intake gate left certificates"
    disk = site.read_disk(host.name, 0, 4096)
    wait_for(lambda: powered(site, host.name) == "Off", timeout=10)
    seq = last_power_seq(site)

    lab_tenant_api(site, "one", endpoint=f"127.0.0.1:{closed_port()}")  # nothing listens at the VIP
    apply(gpu_pool(1), tenant="one")
    back = spared_release(host)

    moved = Event.objects.get(host=host, kind="transition", to_state="deprovisioning")
    assert (moved.step, moved.data["fault"], moved.data["untouched"]["step"]) == (
        "check_tenant_api", "claim", "check_tenant_api"), moved.data
    # No power-off and ramdisk boot, no erase, verification, GPU reset or health suite: only the release's tenant
    # side (nothing joined), the note, and the power-off.
    assert deprovision_steps(host) == ["drain_node", "delete_node", "no_erase_needed", "power_off_after_clean"], \
        lab_report()
    assert not Event.objects.filter(host=host, step__in=["erase", "verify_erase", "gpu_reset", "gpu_state", "health_dcgm",
                                                         "health_nccl"], data__flow="deprovision").exists()
    note = Event.objects.get(host=host, kind="step", step="no_erase_needed", message="done")
    assert note.data["reason"] == NOTHING_WRITTEN and note.data["failed_at"] == "check_tenant_api"
    assert "check_endpoint" in note.data["agent_commands"]
    assert not {"write_image", "write_seed"} & set(note.data["agent_commands"])
    assert sorted(note.data["certificates"]) == standing  # the intake's certificates still stand
    assert back.message.startswith(f"deprovision done: {NOTHING_WRITTEN} (provision failed at check_tenant_api")
    # The certificate chain is as it was; the disk is as the gate left it; the host is off, booted once (the
    # provision's ramdisk boot) and powered off once since.
    assert certificate_ids(host) == standing
    assert site.read_disk(host.name, 0, 4096) == disk
    assert powered(site, host.name) == "Off"
    assert [e["power_state"] for e in power_events(site, seq)] == ["On", "Off"], power_events(site, seq)
    host.refresh_from_db()
    assert (host.state, host.warm_since, host.error_count) == ("available", None, 0)
    claim = NodeClaim.objects.get()
    assert (claim.phase, claim.reason, claim.host_id) == (ClaimPhase.PENDING, "TenantAPIUnreachable", None)

    lab_tenant_api(site, "one")  # the VIP fixed: the claim is allocated again and goes all the way
    wait_for(lambda: NodeClaim.objects.get().phase == ClaimPhase.AVAILABLE, timeout=180)
    assert Event.objects.filter(host=host, step="write_image", message="done").exists()
    assert certificate_ids(host) == standing
    assert not Event.objects.filter(object_type="host", to_state__in=["error", "repair"]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_warm_host_whose_claim_fails_at_the_vip_check_stays_warm_without_a_power_cycle_or_an_erase(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"], warm=1)
    wait_hosts("available", 1)
    host = wait_for(lambda: BareMetalHost.objects.filter(warm_since__isnull=False).first(), timeout=30)
    standing = certificate_ids(host)
    seq = last_power_seq(site)

    lab_tenant_api(site, "one", endpoint=f"127.0.0.1:{closed_port()}")
    apply(gpu_pool(1), tenant="one")
    spared_release(host)

    assert deprovision_steps(host) == ["drain_node", "delete_node", "no_erase_needed", "keep_warm"], lab_report()
    assert Event.objects.get(host=host, step="keep_warm", message="done", data__flow="deprovision").data["warm"]
    host.refresh_from_db()
    assert host.state == "available" and host.warm_since is not None
    assert AgentSession.objects.filter(host=host, active=True).exists()
    assert powered(site, host.name) == "On" and power_events(site, seq) == []  # never powered off or booted
    assert certificate_ids(host) == standing

    lab_tenant_api(site, "one")
    wait_for(lambda: NodeClaim.objects.get().phase == ClaimPhase.AVAILABLE, timeout=180)
    provision = list(Event.objects.filter(host=host, kind="step", message="started", data__flow="provision")
                     .order_by("-id").values_list("step", flat=True))
    assert "power_on_pxe" not in provision and "write_image" in provision  # still warm: provisioned at once


# --- which failures skip the erase: the claim's, before a disk-writing command was queued -------------------

@pytest.fixture
def provisioning(apply, demo_site):
    """Tenant one's gpu claim on a host in provisioning, with its flow run begun (nothing written yet)."""
    apply(gpu_pool(1), tenant="one")
    call_command("reconcile")
    claim = NodeClaim.objects.get()
    host = BareMetalHost.objects.select_related("claim__tenant", "claim__node_type").get(pk=claim.host_id)
    assert host.state == "provisioning"
    run = Run(host)
    run.flow = host.flow = {"name": "provision", "id": "f-untouched", "state_since": host.state_changed_at.isoformat(),
                            "done": {}, "data": {}}
    FLOWS["provision"].begin(run)
    return run


def fail_at(run: Run, step: str, failure: StepFailed) -> Event:
    FLOWS["provision"].fail(run, next(s for s in FLOWS["provision"].steps if s.name == step), failure)
    return Event.objects.filter(host=run.host, object_type="host", kind="transition").order_by("-id").first()


@pytest.mark.django_db
def test_a_claims_failure_before_any_write_is_marked_untouched_on_the_move_to_deprovisioning(provisioning):
    assert provisioning.data[DISK_WRITTEN] is False
    moved = fail_at(provisioning, "check_tenant_api", StepFailed("unreachable", claim_reason="TenantAPIUnreachable"))
    assert moved.to_state == "deprovisioning"
    assert moved.data["untouched"] == {"flow": "provision", "flow_id": "f-untouched", "step": "check_tenant_api"}


@pytest.mark.django_db
def test_a_write_queued_in_the_run_means_a_full_clean_even_when_the_claim_is_at_fault(provisioning):
    run = provisioning
    run.flow["step"] = "write_image"
    with pytest.raises(Waiting):
        agent_command(run, "write_image", {"url": "http://images/x"}, dirties_disk=True)
    # Recorded on the host's row before the command existed.
    stored = BareMetalHost.objects.get(pk=run.host.pk).flow["data"][DISK_WRITTEN]
    assert (stored["step"], stored["command"]) == ("write_image", "write_image")
    moved = fail_at(run, "write_image", StepFailed("OS image failed on 2 hosts", claim_reason="ImageFailed"))
    assert moved.to_state == "deprovisioning" and "untouched" not in moved.data


@pytest.mark.django_db
@pytest.mark.parametrize("failure", [
    StepFailed("the agent stopped answering"),  # the host's fault: cleaned in full, as before
    StepFailed("fabric range full", clean=True, claim_reason="FabricRangeFull"),  # a step that asks for a clean
], ids=["host-fault", "clean-asked"])
def test_a_hosts_failure_or_one_that_asks_for_a_clean_is_not_untouched(provisioning, failure):
    moved = fail_at(provisioning, "check_tenant_api", failure)
    assert "untouched" not in moved.data


@pytest.mark.django_db
def test_a_run_that_never_said_nothing_was_written_counts_as_written(provisioning):
    provisioning.data.pop(DISK_WRITTEN)  # a run begun by a console before this record
    moved = fail_at(provisioning, "check_tenant_api", StepFailed("unreachable", claim_reason="TenantAPIUnreachable"))
    assert moved.to_state == "deprovisioning" and "untouched" not in moved.data
