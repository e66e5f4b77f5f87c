"""Issue 17.6, the details: one colour per state on every page, the fleet board's state filter shows every
state and every label, the 403 and 404 pages carry the navigation, a refused request is one log line."""
import io
import logging
import re
import sys

import pytest
from django.core.management import call_command

from claims import presenters as claim_presenters
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from hosts import presenters as host_presenters
from hosts.choices import HostState
from hosts.models import BareMetalHost

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import ROOT  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db

IN_PROGRESS = (HostState.REGISTERING, HostState.INSPECTING, HostState.PROVISIONING, HostState.DEPROVISIONING,
               HostState.RETESTING)


@pytest.fixture
def reconciled(users):
    """Tenant two's cpu claim holds a host."""
    call_command("reconcile", stdout=io.StringIO())
    return users


def badge_class(html: str, label: str) -> str:
    return re.search(rf'<span class="badge (badge-[a-z]+)"[^>]*>{label}</span>', html).group(1)


# --- one colour per state --------------------------------------------------------------------------------------

def test_available_is_one_badge_class_for_a_host_and_a_claim(reconciled):
    claim = NodeClaim.objects.get(tenant__name="two")
    NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.AVAILABLE)
    free = BareMetalHost.objects.filter(state=HostState.AVAILABLE).first()
    host_row, = host_presenters.render_rows(
        host_presenters.decorate_rows(list(host_presenters.row_queryset().filter(pk=free.pk)),
                                      host_presenters.node_types_by_selector()), may_see_bmc=True)
    claims = list(claim_presenters.claims_rows_queryset(NodeClaim.objects.filter(pk=claim.pk)))
    claim_row, = claim_presenters.render_claim_rows(claim_presenters.with_progress(claims), show_tenant=True)
    assert badge_class(host_row, "Available") == badge_class(claim_row, "Available") == "badge-success"


def test_a_state_named_alike_for_hosts_and_claims_has_one_colour():
    shared = {label for _, label in HostState.choices} & {label for _, label in ClaimPhase.choices}
    assert shared >= {"Available", "Provisioning"}
    for label in shared:
        host_value = next(v for v, lbl in HostState.choices if lbl == label)
        assert HostState.colour(host_value) == ClaimPhase.colour(label), label


def test_repair_is_not_drawn_in_the_in_progress_colour():
    assert HostState.colour(HostState.REPAIR) not in {HostState.colour(s) for s in IN_PROGRESS}
    assert HostState.colour(HostState.AVAILABLE) != HostState.colour(HostState.PROVISIONED)


def test_the_stylesheet_draws_every_declared_colour():
    css = (ROOT / "static" / "console" / "console.css").read_text()
    for colour in set(HostState.colours.values()) | set(ClaimPhase.colours.values()):
        assert re.search(rf"\.badge-{colour} \{{ background: #[0-9a-f]{{6}}; \}}", css), colour


# --- the fleet board's filter and labels -------------------------------------------------------------------------

def test_the_state_filter_offers_every_state_as_a_checkbox(client, reconciled):
    client.force_login(reconciled["admin"])
    html = client.get("/hosts/", {"state": ["provisioning", "repair"]}).content.decode()
    assert '<select name="state"' not in html
    for state in HostState.values:
        checked = " checked" if state in ("provisioning", "repair") else ""
        assert f'<input type="checkbox" name="state" value="{state}"{checked}>' in html.replace(" >", ">"), state


def test_the_state_filter_keeps_its_query_format(client, reconciled):
    client.force_login(reconciled["admin"])
    serving = BareMetalHost.objects.exclude(state=HostState.AVAILABLE).get()
    html = client.get("/hosts/", {"state": [serving.state, "repair"]}).content.decode()
    assert f'id="host-{serving.pk}"' in html
    assert html.count('<tr id="host-') == 1


