"""The console on a phone (issue 17.6): each main page at 390 px wide in Chromium has no sideways page
scroll (wide tables scroll inside themselves, the navigation wraps). Screenshots go to a tmp dir."""
import io

import pytest
from django.core.management import call_command

from claims.models import NodeClaim
from hosts.choices import HostState
from hosts.models import BareMetalHost

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in  # noqa: E402
from .console_conftest import with_thread  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

PHONE = {"width": 390, "height": 844}
LONG_ERROR = ("provision failed at power_on_pxe: power_on_pxe did not finish within 180s; last error: BMC "
              "unreachable: connection refused by https://bmc-gpu-02.example.invalid/redfish/v1/Systems/1")


def page_width(page) -> dict:
    return page.evaluate("({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})")


@pytest.fixture
def busy_site(users):
    """Tenant two's claim holds a host; one host in error with a long reason, one in repair."""
    with_thread(call_command, command_name="reconcile", stdout=io.StringIO())
    free = list(BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name"))
    BareMetalHost.objects.filter(pk=free[0].pk).update(state=HostState.ERROR, error_message=LONG_ERROR)
    BareMetalHost.objects.filter(pk=free[1].pk).update(state=HostState.REPAIR, error_message="dcgmi diag failed")
    return users


def test_each_main_page_fits_a_390_px_screen(browser_page, busy_site, tmp_path):
    page = browser_page
    page.set_viewport_size(PHONE)
    page.goto("/login/")
    pages = [("login", page.url)]
    assert page_width(page)["scroll"] <= PHONE["width"]
    page.screenshot(path=str(tmp_path / "login.png"), full_page=True)

    log_in(page, "root-admin")
    claim = NodeClaim.objects.get(tenant__name="two")
    host = BareMetalHost.objects.get(state=HostState.ERROR)
    for name, url in (("fleet", "/hosts/"), ("host", f"/hosts/{host.name}/"), ("claims", "/claims/"),
                      ("claim", f"/claims/{claim.name}/"), ("tenant", "/tenants/two/"), ("tenants", "/tenants/"),
                      ("repair", "/repair/"), ("timing", "/timing/"), ("events", "/events/"), ("apply", "/apply/"),
                      ("not-found", "/hosts/no-such-host/")):
        page.goto(url)
        page.wait_for_load_state("load")
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        width = page_width(page)
        assert width["inner"] == PHONE["width"]
        assert width["scroll"] <= width["inner"], f"{name} ({url}) scrolls sideways: {width['scroll']} px"
        pages.append((name, url))
    assert len(list(tmp_path.glob("*.png"))) == len(pages) == 12


def test_a_member_s_pages_fit_a_390_px_screen_and_the_refusal_keeps_the_navigation(browser_page, busy_site, tmp_path):
    page = browser_page
    page.set_viewport_size(PHONE)
    log_in(page, "bob")
    for name, url, status in (("member-tenant", "/tenants/two/", 200), ("member-claims", "/claims/", 200),
                              ("member-events", "/events/", 200), ("member-403", "/hosts/", 403)):
        assert page.goto(url).status == status, url
        page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
        width = page_width(page)
        assert width["scroll"] <= width["inner"], f"{name} ({url}) scrolls sideways: {width['scroll']} px"
    assert page.locator("header.top nav a", has_text="My tenants").is_visible()  # on the 403 page


def test_on_a_phone_every_state_of_the_filter_is_in_sight(browser_page, busy_site):
    page = browser_page
    page.set_viewport_size(PHONE)
    log_in(page, "root-admin")
    page.goto("/hosts/")
    for value in HostState.values:
        box = page.locator(f"#state-filter input[value={value}]")
        box.scroll_into_view_if_needed()
        assert box.is_visible(), value
    page.check("#state-filter input[value=provisioning]")
    page.check("#state-filter input[value=repair]")
    page.click("form.filters button[type=submit]")
    page.wait_for_load_state("load")
    assert "state=provisioning&state=repair" in page.url  # the query's format as before: state=…&state=…
    shown = {int(i.removeprefix("host-")) for i in page.locator("#fleet-table tr[id^=host-]").evaluate_all(
        "rows => rows.map(r => r.id)")}
    assert shown == set(BareMetalHost.objects.filter(state__in=["provisioning", "repair"]).values_list("pk", flat=True))
    assert BareMetalHost.objects.get(state=HostState.REPAIR).pk in shown
