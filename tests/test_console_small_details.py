"""The small things a newcomer trips over: one time format with the year, "less than a minute" rather than
"0 minutes", no "0 bytes" for an image of unknown size, a computed cost that says so, a claim that skipped power-on
and boot saying it plainly, breadcrumbs, no empty cards, the admin's own words, a favicon."""
import io
import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.template import Context, Template
from django.utils import timezone

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodeType, OSImage

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import ROOT  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db

WITH_YEAR = re.compile(r"\b20\d\d-\d\d-\d\d \d\d:\d\d:\d\d\b")


@pytest.fixture
def claimed(users):
    """Tenant two's cpu claim holds a host."""
    call_command("reconcile", stdout=io.StringIO())
    return NodeClaim.objects.select_related("host").get(tenant__name="two")


def as_(client, user):
    client.force_login(user)
    return client


def text_of(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# --- time ------------------------------------------------------------------------------------------------------

def test_every_template_shows_a_time_in_the_one_format_with_its_year():
    """A time is shown through `when` (2026-12-05 07:44:50) or `since`; `date` only writes machine-read ISO
    attributes ('c')."""
    found = []
    for path in (ROOT / "templates").rglob("*.html"):
        for match in re.finditer(r"\|(date|time|timesince|timeuntil|naturaltime)(:[\"']([^\"']*)[\"'])?",
                                 path.read_text()):
            if not (match.group(1) == "date" and match.group(3) == "c"):
                found.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert found == []


def test_the_claims_list_and_claim_page_show_times_with_the_year(client, claimed, users):
    as_(client, users["admin"])
    row = re.search(rf'<tr id="claim-{claimed.pk}".*?</tr>', client.get("/claims/").content.decode(), re.DOTALL)
    assert WITH_YEAR.search(row.group(0))
    summary = client.get(f"/claims/{claimed.name}/").content.decode()
    assert f"since {timezone.localtime(claimed.phase_changed_at):%Y-%m-%d %H:%M:%S}" in summary


def test_a_time_under_a_minute_ago_reads_less_than_a_minute_never_0_minutes():
    now = timezone.now()
    shown = Template("{{ a|since }}|{{ b|since }}|{{ c|since:now }}|{{ d|when }}").render(Context({
        "a": now - timedelta(seconds=20), "b": now - timedelta(seconds=70), "c": now - timedelta(minutes=61),
        "now": now, "d": now.replace(year=2026, month=12, day=5, hour=7, minute=44, second=50)}))
    assert shown.replace("\xa0", " ") == "less than a minute|1 minute|1 hour, 1 minute|2026-12-05 07:44:50"
    # A time kept as ISO text (a check's, in the cache) reads the same.
    assert Template("{{ t|when }}").render(Context({"t": "2026-12-05T07:44:50.123456+00:00"})) == "2026-12-05 07:44:50"


def test_a_host_changed_seconds_ago_reads_less_than_a_minute_on_the_fleet_board(client, users):
    host = BareMetalHost.objects.order_by("name").first()
    BareMetalHost.objects.filter(pk=host.pk).update(state_changed_at=timezone.now() - timedelta(seconds=30))
    html = as_(client, users["admin"]).get("/hosts/").content.decode()
    row = re.search(rf'<tr[^>]*data-host="{host.name}".*?</tr>', html, re.DOTALL) or \
        re.search(rf'<tr[^>]*id="host-{host.pk}".*?</tr>', html, re.DOTALL)
    assert "less than a minute" in row.group(0) and "0\xa0minutes" not in html and "0 minutes" not in html


def test_the_live_pages_script_says_less_than_a_minute_as_the_server_does():
    script = (ROOT / "static" / "console" / "live.js").read_text()
    assert 'if (seconds < 60) { return "less than a minute"; }' in script


# --- the catalogue ---------------------------------------------------------------------------------------------

def test_an_image_without_a_size_shows_none_not_0_bytes(client, users):
    image = OSImage.objects.get()
    assert image.size_bytes is None
    html = as_(client, users["auditor"]).get("/images/").content.decode()
    assert "0 bytes" not in html and '<td class="size"><span class="muted">—</span></td>' in html
    OSImage.objects.filter(pk=image.pk).update(size_bytes=3 * 1024**3)
    assert '<td class="size">3.0\xa0GB</td>' in client.get("/images/").content.decode()


def test_a_node_type_s_computed_cost_says_so_in_the_list_and_the_form(client, users):
    gpu = NodeType.objects.get(name="gpu-server")
    assert gpu.cost is None
    as_(client, users["admin"])
    row = re.search(r'<tr id="node-type-\d+"[^>]*data-node-type="gpu-server".*?</tr>',
                    client.get("/node-types/").content.decode(), re.DOTALL).group(0)
    assert re.search(rf'<td class="cost">{gpu.effective_cost()} <span[^>]*>computed</span></td>', row)
    form = client.get("/catalogue/node-types/gpu-server/edit/").content.decode()
    assert f'placeholder="{gpu.effective_cost()} (computed)"' in form
    assert f"empty: computed from the resources, now {gpu.effective_cost()}" in form
    NodeType.objects.filter(pk=gpu.pk).update(cost=500)
    row = re.search(r'data-node-type="gpu-server".*?</tr>', client.get("/node-types/").content.decode(), re.DOTALL)
    assert '<td class="cost">500</td>' in row.group(0)


# --- the claim page ---------------------------------------------------------------------------------------------

def add_steps(claim: NodeClaim, names: list[str]) -> None:
    start = timezone.now() - timedelta(minutes=2)
    rows = []
    for i, name in enumerate(names):
        for message in ("started", "done"):
            rows.append(Event(kind="step", object_type="host", object_name=claim.host_name, host_id=claim.host_id,
                              claim=claim, tenant_id=claim.tenant_id, step=name, message=message,
                              duration_s=None if message == "started" else 2.0, actor="system:flow",
                              data={"flow": "provision"}))
    Event.objects.bulk_create(rows)
    Event.objects.filter(claim=claim, kind="step").update(created_at=start)


def test_a_claim_that_skipped_power_on_and_boot_says_so_plainly(client, claimed, users):
    as_(client, users["bob"])
    add_steps(claimed, ["write_image", "write_seed", "reboot_to_disk", "boot_from_disk"])
    html = client.get(f"/claims/{claimed.name}/").content.decode()
    said = re.search(r'<p id="claim-boot-skipped">(.*?)</p>', html).group(1)
    assert said.startswith("No power-on or network boot: the server was already on") and "warm" not in said
    assert html.count('<span class="muted seed-skipped">not needed: already on</span>') == 2  # seed steps 2, 3


def test_a_claim_that_booted_says_nothing_of_skipping(client, claimed, users):
    as_(client, users["bob"])
    add_steps(claimed, ["power_on_pxe", "agent_lookup", "inspect", "write_image"])
    html = client.get(f"/claims/{claimed.name}/").content.decode()
    assert "claim-boot-skipped" not in html and "seed-skipped" not in html


# --- breadcrumbs, cards ----------------------------------------------------------------------------------------

def breadcrumbs(html: str) -> str:
    return text_of(re.search(r'<nav class="breadcrumbs".*?</nav>', html, re.DOTALL).group(0)).strip()


def test_the_host_claim_and_pool_pages_have_breadcrumbs(client, claimed, users):
    as_(client, users["admin"])
    host = client.get(f"/hosts/{claimed.host.name}/").content.decode()
    assert breadcrumbs(host) == f"Fleet › {claimed.host.name}" and '<a href="/hosts/">Fleet</a>' in host
    claim = client.get(f"/claims/{claimed.name}/").content.decode()
    assert breadcrumbs(claim) == f"Claims › two › cpu › {claimed.name}"
    assert '<a href="/tenants/two/pools/cpu/">cpu</a>' in claim
    pool = client.get("/tenants/two/pools/cpu/").content.decode()
    assert breadcrumbs(pool) == "Tenants › two › cpu" and '<a href="/tenants/two/">two</a>' in pool


def test_the_join_card_shows_only_to_those_who_may_join(client, users):
    assert "Join a node by hand" in as_(client, users["alice"]).get("/tenants/one/").content.decode()
    auditor = as_(client, users["auditor"]).get("/tenants/one/").content.decode()
    assert "Join a node by hand" not in auditor and 'id="join-card"' not in auditor


def test_a_tenant_no_host_serves_shows_no_empty_preflight(client, users):
    html = as_(client, users["alice"]).get("/tenants/one/").content.decode()
    assert "Preflight" not in html and "tenant-preflight" not in html


# --- the admin, the favicon ------------------------------------------------------------------------------------

def test_the_admin_names_the_console_and_the_tenants_plainly(client, users):
    html = as_(client, users["admin"]).get("/admin/").content.decode()
    assert "vMetal Console administration" in html and "Django administration" not in html
    assert "VirtualClusterInstance" not in html and re.search(r'href="/admin/pools/tenant/">Tenants</a>', html)
    assert "<title>Objects | vMetal Console admin</title>" in html


def test_every_page_names_a_favicon_and_favicon_ico_leads_to_it(client, users):
    html = as_(client, users["admin"]).get("/hosts/").content.decode()
    icon = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', html).group(1)
    assert icon == "/static/console/favicon.svg"
    assert (Path(ROOT) / "static" / "console" / "favicon.svg").read_text().startswith("<svg")
    answer = client.get("/favicon.ico")
    assert (answer.status_code, answer.headers["Location"]) == (301, icon)
    client.logout()
    assert 'rel="icon"' in client.get("/login/").content.decode()