def test_the_fleet_board_shows_every_label_role_included(client, reconciled):
    client.force_login(reconciled["admin"])
    host = BareMetalHost.objects.filter(labels__role="gpu").order_by("name").first()
    html = client.get("/hosts/").content.decode()
    row = re.search(rf'<tr id="host-{host.pk}".*?</tr>', html, re.DOTALL).group(0)
    for key, value in host.labels.items():
        assert f"{key}={value}" in row


# --- refusals: pages with the navigation, one log line ------------------------------------------------------------

def test_the_403_page_has_the_navigation_of_the_user_s_role(client, reconciled):
    client.force_login(reconciled["bob"])
    response = client.get("/hosts/")
    assert response.status_code == 403
    html = response.content.decode()
    nav = re.search(r"<nav>(.*?)</nav>", html, re.DOTALL).group(1)
    assert "My tenants" in nav and 'href="/claims/"' in nav and 'href="/hosts/"' not in nav
    assert "Not allowed" in html and "bob · member" in html


def test_the_404_page_has_the_navigation(client, reconciled):
    client.force_login(reconciled["auditor"])
    response = client.get("/hosts/no-such-host/")
    assert response.status_code == 404
    nav = re.search(r"<nav>(.*?)</nav>", response.content.decode(), re.DOTALL).group(1)
    assert 'href="/hosts/"' in nav and 'href="/events/"' in nav and "Apply YAML" not in nav


def refusal_records(caplog):
    return [r for r in caplog.records if getattr(r, "status_code", 0) >= 400]


def test_a_refused_page_is_logged_as_one_line_with_its_reason(client, reconciled, caplog):
    client.force_login(reconciled["bob"])
    caplog.set_level(logging.INFO)
    assert client.get("/hosts/").status_code == 403
    record, = refusal_records(caplog)
    assert record.exc_info is None and "Traceback" not in caplog.text
    assert record.getMessage() == "Forbidden (Permission denied): /hosts/ (this page is not for your role)"


@pytest.mark.parametrize("role, method, path, status", [
    ("anonymous", "get", "/api/v1/hosts/", 401),
    ("auditor", "post", "/api/v1/hosts/", 403),
    ("member_a", "get", "/api/v1/node-types/999999/", 404),
])
def test_a_refused_api_request_is_logged_as_one_line(api, caplog, role, method, path, status):
    caplog.set_level(logging.INFO)
    assert api(role, method, path).status_code == status
    record, = refusal_records(caplog)
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_a_conflict_from_a_service_is_logged_as_one_line(api, world, caplog):
    """DELETE of a host serving a claim: the service refuses (InUse) and the API answers 409."""
    serving = BareMetalHost.objects.filter(claim__isnull=False).first()
    caplog.set_level(logging.INFO)
    assert api("admin", "delete", f"/api/v1/hosts/{serving.pk}/").status_code == 409
    record, = refusal_records(caplog)
    assert record.exc_info is None and "Traceback" not in caplog.text


def test_the_handler_keeps_a_single_line_for_refusals_only():
    """What the console's log handler writes (settings.LOGGING): a refusal's trace dropped, a 500's kept."""
    from core.logs import RefusalsOneLine

    def record(status: int) -> logging.LogRecord:
        try:
            raise PermissionError("no")
        except PermissionError:
            return logging.LogRecord("django.request", logging.WARNING, __file__, 1, "answer: %s", ("/x",),
                                     sys.exc_info())

    refused, failed = record(403), record(500)
    refused.status_code, failed.status_code = 403, 500
    handler = next(h for h in logging.getLogger().handlers if any(isinstance(f, RefusalsOneLine) for f in h.filters))
    stream = io.StringIO()
    # Swapped by hand, not setStream(): that flushes the previous stream, which an earlier test's captured
    # stderr may have closed already.
    previous, handler.stream = handler.stream, stream
    try:
        handler.handle(refused)
        handler.handle(failed)
    finally:
        handler.stream = previous
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith("django.request: answer: /x (no)")
    assert "Traceback (most recent call last):" in lines[1:]
