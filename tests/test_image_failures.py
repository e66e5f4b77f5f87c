"""An image that fails on every host is the claim's fault, not the hosts': the claim fails with the reason,
the hosts are cleaned in full (erased and verified: the image was being written) and go back to the pool
(never to error or repair), and no further claim of that image touches a host. In the lab, with a real worker."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def test_an_image_that_fails_on_every_host_fails_the_claim_and_the_hosts_return_to_the_pool(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["one"])
    wait_hosts("available", 2)
    apply(site.manifests().replace(site.images[0].sha256, "f" * 64))  # the OSImage's checksum is wrong
    apply(gpu_pool(1), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.FAILED).exists(), timeout=240)
    claim = NodeClaim.objects.get()
    assert claim.reason == "ImageFailed", lab_report()
    assert "failed to write on 2 hosts (gpu-01, gpu-02)" in claim.message and "checksum mismatch" in claim.message
    wait_hosts("available", 2, timeout=180)
    assert not Event.objects.filter(object_type="host", to_state__in=["error", "repair"]).exists()
    # The claim's fault, but after write_image was queued: every host is cleaned in full, as always (a failure
    # before anything is written is not: tests/test_untouched_release.py).
    for host in BareMetalHost.objects.all():
        moved = Event.objects.filter(host=host, kind="transition", to_state="deprovisioning", step="write_image")
        assert moved.exists() and not any("untouched" in e.data for e in moved)
        assert Event.objects.filter(host=host, step="verify_erase", message="done", data__flow="deprovision").count() \
            == moved.count(), lab_report()
        assert not Event.objects.filter(host=host, step="no_erase_needed").exists()

    apply(gpu_pool(2), tenant="one")  # another claim of the same image waits, with the reason; no host moves
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.PENDING, reason="ImageFailed").exists(), timeout=30)
    assert set(BareMetalHost.objects.values_list("state", flat=True)) == {"available"}
    assert Event.objects.filter(object_type="host", to_state="provisioning").count() == 2
