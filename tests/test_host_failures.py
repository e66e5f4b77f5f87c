"""A host that keeps failing claims (its image writes fail: checksum mismatch) goes to repair with the
evidence after HOST_FAILURE_LIMIT failures; its claim is never Failed for it and ends on a healthy host.
In the lab, with a real worker."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost
from hosts.services import host_last_repair_verdict, host_set_maintenance

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_host_whose_image_writes_keep_failing_goes_to_repair_and_the_claim_ends_on_a_healthy_host(
        lab_factory, celery_worker_process, apply):
    lab_factory(hosts=2, gpu_hosts=2, tenants=["one"], faults={"gpu-01": "corrupt-image"})
    wait_hosts("available", 2)
    # gpu-02 is away at first: gpu-01 is the only host, so the claim has no other to go to.
    host_set_maintenance(host=BareMetalHost.objects.get(name="gpu-02"), on=True, actor="user:test")
    apply(gpu_pool(1), tenant="one")
    wait_hosts("repair", 1, timeout=180)
    gpu01 = BareMetalHost.objects.get(state="repair")
    assert gpu01.name == "gpu-01"
    verdict = host_last_repair_verdict(host=gpu01)
    failures = verdict["evidence"]["failures"]
    assert len(failures) == 3 and all(f["step"] == "write_image" and "checksum mismatch" in f["message"]
                                      for f in failures), verdict
    assert verdict["message"].startswith("3 provisioning failures within 1h"), verdict
    # Cleaned before it was set aside: its last flow was a release gate that passed.
    assert Event.objects.filter(host=gpu01, kind="step", step="verify_erase", message="done",
                                data__flow="deprovision").count() == 3
    claim = NodeClaim.objects.get()
    assert claim.phase == ClaimPhase.PENDING, lab_report()

    host_set_maintenance(host=BareMetalHost.objects.get(name="gpu-02"), on=False, actor="user:test")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).exists(), timeout=100)
    claim = NodeClaim.objects.get()
    assert claim.host.name == "gpu-02"
    assert not Event.objects.filter(object_type="claim", to_state=ClaimPhase.FAILED).exists()
    assert not Event.objects.filter(object_type="host", to_state="error").exists()
    assert BareMetalHost.objects.get(name="gpu-01").state == "repair"
