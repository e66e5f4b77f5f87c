"""The pool page live in real Chromium against daphne (issue 12, point 5): a new decision, a new Pending pod and a
node's new use appear without a reload; the page fits a 390 px wide screen."""
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from autonodes.choices import DecisionReason, DemandStatus
from autonodes.live import demand_changed
from autonodes.models import NodeUsage

pytest.register_assert_rewrite("tests.console_conftest", "tests.autonodes_conftest")
from .autonodes_conftest import decision, pending
from .console_conftest import log_in, wait_live

pytest_plugins = ["tests.console_conftest", "tests.autonodes_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

URL = "/tenants/two/pools/train/"


def test_the_pool_page_shows_a_new_decision_and_a_new_pending_pod_without_a_reload(auto_rows, browser_page):
    page = browser_page
    two, train = auto_rows["two"], auto_rows["train"]
    log_in(page, "bob")
    page.goto(URL)
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")

    event = decision(train, "not added: limit nodes 4 reached", reason=DecisionReason.LIMIT,
                     pods=["ml/new-job-0"])  # an Event: it reaches the page through events.services
    told = time.monotonic()
    page.wait_for_selector(f"#pool-decisions-table tbody > tr#decision-{event.pk}:first-child", timeout=5000)
    assert time.monotonic() - told < 3
    assert "Not added: pool limit" in page.inner_text(f"#decision-{event.pk}")

    pending(two, "new-job-0", pool=train, status=DemandStatus.WAITING, reason="not added: limit nodes 4 reached")
    demand_changed(tenant_id=two.pk, pool_ids=[train.pk])  # what the watcher and the decision call after writing
    told = time.monotonic()
    row = page.wait_for_selector('#pod-ml--new-job-0[data-state="waiting"]', timeout=5000)
    assert time.monotonic() - told < 3
    assert "waiting for capacity" in row.inner_text() and "limit nodes 4 reached" in row.inner_text()
    assert page.inner_text("#pool-demand-total") == "5 Pending pods"

    # A write nobody announced (no Event, no message) still arrives, with the next re-sync.
    empty = auto_rows["claims"]["empty"]
    NodeUsage.objects.filter(claim=empty).update(pods=2, empty_since=None, next_action="kept: 2 pods run on it",
                                                 next_action_at=None, checked_at=timezone.now() + timedelta(seconds=1))
    page.wait_for_function(f"document.querySelector('#node-{empty.pk}').innerText.includes('kept: 2 pods run on it')",
                           timeout=15000)
    assert page.evaluate("window.sameDocument") == "not reloaded"


def test_an_outsider_cannot_follow_a_pool_page(auto_rows, browser_page):
    page = browser_page
    log_in(page, "alice")  # a member of tenant one only
    assert page.goto(URL).status == 404
    closed = page.evaluate(f"""() => new Promise(resolve => {{
        const ws = new WebSocket(location.origin.replace('http', 'ws') + '/ws/pools/{auto_rows['train'].pk}/');
        ws.onmessage = () => resolve('message');
        ws.onclose = (e) => resolve(e.code);
    }})""")
    assert closed == 4403


def test_the_pool_page_fits_a_390_px_screen(auto_rows, browser_page, tmp_path):
    page = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, "bob")
    page.goto(URL)
    page.wait_for_load_state("load")
    page.screenshot(path=str(tmp_path / "pool.png"), full_page=True)
    width = page.evaluate("({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})")
    assert width["inner"] == 390 and width["scroll"] <= width["inner"], width
