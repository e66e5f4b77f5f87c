"""The console's lists and layouts in Chromium: the claims list sorts by its headers and filters by pool and
NodeType; the live pages' relative times; nothing cut at 1360 px (the BMC card) or at 390 px (the tenant's
quantity and Set, the fleet board's state tiles above the hosts); the login page's fields one width."""
import io

import pytest
from django.core.management import call_command

from claims.models import NodeClaim
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import Tenant
from pools.services import pool_set_quantity

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PHONE, log_in, pool, with_thread  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

LONG_BMC = ("redfish+https://bmc-gpu-rack-r12-slot-07.datacentre-east.example.invalid:8443"
            "/redfish/v1/Systems/System.Embedded.1")


@pytest.fixture
def four_claims(users):
    """Tenant two: three cpu claims; tenant one: one gpu claim (each holding a host)."""
    def setup():
        Tenant.objects.filter(name="two").update(quota_nodes=None)
        pool_set_quantity(pool=pool("two", "cpu"), quantity=3, actor="test")
        pool_set_quantity(pool=pool("one", "gpu"), quantity=1, actor="test")
        call_command("reconcile", stdout=io.StringIO())

    with_thread(setup)
    assert NodeClaim.objects.count() == 4
    return users


def shown_claims(page) -> list[str]:
    return page.eval_on_selector_all("#claims-rows tr[data-live-id] td:first-child a",
                                     "els => els.map(e => e.textContent)")


def test_the_claims_list_sorts_by_a_header_and_filters_by_pool_and_node_type(browser_page, four_claims):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/claims/")
    names = sorted(NodeClaim.objects.values_list("name", flat=True))
    page.click("#claims-table th a.sort:text-is('Claim')")
    page.wait_for_url("**/claims/?sort=name")
    assert shown_claims(page) == names
    page.click("#claims-table th a.sort:has-text('Claim')")  # again: the other way round
    page.wait_for_url("**/claims/?sort=-name")
    assert shown_claims(page) == names[::-1]
    assert page.text_content("#claims-table th a.sorted") == "Claim ▼"
    page.select_option("select[name=pool]", "cpu")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**pool=cpu**")
    cpu = sorted(NodeClaim.objects.filter(pool_name="cpu").values_list("name", flat=True), reverse=True)
    assert shown_claims(page) == cpu  # filtered, still in the order chosen
    page.select_option("select[name=pool]", "")
    page.select_option("select[name=node_type]", "gpu-server")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**node_type=gpu-server**")
    assert shown_claims(page) == list(NodeClaim.objects.filter(pool_name="gpu").values_list("name", flat=True))
    assert page.locator("select[name=pool] option").first.inner_text() == "any"


def test_the_live_pages_say_less_than_a_minute_never_0_minutes(browser_page, users):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/hosts/")
    page.wait_for_function("typeof window.liveTimesince === 'function'")
    shown = page.evaluate("[0, 30, 59, 60, 70, 3700].map(window.liveTimesince)")
    assert [s.replace("\xa0", " ") for s in shown] == [
        "less than a minute", "less than a minute", "less than a minute", "1 minute", "1 minute",
        "1 hour, 1 minute"]


def overflowing(page, selector: str) -> list[str]:
    """Elements under `selector` whose text runs past their own box or their card's right edge."""
    return page.evaluate("""(selector) => {
      const card = document.querySelector(selector).getBoundingClientRect();
      return Array.from(document.querySelectorAll(selector + ' dd')).filter(dd => {
        const box = dd.getBoundingClientRect();
        return dd.scrollWidth > dd.clientWidth + 1 || box.right > card.right + 1;
      }).map(dd => dd.id || dd.textContent.trim().slice(0, 40));
    }""", selector)


def test_the_bmc_card_shows_a_long_address_and_the_cleaning_whole_at_1360_px(browser_page, users):
    host = BareMetalHost.objects.order_by("name").first()
    BareMetalHost.objects.filter(pk=host.pk).update(bmc_address=LONG_BMC)
    page = browser_page
    log_in(page, "root-admin")
    page.goto(f"/hosts/{host.name}/")
    assert page.viewport_size["width"] == 1360
    assert LONG_BMC in page.inner_text("#host-bmc")
    assert overflowing(page, "#host-bmc") == []
    cleaning = page.locator("#host-cleaning").bounding_box()
    card = page.locator("#host-bmc").bounding_box()
    assert cleaning["x"] + cleaning["width"] <= card["x"] + card["width"]


def test_on_a_phone_the_tenant_s_quantity_and_set_are_in_sight(browser_page, users):
    page = browser_page
    page.set_viewport_size(PHONE)
    log_in(page, "alice")
    page.goto("/tenants/one/")
    gpu = pool("one", "gpu")
    for selector in (f"#pool-{gpu.pk}-quantity input[name=quantity]", f"#pool-{gpu.pk}-quantity button"):
        box = page.locator(selector).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], (selector, box)
        page.locator(selector).click(trial=True)  # nothing covers it: a finger reaches it
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]


def test_on_a_phone_the_state_tiles_take_one_row_above_the_hosts(browser_page, users):
    page = browser_page
    page.set_viewport_size(PHONE)
    log_in(page, "root-admin")
    page.goto("/hosts/")
    page.locator("#state-counts a").first.wait_for()
    # Read in one go: a live update may swap the tiles between two reads.
    tops = page.evaluate("[...document.querySelectorAll('#state-counts a')]"
                         ".map(a => Math.round(a.getBoundingClientRect().top))")
    assert len(tops) == len(HostState)  # one tile per state
    tops = set(tops)
    assert len(tops) == 1  # one row, scrolled sideways
    assert page.locator("#state-counts").bounding_box()["height"] < 80
    first_row = page.evaluate("document.querySelector('#fleet-table tbody tr').getBoundingClientRect().top + scrollY")
    assert first_row < 1200, first_row  # 1,450 px with the tiles stacked, for these 8 hosts


@pytest.mark.parametrize("viewport", [{"width": 1360, "height": 900}, PHONE])
def test_the_login_page_s_fields_are_one_width(browser_page, viewport):
    page = browser_page
    page.set_viewport_size(viewport)
    page.goto("/login/")
    user, password = (page.locator(f"#id_{name}").bounding_box() for name in ("username", "password"))
    assert abs(user["width"] - password["width"]) < 1 and user["x"] == password["x"]
    assert user["width"] > 200
