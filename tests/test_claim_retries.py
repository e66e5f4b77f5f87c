"""A claim whose host failed is retried on another host before the same one, and a host that keeps failing
does not use up its claim's attempts (the host goes to repair instead: tests/test_host_failures.py)."""
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from hosts.models import BareMetalHost
from hosts.services import hosts_sweep_overdue

from .lab_conftest import gpu_pool

pytestmark = pytest.mark.django_db

GPU_POOL = gpu_pool(1)  # one gpu-server node, the demo image


def only_gpu_01_and(state_of_gpu_02: str) -> None:
    BareMetalHost.objects.filter(labels__role="gpu").exclude(name="gpu-01").update(state="maintenance")
    BareMetalHost.objects.filter(name="gpu-02").update(state=state_of_gpu_02)


def fail_the_claims_host() -> NodeClaim:
    """The claim's host misses its deadline: to error, the claim back to Pending. Then it is fine again."""
    claim = NodeClaim.objects.get()
    BareMetalHost.objects.filter(pk=claim.host_id).update(deadline_at=timezone.now() - timedelta(seconds=1))
    hosts_sweep_overdue()
    BareMetalHost.objects.filter(pk=claim.host_id).update(state="available", deadline_at=None)
    claim.refresh_from_db()
    return claim


def test_a_retried_claim_waits_for_a_host_being_cleaned_rather_than_retake_the_one_that_failed_it(
        apply, demo_site):
    only_gpu_01_and("maintenance")
    apply(GPU_POOL, tenant="one")
    call_command("reconcile")
    assert NodeClaim.objects.get().host.name == "gpu-01"
    claim = fail_the_claims_host()
    assert claim.phase == ClaimPhase.PENDING and claim.failed_hosts == ["gpu-01"]

    BareMetalHost.objects.filter(name="gpu-02").update(state="deprovisioning")  # another tenant's, being cleaned
    call_command("reconcile")
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.PENDING and claim.host is None
    assert "not gpu-01 again while another host may free up" in claim.message
    assert BareMetalHost.objects.get(name="gpu-01").state == "available"

    BareMetalHost.objects.filter(name="gpu-02").update(state="available")  # cleaned
    call_command("reconcile")
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.PROVISIONING and claim.host.name == "gpu-02"


def test_a_host_that_keeps_failing_a_claim_does_not_use_up_the_claims_attempts(apply, demo_site, settings):
    settings.CLAIM_MAX_ATTEMPTS = 3
    only_gpu_01_and("maintenance")  # no other host can free up: the claim takes gpu-01 again, last
    apply(GPU_POOL, tenant="one")
    call_command("reconcile")
    for attempt in range(1, 4):
        claim = NodeClaim.objects.get()
        assert claim.phase == ClaimPhase.PROVISIONING and claim.host.name == "gpu-01" and claim.attempts == attempt
        claim = fail_the_claims_host()
        call_command("reconcile")
    claim = NodeClaim.objects.get()
    assert claim.phase == ClaimPhase.PROVISIONING and claim.attempts == 4  # three distinct hosts fail it, not one
