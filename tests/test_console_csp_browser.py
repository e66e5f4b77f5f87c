"""The console's pages are sent with a Content-Security-Policy (core/csp.py) that they satisfy: in real Chromium
against daphne, no page of an admin or a member reports a violation, while live updates (websockets) and htmx
actions still work; an inline script injected into a page does not run."""
import pytest

from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_set_maintenance

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

# Each page's violations, as the browser reports them to the page (before any of its own scripts run).
WATCH = """window.cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => window.cspViolations.push(
    `${e.violatedDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile}:${e.lineNumber})`));"""

ADMIN_PAGES = ["/hosts/", "/claims/", "/timing/", "/repair/", "/tenants/", "/tenants/one/", "/tenants/one/pools/gpu/",
               "/node-types/", "/providers/", "/environments/", "/images/", "/apply/", "/events/",
               "/admin/", "/admin/hosts/baremetalhost/", "/api/docs/"]
# Not checked: DRF's browsable API (/api/v1/), whose bundled scripts try one inline event handler; the policy blocks
# it and the page works (its forms are DRF's own static scripts).
MEMBER_PAGES = ["/tenants/one/", "/claims/", "/events/", "/tenants/"]


@pytest.fixture
def watched_page(csp_page):
    page = csp_page
    page.add_init_script(WATCH)
    page.csp_console = []
    page.on("console", lambda m: page.csp_console.append(m.text) if "Content Security Policy" in m.text else None)
    return page


def violations(page) -> list[str]:
    return page.evaluate("window.cspViolations") + page.csp_console


def visit(page, path: str) -> None:
    response = page.goto(path)
    assert response.status == 200, path
    assert "script-src 'self'" in response.headers["content-security-policy"], path
    page.wait_for_load_state("networkidle")
    assert violations(page) == [], (path, violations(page))


def test_an_admins_pages_report_no_policy_violation_and_stay_live(watched_page, users):
    page = watched_page
    log_in(page, "root-admin")
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    for path in [*ADMIN_PAGES, f"/hosts/{host.name}/"]:
        visit(page, path)

    page.goto("/hosts/")  # a live update over the page's websocket
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    host_set_maintenance(host=host, on=True, actor="test", reason="fan swap")
    page.wait_for_selector(f'#host-{host.pk}[data-state="maintenance"]')
    assert page.evaluate("window.sameDocument") == "not reloaded"
    assert violations(page) == []


def test_a_members_pages_report_no_policy_violation_and_htmx_actions_work(watched_page, users):
    page = watched_page
    log_in(page, "alice")
    for path in MEMBER_PAGES:
        visit(page, path)

    page.goto("/tenants/one/")
    wait_live(page)
    page.wait_for_selector("#tenant-api-console [data-api-console]")  # hx-get on load
    gpu = pool("one", "gpu")
    cell = f"#pool-{gpu.pk}-quantity"
    page.fill(f"{cell} input[name=quantity]", "1")
    page.click(f"{cell} button")  # hx-post, with the CSRF header of hx-headers
    page.wait_for_selector(f"#pool-{gpu.pk}-saved")
    assert pool("one", "gpu").quantity == 1
    assert violations(page) == []


def test_an_inline_script_in_a_page_does_not_run(watched_page, users):
    page = watched_page
    log_in(page, "alice")
    page.goto("/tenants/one/")
    page.evaluate("""() => { const s = document.createElement('script');
                             s.textContent = 'window.injected = true'; document.body.appendChild(s); }""")
    page.wait_for_function("() => window.cspViolations.length > 0")
    assert page.evaluate("window.injected") is None
    assert any(v.startswith("script-src") for v in page.evaluate("window.cspViolations"))
