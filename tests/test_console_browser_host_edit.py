"""Hosts fixed from the console in real Chromium: the board's "Needs attention" says what to do with a host whose
BMC does not answer ("check the BMC address and credentials: edit"), the admin edits the wrong BMC address from
there and the host's page shows the right one, the credentials never shown back; deleting a host that serves a
claim is refused with host_delete's reason."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_bmc_contact
from pools.models import NodeProvider

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, screenshot, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

WRONG = "redfish+http://10.0.0.213:8000/redfish/v1/Systems/gpu-03"
RIGHT = "redfish+http://10.0.0.13:8000/redfish/v1/Systems/gpu-03"
BMC_PASSWORD = "browser-edit-bmc-password-2f6b"


@pytest.fixture
def hosts(users):
    """gpu-03 was registered with a wrong BMC address: it failed and its BMC is red. gpu-01 serves a claim."""
    wrong = BareMetalHost.objects.get(name="gpu-03")
    BareMetalHost.objects.filter(pk=wrong.pk).update(state=HostState.ERROR, bmc_address=WRONG,
                                                     bmc_password=BMC_PASSWORD,
                                                     error_message="BMC at 10.0.0.213 unreachable")
    host_bmc_contact(host=BareMetalHost.objects.get(pk=wrong.pk), ok=False, error="BMC at 10.0.0.213 unreachable")
    served = BareMetalHost.objects.get(name="gpu-01")
    BareMetalHost.objects.filter(pk=served.pk).update(state=HostState.PROVISIONED)
    NodeClaim.objects.create(name="one-ed1t", tenant=pool("one", "gpu").tenant, pool=pool("one", "gpu"),
                             provider=NodeProvider.objects.get(name="metal3"), pool_name="gpu", host=served,
                             host_name=served.name, phase=ClaimPhase.AVAILABLE)
    return {"wrong": wrong, "served": served}


def test_a_wrong_bmc_address_is_fixed_from_the_attention_list_and_the_host_page(browser_page, hosts):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/hosts/")
    wait_live(page)
    fix = page.locator(f"#attention-{hosts['wrong'].pk} td.fix")
    assert "check the BMC address and credentials: edit" in fix.inner_text()
    fix.locator("a", has_text="Edit").click()

    page.wait_for_selector("#host-edit-form")
    assert page.input_value("#id_bmc_address") == WRONG
    assert page.input_value("#id_bmc_password") == "" and page.input_value("#id_bmc_username") == ""
    assert BMC_PASSWORD not in page.content()
    screenshot(page, "host-edit.png")
    page.set_viewport_size({"width": 390, "height": 844})
    screenshot(page, "host-edit-390.png")
    page.set_viewport_size({"width": 1360, "height": 900})
    page.fill("#id_bmc_address", RIGHT)
    page.click("#host-edit-save")

    page.wait_for_selector("text=Host gpu-03 saved; its preflight checks the BMC now; retry it to register it again")
    assert page.url.endswith("/hosts/gpu-03/")
    assert page.inner_text("#host-bmc dd.mono") == RIGHT
    host = BareMetalHost.objects.get(pk=hosts["wrong"].pk)
    assert host.bmc_address == RIGHT and host.bmc_password == BMC_PASSWORD  # the empty password kept
    event = Event.objects.get(host=host, kind="change", actor="user:root-admin")
    assert event.data["bmc_address"] == [WRONG, RIGHT]


def test_deleting_a_host_that_serves_a_claim_is_refused_with_the_reason(browser_page, hosts):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/hosts/gpu-01/")
    page.click("#host-summary a:has-text('Delete…')")
    page.wait_for_selector("#action-refused")
    assert page.inner_text("#action-refused") == (
        "Not possible now: it serves claim one-ed1t: a host serving a tenant must be released first (shrink or "
        "delete its pool, or release the claim).")
    assert page.locator("#confirm-action form").count() == 0
    assert BareMetalHost.objects.filter(name="gpu-01").exists()
