"""Live lists in real Chromium against daphne: new rows arrive without a reload, with the page's filters
applied; the live badge offers an immediate reconnect; pages that are not live say so."""
import time

import pytest

from claims.models import NodeClaim

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_created_by_apply_appears_on_an_open_filtered_claims_page_within_a_second(
        browser_page, users, apply, seed_block):
    from claims.reconcile import pools_reconcile

    page = browser_page
    log_in(page, "root-admin")
    page.goto("/claims/?pool=gpu")
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    apply(seed_block, tenant="one")  # gpu and cpu to quantity 1
    pools_reconcile(pool_ids=[pool("one", "gpu").pk, pool("one", "cpu").pk])  # what the worker runs on commit
    committed = time.monotonic()
    gpu = NodeClaim.objects.get(tenant__name="one", pool_name="gpu")
    cpu = NodeClaim.objects.get(tenant__name="one", pool_name="cpu")
    page.wait_for_selector(f"#claims-rows > tr#claim-{gpu.pk}:first-child")
    assert time.monotonic() - committed < 1.0
    assert page.locator(f"#claim-{cpu.pk}").count() == 0
    assert page.locator("#claims-empty").count() == 0
    assert page.evaluate("window.sameDocument") == "not reloaded"


def test_the_badge_offers_reconnect_now_and_the_click_reconnects_at_once(browser_page, users):
    page = browser_page
    routes = []

    def through(route):  # the page's socket, passed to the server; the test can cut it as a restart would
        routes.append(route)
        route.connect_to_server()

    page.route_web_socket("**/ws/claims/**", through)
    log_in(page, "root-admin")
    page.goto("/claims/")
    wait_live(page)
    # The automatic back-off is capped (the extension's own went up to 64 s) ...
    assert page.evaluate("Math.max(...Array.from({length: 30}, (_, n) => htmx.config.wsReconnectDelay(n)))") <= 10000
    # ... and a user does not wait for it: with a long wait ahead, "reconnect now" opens a socket at once.
    page.evaluate("htmx.config.wsReconnectDelay = () => 600000")
    routes[-1].close(code=1012, reason="restart")
    page.wait_for_selector("#live-status.off #live-reconnect")
    page.click("#live-reconnect")
    page.wait_for_selector("#live-status.on", timeout=5000)
    assert len(routes) == 2
    assert page.locator("#live-reconnect").count() == 0


def test_a_page_that_is_not_live_says_so(browser_page, users):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/timing/")
    assert page.inner_text("#live-status") == "not live"
    page.goto("/claims/")
    wait_live(page)
    assert page.inner_text("#live-status") == "live"


def test_the_tenant_pages_quantity_box_follows_a_change_made_elsewhere_unless_the_user_is_editing_it(
        browser_page, users):
    from pools.services import pool_set_quantity

    page = browser_page
    log_in(page, "root-admin")
    page.goto("/tenants/one/")
    wait_live(page)
    gpu, cpu = pool("one", "gpu"), pool("one", "cpu")
    gpu_box, cpu_box = f"#pool-{gpu.pk}-quantity input[name=quantity]", f"#pool-{cpu.pk}-quantity input[name=quantity]"
    pool_set_quantity(pool=gpu, quantity=1, actor="user:elsewhere")
    page.wait_for_function(f"document.querySelector('{gpu_box}').value === '1'")
    page.fill(cpu_box, "2")  # typing, not sent yet
    pool_set_quantity(pool=pool("one", "cpu"), quantity=1, actor="user:elsewhere")
    pool_set_quantity(pool=pool("one", "gpu"), quantity=0, actor="user:elsewhere")
    page.wait_for_function(f"document.querySelector('{gpu_box}').value === '0'")
    assert page.input_value(cpu_box) == "2"


def test_since_times_refresh_without_a_reload(browser_page, users):
    from datetime import timedelta

    from django.utils import timezone

    from hosts.choices import HostState
    from hosts.models import BareMetalHost

    page = browser_page
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    BareMetalHost.objects.filter(pk=host.pk).update(state_changed_at=timezone.now() - timedelta(hours=2, minutes=1))
    page.clock.install()
    log_in(page, "root-admin")
    page.goto("/hosts/")
    cell = f"#host-{host.pk} td[data-timestamp]"
    assert page.inner_text(cell).replace("\xa0", " ") == "2 hours, 1 minute"
    page.evaluate("window.sameDocument = 'not reloaded'")
    page.clock.fast_forward("01:00:00")
    page.wait_for_function(f"document.querySelector('{cell}').textContent.startsWith('3\\u00a0hours')")
    assert page.evaluate("window.sameDocument") == "not reloaded"


def test_the_repair_list_follows_a_host_into_error_without_a_reload(browser_page, users):
    from hosts.choices import HostState
    from hosts.models import BareMetalHost
    from hosts.services import host_transition

    page = browser_page
    log_in(page, "root-admin")
    page.goto("/repair/")
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    host_transition(host=host, to_state=HostState.REGISTERING, actor="test")
    host_transition(host=host, to_state=HostState.ERROR, actor="system:flow", reason="BMC unreachable")
    page.wait_for_selector(f"main >> text={host.name}")
    assert page.evaluate("window.sameDocument") == "not reloaded"
