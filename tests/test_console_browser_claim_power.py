"""A tenant's admin reboots their node from the claim's page in real Chromium: the Reboot button, its confirmation
with a reason, and back on the claim's page the outcome as a message and the request in the claim's events."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import NodeProvider

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def served(users) -> NodeClaim:
    """gpu-01 serves a claim of tenant one, whose member alice administers it."""
    host = BareMetalHost.objects.get(name="gpu-01")
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.PROVISIONED, power_state="on")
    return NodeClaim.objects.create(name="one-r3b0", tenant=pool("one", "gpu").tenant, pool=pool("one", "gpu"),
                                    provider=NodeProvider.objects.get(name="metal3"), pool_name="gpu", host=host,
                                    host_name=host.name, phase=ClaimPhase.AVAILABLE)


def test_a_tenant_admin_reboots_a_node_from_the_claim_page(browser_page, served):
    page = browser_page
    log_in(page, "alice")
    page.goto(f"/claims/{served.name}/")
    wait_live(page)
    assert page.inner_text("#claim-power-state") == "on"
    page.click("#claim-power-cycle")
    page.wait_for_selector("#confirm-power")
    assert "Reboot: claim one-r3b0?" in page.inner_text("h1")
    page.fill("#id_reason", "kernel hung")
    page.click("#confirm-power-submit")
    page.wait_for_selector("#claim-summary")
    assert page.url.endswith(f"/claims/{served.name}/")
    assert "Reboot: asked for claim one-r3b0's host gpu-01" in page.inner_text("body")
    assert "power cycle requested: kernel hung" in page.inner_text("#claim-transitions")
    request = Event.objects.get(claim_id=served.pk, step="power_cycle")
    assert (request.actor, request.data["reason"]) == ("user:alice", "kernel hung")
