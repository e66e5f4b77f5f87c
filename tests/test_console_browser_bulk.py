"""The fleet board acting on many hosts in real Chromium: an admin filters the board, ticks "select all",
chooses maintenance, confirms once, and each of the 20 hosts moves with its own Event."""
import pytest

from events.models import Event
from hosts.models import BareMetalHost
from hosts.services import host_transition

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, wait_live  # noqa: E402
from .console_conftest import with_thread  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def rack7(users):
    """20 available hosts in rack r7, beside the demo's 8."""
    return [BareMetalHost.objects.create(
        name=f"r7-gpu-{i:02d}", state="available", boot_mac=f"52:54:00:77:00:{i:02x}", labels={"rack": "r7"},
        bmc_address=f"redfish+http://10.7.0.{i}:8000/redfish/v1/Systems/{i}") for i in range(1, 21)]


def test_a_bulk_maintenance_on_20_selected_hosts_writes_20_events(browser_page, rack7):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/hosts/?label=rack%3Dr7&per_page=25&sort=-name")
    wait_live(page)
    assert page.locator("#fleet-table tbody input.select-host").count() == 20
    page.check("#select-all")
    assert page.inner_text("#bulk-count") == "20 selected"
    # A row the live view swaps in while selected stays selected (r7-gpu-05 starts registering again).
    moved = BareMetalHost.objects.get(name="r7-gpu-05")
    with_thread(host_transition, host=moved, to_state="registering", actor="test", reason="re-register")
    page.wait_for_selector(f'#host-{moved.pk}[data-state="registering"]')
    assert page.is_checked(f"#host-{moved.pk} input.select-host")
    assert page.inner_text("#bulk-count") == "20 selected"
    page.select_option("#bulk-action", "maintenance-on")
    page.click("#bulk-submit")

    page.wait_for_selector("#confirm-bulk")
    assert page.inner_text("h1") == "Maintenance on: 20 hosts?"
    assert page.locator("#bulk-hosts tbody tr").count() == 20
    page.fill("#id_reason", "rack r7 power work")
    page.click("#bulk-confirm")

    page.wait_for_selector("text=Maintenance on: done for 20 hosts")
    assert "label=rack%3Dr7" in page.url and "sort=-name" in page.url  # back to the board as it was
    events = Event.objects.filter(object_type="host", to_state="maintenance", object_name__startswith="r7-gpu-")
    assert events.count() == 20
    assert {e.object_name for e in events} == {h.name for h in rack7}
    assert {(e.actor, e.message) for e in events} == {("user:root-admin", "rack r7 power work")}
    assert not BareMetalHost.objects.filter(name__startswith="r7-gpu-").exclude(state="maintenance").exists()
    assert BareMetalHost.objects.exclude(name__startswith="r7-gpu-").filter(state="maintenance").count() == 0
