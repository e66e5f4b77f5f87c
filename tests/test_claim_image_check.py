"""What a claim needs is checked before a host is touched: an OS image that exists and can be written."""
import pytest
from django.core.management import call_command

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost

pytestmark = pytest.mark.django_db

GPU_POOL = """\
privateNodes:
  autoNodes:
    - provider: metal3
      properties: {properties}
      static:
        - name: gpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
"""


def no_host_was_touched():
    return (set(BareMetalHost.objects.values_list("state", flat=True)) == {"available"}
            and not Event.objects.filter(object_type="host", to_state="provisioning").exists())


def test_a_claim_naming_a_missing_image_never_gets_a_host_and_says_why(apply, demo_site):
    apply(GPU_POOL.format(properties="{vcluster.com/os-image: ubuntu1804-gone}"), tenant="one")
    call_command("reconcile")
    call_command("reconcile")  # and again: still nothing
    claim = NodeClaim.objects.get()
    assert claim.phase == ClaimPhase.PENDING and claim.host is None
    assert (claim.reason, claim.message) == ("OSImageNotFound", "OS image ubuntu1804-gone not found")
    assert no_host_was_touched()


def test_a_claim_naming_no_image_never_gets_a_host_and_says_why(apply, demo_site):
    apply(GPU_POOL.format(properties="{}"), tenant="one")
    call_command("reconcile")
    claim = NodeClaim.objects.get()
    assert claim.phase == ClaimPhase.PENDING and claim.host is None
    assert (claim.reason, claim.message) == ("NoOSImage", "the pool names no OS image (vcluster.com/os-image)")
    assert no_host_was_touched()
