"""Every release cleans: a claim released before its node joined (or while its tenant's API is away) still
has its host erased and verified and its join token deleted; a node that does not exist is nothing to
drain; a drain that never ends holds no worker and is skipped at its deadline. In the lab, with a real worker."""
import re

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost, EraseCertificate
from pools.models import NodePool
from pools.services import pool_set_quantity

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def tokens(site, tenant: str) -> set[str]:
    return {s["metadata"]["name"] for s in site.tenants[tenant].objects("secrets", "kube-system")
            if s.get("type") == "bootstrap.kubernetes.io/token"}


def erased_for(claim: NodeClaim, host: BareMetalHost) -> None:
    """The release's own flow ran the erase gate: verified, with passing certificates naming the claim."""
    assert Event.objects.filter(host=host, kind="step", step="verify_erase", message="done",
                                data__flow="deprovision").exists(), lab_report()
    certificates = EraseCertificate.objects.filter(host=host, claim_name=claim.name)
    assert certificates and all(c.result == "pass" for c in certificates)


def test_a_claim_released_before_its_node_joins_is_erased_and_its_join_token_deleted(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    apply(gpu_pool(1), tenant="one")
    # write_seed made the join token and named the node; the node has not joined (nor will it: released now).
    claim = wait_for(lambda: NodeClaim.objects.filter(bootstrap_token_id__gt="").first(), timeout=120)
    assert f"bootstrap-token-{claim.bootstrap_token_id}" in tokens(site, "one")
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")

    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.RELEASED).exists(), timeout=180)
    host = BareMetalHost.objects.get()
    assert host.state == "available", lab_report()
    erased_for(claim, host)
    assert tokens(site, "one") == set()
    drained = Event.objects.get(host=host, kind="step", step="drain_node", message="done", data__flow="deprovision")
    assert "nothing to drain" in drained.data["note"]
    assert not Event.objects.filter(host=host, to_state="error").exists()
    assert "gpu-01" not in {n["metadata"]["name"] for n in site.tenants["one"].objects("nodes")}


def test_a_release_whose_tenant_api_is_away_records_the_failure_and_still_erases_the_host(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    apply(gpu_pool(1), tenant="one")
    claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=180)
    site.tenants["one"].stop()  # the tenant's API is down for the whole release
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")

    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.RELEASED).exists(), timeout=240)
    host = BareMetalHost.objects.get()
    assert host.state == "available", lab_report()
    erased_for(claim, host)
    for step in ("drain_node", "delete_node"):
        skipped = Event.objects.get(host=host, kind="step", step=step, message__startswith="skipped",
                                    data__flow="deprovision")
        assert "tenant API unreachable" in skipped.message, skipped.message
    # The tenant's image is gone from the disk: purged (hosts/gate/plan.py), its content now indeterminate.
    assert site.read_disk("gpu-01", 0, 16) != b"VMETAL-LAB-IMAGE"


def drive_durations(worker) -> list[float]:
    """How long each drive took, from the worker's log ("Task hosts.tasks.drive_host[…] succeeded in 0.05s", or
    drive_host_for_agent, the drive an agent's call asks for)."""
    return [float(s) for s in re.findall(r"Task hosts\.tasks\.drive_host(?:_for_agent)?\[[^\]]+\] succeeded in ([\d.]+)s",
                                         worker.log.read_text())]


def test_a_drain_that_never_ends_holds_no_worker_and_is_skipped_at_its_deadline_then_the_host_is_erased(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    apply(gpu_pool(1), tenant="one")
    claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=180)
    site.tenants["one"].refuse_evictions(10**9)  # a disruption budget that never allows
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")

    # The drain looks again on later drives, and says on the host what it found.
    def drain_progress():
        progress = BareMetalHost.objects.get().flow.get("data", {}).get("drain_node") or {}
        return progress if progress.get("passes", 0) >= 3 else None

    progress = wait_for(drain_progress, timeout=60)
    assert sorted(progress["refused"]) == ["default/notebook-gpu-01", "default/trainer-gpu-01"], progress
    assert "disruption budget" in progress["refused"]["default/trainer-gpu-01"]

    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.RELEASED).exists(), timeout=240)
    host = BareMetalHost.objects.get()
    assert host.state == "available", lab_report()
    erased_for(claim, host)
    skipped = Event.objects.get(host=host, kind="step", step="drain_node", data__flow="deprovision",
                                message__startswith="skipped")
    assert "drain_node did not finish within 20s" in skipped.message, skipped.message
    assert "eviction refused" in skipped.message and "disruption budget" in skipped.message
    assert Event.objects.filter(host=host, kind="step", step="delete_node", message="done").exists()
    assert len(site.tenants["one"].evictions()) >= 6  # asked again on each pass, not once and then waited
    # No drive held its worker thread while the drain waited (one drive used to wait out DRAIN_DEADLINE_S, 20 s).
    durations = drive_durations(celery_worker_process)
    assert durations and max(durations) < 5, sorted(durations)[-5:]
