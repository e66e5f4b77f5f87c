"""The console's pages over HTTP, as each role sees them: what loads, what is refused, what changes."""
import io
from html import unescape

import pytest
from django.core.management import call_command
from django.urls import reverse

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_set_maintenance
from pools.models import NodeEnvironment, NodeProvider, NodeType, OSImage, Tenant

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD, bmc_addresses, pool  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db


@pytest.fixture
def reconciled(users):
    """Tenant two's cpu claim holds a host; tenant one asks for one gpu node and has it."""
    from pools.services import pool_set_quantity

    pool_set_quantity(pool=pool("one", "gpu"), quantity=1, actor="test")
    call_command("reconcile", stdout=io.StringIO())
    return users


def as_user(client, user):
    client.force_login(user)
    return client


def staff_urls():
    host = BareMetalHost.objects.order_by("name").first()
    return [reverse("fleet"), reverse("repair"), reverse("timing"), reverse("providers"), reverse("node-types"),
            reverse("environments"), reverse("images"), reverse("apply"),
            reverse("catalogue-create", args=["providers"]), reverse("catalogue-edit", args=["tenants", "one"]),
            reverse("host-action", args=[host.name, "maintenance-on"])]


# --- every page loads for the admin ------------------------------------------------------------------------

def test_the_admin_sees_every_page(client, reconciled):
    as_user(client, reconciled["admin"])
    claim = NodeClaim.objects.filter(tenant__name="one").first()
    host = claim.host
    urls = staff_urls() + [reverse("tenants"), reverse("tenant", args=["one"]), reverse("tenant", args=["two"]),
                           reverse("claims"), reverse("claim", args=[claim.name]), reverse("host", args=[host.name]),
                           reverse("events")]
    for kind in ("providers", "node-types", "environments", "images", "tenants"):
        urls.append(reverse("catalogue-create", args=[kind]))
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
    page = client.get(reverse("host", args=[host.name])).content.decode()
    assert host.bmc_address in page
    assert "demo-password" not in page


def test_home_sends_staff_to_the_fleet_and_members_to_their_tenant(client, users):
    assert client.get("/").url.startswith(reverse("login"))
    as_user(client, users["auditor"])
    assert client.get("/").url == reverse("fleet")
    as_user(client, users["alice"])
    assert client.get("/").url == reverse("tenant", args=["one"])


def test_login_and_logout_through_the_forms(client, users):
    response = client.post(reverse("login"), {"username": "alice", "password": PASSWORD}, follow=True)
    assert response.redirect_chain[-1][0] == reverse("tenant", args=["one"])
    assert "alice" in response.content.decode()
    response = client.post(reverse("logout"), follow=True)
    assert response.redirect_chain[-1][0] == reverse("login")
    assert client.get(reverse("tenant", args=["one"])).status_code == 302


# --- tenant isolation ------------------------------------------------------------------------------------

def test_a_member_of_two_gets_nothing_of_one_and_no_admin_page(client, reconciled):
    as_user(client, reconciled["bob"])
    one_claim = NodeClaim.objects.filter(tenant__name="one").first()
    for url in (reverse("tenant", args=["one"]), reverse("claim", args=[one_claim.name]),
                reverse("host", args=[one_claim.host.name])):
        assert client.get(url).status_code == 404, url
    assert client.post(reverse("pool-quantity", args=["one", "gpu"]), {"quantity": 2}).status_code == 404
    assert client.post(reverse("tenant-join", args=["one"])).status_code == 404
    for url in staff_urls():
        assert client.get(url).status_code == 403, url
    assert client.post(reverse("host-action", args=[one_claim.host.name, "maintenance-on"])).status_code == 403
    assert pool("one", "gpu").quantity == 1


def test_no_page_shows_a_member_a_bmc_address_or_another_tenant(client, reconciled):
    as_user(client, reconciled["bob"])
    own = NodeClaim.objects.get(tenant__name="two")
    pages = [reverse("tenant", args=["two"]), reverse("tenants"), reverse("claims"), reverse("claim", args=[own.name]),
             reverse("host", args=[own.host.name]), reverse("events")]
    addresses = bmc_addresses()
    for url in pages:
        response = client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        for address in addresses:
            assert address not in html, url
        assert "one-" not in html and ">one<" not in html, url
    host_page = client.get(reverse("host", args=[own.host.name])).content.decode()
    assert 'id="host-bmc"' not in host_page


def test_members_see_only_hosts_that_serve_them(client, reconciled):
    as_user(client, reconciled["bob"])
    free = BareMetalHost.objects.filter(state=HostState.AVAILABLE).first()
    assert client.get(reverse("host", args=[free.name])).status_code == 404


def test_an_auditor_sees_everything_and_changes_nothing(client, reconciled):
    as_user(client, reconciled["auditor"])
    assert client.get(reverse("fleet")).status_code == 200
    assert client.get(reverse("tenant", args=["one"])).status_code == 200
    assert client.get(reverse("apply")).status_code == 403
    assert client.post(reverse("pool-quantity", args=["one", "gpu"]), {"quantity": 2}).status_code == 403
    assert pool("one", "gpu").quantity == 1


# --- the tenant's self-service page ------------------------------------------------------------------------

def test_a_member_changes_a_pool_quantity_within_the_quota(client, users):
    as_user(client, users["alice"])
    gpu = pool("one", "gpu")
    response = client.post(reverse("pool-quantity", args=["one", "gpu"]), {"quantity": 2, "version": gpu.version})
    assert response.status_code == 302
    assert pool("one", "gpu").quantity == 2
    event = Event.objects.filter(object_type="pool", object_name="one/gpu").latest("pk")
    assert event.actor == "user:alice" and "quantity: 0 → 2" in event.message


def test_quota_exceeded_is_a_clear_error_next_to_the_field_and_nothing_changes(client, users):
    as_user(client, users["alice"])
    gpu = pool("one", "gpu")
    events = Event.objects.count()
    response = client.post(reverse("pool-quantity", args=["one", "gpu"]), {"quantity": 3, "version": gpu.version})
    assert response.status_code == 400
    html = response.content.decode()
    assert f'id="pool-{gpu.pk}-error"' in html
    assert "tenant one may have at most 2 node(s); these pools ask for 3" in html
    assert pool("one", "gpu").quantity == 0 and pool("one", "gpu").version == gpu.version
    assert Event.objects.count() == events
    assert not NodeClaim.objects.filter(tenant__name="one").exists()
    # The same through htmx: the pool's quantity cell comes back with the error, ready to retry.
    response = client.post(reverse("pool-quantity", args=["one", "gpu"]), {"quantity": 3, "version": gpu.version},
                           HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith(f'<td id="pool-{gpu.pk}-quantity">')
    assert "at most 2 node(s)" in response.content.decode()


def test_a_stale_quantity_form_is_refused(client, users):
    as_user(client, users["alice"])
    gpu = pool("one", "gpu")
    response = client.post(reverse("pool-quantity", args=["one", "gpu"]), {"quantity": 1, "version": gpu.version + 5})
    assert response.status_code == 400
    assert "changed meanwhile" in response.content.decode()
    assert pool("one", "gpu").quantity == 0


def test_the_join_button_says_clearly_when_the_tenant_has_no_api_credentials(client, users):
    as_user(client, users["alice"])
    response = client.post(reverse("tenant-join", args=["one"]), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert "has no API credentials (kubeconfig)" in response.content.decode()


def test_the_join_button_shows_a_fresh_token_once(client, users, monkeypatch):
    from claims import tenant_api

    made = []

    def fake_token(self, ttl_s=3600, description=""):
        import datetime

        token = tenant_api.BootstrapToken(id="abcdef", secret="0123456789abcdef",
                                          expires_at=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))
        made.append(description)
        return token

    monkeypatch.setattr(tenant_api.TenantAPI, "create_bootstrap_token", fake_token)
    Tenant.objects.filter(name="one").update(api_endpoint="10.0.0.5:443")
    tenant = Tenant.objects.get(name="one")
    tenant.kubeconfig = "apiVersion: v1\nclusters:\n- name: one\n  cluster:\n    server: https://10.0.0.5:443\n"
    tenant.save(update_fields=["kubeconfig"])
    as_user(client, users["alice"])
    page = client.get(reverse("tenant", args=["one"])).content.decode()
    assert "0123456789abcdef" not in page
    response = client.post(reverse("tenant-join", args=["one"]), HTTP_HX_REQUEST="true")
    html = unescape(response.content.decode())
    assert 'curl -fsSL "https://10.0.0.5:443/node/join?token=abcdef.0123456789abcdef" | sh -' in html
    assert made == ["manual join by alice"]
    event = Event.objects.filter(object_type="tenant", kind="action").latest("pk")
    assert "abcdef" in event.message and "0123456789abcdef" not in event.message
    assert "0123456789abcdef" not in client.get(reverse("tenant", args=["one"])).content.decode()


# --- host actions ------------------------------------------------------------------------------------------

def test_host_actions_ask_for_confirmation_then_go_through_the_services(client, users):
    as_user(client, users["admin"])
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    url = reverse("host-action", args=[host.name, "maintenance-on"])
    confirm = client.get(url)
    assert confirm.status_code == 200 and "Maintenance on" in confirm.content.decode()
    host.refresh_from_db()
    assert host.state == HostState.AVAILABLE  # a GET changes nothing
    response = client.post(url, {"reason": "fan swap"}, follow=True)
    host.refresh_from_db()
    assert host.state == HostState.MAINTENANCE
    assert "Maintenance on: done" in response.content.decode()
    assert Event.objects.filter(host_id=host.pk, to_state="maintenance", actor="user:root-admin",
                                message="fan swap").exists()
    refused = client.post(reverse("host-action", args=[host.name, "retry"]), follow=True)
    assert "only a host in error can be retried" in refused.content.decode()


# --- catalogue forms: the same validation as apply, errors next to the field ---------------------------------

def test_forms_show_the_models_errors_next_to_the_field(client, users):
    as_user(client, users["admin"])
    provider = NodeProvider.objects.get(name="metal3")
    response = client.post(reverse("catalogue-create", args=["node-types"]), {
        "name": "Bad_Name", "provider": provider.pk, "resources": "cpu: lots", "host_selector": "matchLabels: [1",
        "properties": "", "cost": ""})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="error-name"' in html
    assert 'id="error-host_selector"' in html and "not valid YAML" in html
    response = client.post(reverse("catalogue-create", args=["node-types"]), {
        "name": "big-gpu", "provider": provider.pk, "resources": "cpu: lots", "host_selector": "", "properties": ""})
    assert 'id="error-resources"' in response.content.decode() and "is not a quantity" in response.content.decode()
    response = client.post(reverse("catalogue-create", args=["images"]), {
        "name": "img", "url": "ftp://x", "checksum": "abc", "format": "raw", "properties": ""})
    html = response.content.decode()
    assert 'id="error-url"' in html and 'id="error-checksum"' in html
    assert not NodeType.objects.filter(name="big-gpu").exists() and not OSImage.objects.filter(name="img").exists()
    response = client.post(reverse("catalogue-create", args=["environments"]), {
        "name": "net", "namespace": "p-default",
        "properties": "metal3.vcluster.com/network-cidr: 10.0.0.1/24\nmetal3.vcluster.com/network-ip-range: 10.9.0.1-10.9.0.5"})
    assert 'id="error-properties"' in response.content.decode() and "is outside" in response.content.decode()


def test_forms_create_and_edit_through_the_event_log(client, users):
    as_user(client, users["admin"])
    provider = NodeProvider.objects.get(name="metal3")
    response = client.post(reverse("catalogue-create", args=["node-types"]), {
        "name": "big-gpu", "provider": provider.pk, "resources": 'cpu: 256\nnvidia.com/gpu: "8"',
        "host_selector": "matchLabels:\n  role: big", "properties": "", "cost": "90000", **GATE_AS_SHOWN})
    assert response.status_code == 302
    big = NodeType.objects.get(name="big-gpu")
    assert big.resources == {"cpu": "256", "nvidia.com/gpu": "8"} and big.host_selector == {"matchLabels": {"role": "big"}}
    assert Event.objects.filter(object_type="nodetype", object_name="big-gpu", actor="user:root-admin").exists()
    page = client.get(reverse("node-types")).content.decode()
    assert 'data-node-type="gpu-server"' in page
    edit = reverse("catalogue-edit", args=["tenants", "one"])
    response = client.post(edit, {"namespace": "p-default", "display_name": "Team One", "api_endpoint": "10.0.0.9:443",
                                  "join_mode": "vcluster", "quota_nodes": "4", "kubeconfig": ""})
    assert response.status_code == 302
    one = Tenant.objects.get(name="one")
    assert (one.display_name, one.quota_nodes, one.name) == ("Team One", 4, "one")
    assert NodeEnvironment.objects.exists()


# What a browser sends for the release gate's fields of a new NodeType, as the form shows them.
GATE_AS_SHOWN = {"cleaning_policy": "full", "cleaning_fallback": "", "erase_concurrency": "4",
                 "erase_verify_share": "0.01", "health_dcgm_level": "2", "health_nccl_min_busbw_gbps": ""}


def test_the_node_type_form_shows_and_checks_cleaning_and_health_next_to_each_field(client, users):
    as_user(client, users["admin"])
    gpu = NodeType.objects.get(name="gpu-server")
    edit = reverse("catalogue-edit", args=["node-types", gpu.name])
    html = client.get(edit).content.decode()
    for name in GATE_AS_SHOWN:
        assert f'name="{name}"' in html, name
    assert '<option value="secure">' in html and 'name="erase_verify_full"' in html
    form = {"provider": gpu.provider_id, "resources": "cpu: '192'", "host_selector": "matchLabels: {role: gpu}",
            "properties": "", "cost": ""}
    response = client.post(edit, {**form, **GATE_AS_SHOWN, "cleaning_policy": "secure", "cleaning_fallback": "secure",
                                  "erase_verify_share": "5", "health_dcgm_level": "7",
                                  "health_nccl_min_busbw_gbps": "-3", "erase_concurrency": "0"})
    assert response.status_code == 400
    html = unescape(response.content.decode())
    for field, message in (("cleaning_fallback", "a fallback must differ from the method"),
                           ("erase_verify_share", "between 0 (excluded) and 1"),
                           ("health_dcgm_level", "dcgmi diag levels are 1 to 4"),
                           ("health_nccl_min_busbw_gbps", "a bus bandwidth in GB/s above 0"),
                           ("erase_concurrency", "at least 1 disk at a time")):
        error = html[html.index(f'id="error-{field}"'):]
        assert message in error[: error.index("</ul>")], field
    assert NodeType.objects.get(pk=gpu.pk).cleaning_policy == "full"
    response = client.post(edit, {**form, **GATE_AS_SHOWN, "cleaning_policy": "secure", "cleaning_fallback": "full",
                                  "erase_verify_full": "on", "health_nccl_min_busbw_gbps": "400"})
    assert response.status_code == 302
    gpu.refresh_from_db()
    assert (gpu.cleaning_policy, gpu.cleaning_fallback, gpu.erase_verify_full, gpu.health_nccl_min_busbw_gbps) == \
        ("secure", "full", True, 400.0)
    assert Event.objects.filter(object_type="nodetype", object_name="gpu-server", actor="user:root-admin",
                                message__contains="cleaning_policy: full → secure").exists()
    page = client.get(reverse("node-types")).content.decode()
    row = page[page.index(f'id="node-type-{gpu.pk}"'):]
    row = unescape(row[: row.index("</tr>")])
    assert '<b class="cleaning-policy">secure</b>, else full' in row and "read back: every byte" in row
    assert "dcgmi diag -r 2" in row and "NCCL ≥ 400 GB/s" in row


def test_node_type_capacity_counts_hosts(client, reconciled):
    as_user(client, reconciled["admin"])
    html = client.get(reverse("node-types")).content.decode()
    gpu = NodeType.objects.get(name="gpu-server")
    row = html[html.index(f'id="node-type-{gpu.pk}"'):]
    row = row[: row.index("</tr>")]
    assert '<td class="cap-total">4</td>' in row
    assert '<td class="cap-provisioned">1</td>' in row and '<td class="cap-available">3</td>' in row


# --- YAML apply --------------------------------------------------------------------------------------------

APPLY_IMAGE = """apiVersion: management.loft.sh/v1
kind: OSImage
metadata:
  name: ubuntu2404-20261201
spec:
  properties:
    metal3.vcluster.com/image-url: http://127.0.0.1:8000/images/new.raw
    metal3.vcluster.com/image-checksum: 3f1c0c3a2f1e8b7d6a5c4b3a29180706f5e4d3c2b1a09f8e7d6c5b4a39281706
"""


def test_apply_shows_the_dry_run_first_then_applies(client, users):
    as_user(client, users["admin"])
    preview = client.post(reverse("apply"), {"text": APPLY_IMAGE, "action": "preview"})
    html = preview.content.decode()
    assert "Preview (dry run): 1 change(s) would be made" in html and 'id="apply-button"' in html
    assert '<span class="muted">osimage</span> <b>ubuntu2404-20261201</b> would be created' in html  # no page yet
    assert not OSImage.objects.filter(name="ubuntu2404-20261201").exists()
    applied = client.post(reverse("apply"), {"text": APPLY_IMAGE, "action": "apply"}).content.decode()
    # The applied object's name links to its page.
    assert ('<span class="muted">osimage</span> <a href="/catalogue/images/ubuntu2404-20261201/edit/">'
            'ubuntu2404-20261201</a> created') in applied
    assert OSImage.objects.get(name="ubuntu2404-20261201")
    upload = io.BytesIO(APPLY_IMAGE.replace("new.raw", "newer.raw").encode())
    upload.name = "image.yaml"
    diff = client.post(reverse("apply"), {"file": upload, "action": "preview"}).content.decode()
    # An update lists each changed key with its value before and after, a row each.
    assert ('<tr data-key="url"><td class="mono">url</td><td class="mono">http://127.0.0.1:8000/images/new.raw</td>'
            '<td class="mono">http://127.0.0.1:8000/images/newer.raw</td></tr>') in diff
    assert "ubuntu2404-20261201</a> would change" in diff and "Preview (dry run)" in diff


def test_apply_errors_show_next_to_the_text_and_change_nothing(client, users):
    as_user(client, users["admin"])
    bad = APPLY_IMAGE.replace("kind: OSImage", "kind: OSImagez")
    response = client.post(reverse("apply"), {"text": bad, "action": "apply"})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="error-text"' in html and "unknown kind" in html
    assert not OSImage.objects.filter(name="ubuntu2404-20261201").exists()
    vcluster = "privateNodes:\n  enabled: true\n  autoNodes: []\n"
    response = client.post(reverse("apply"), {"text": vcluster, "action": "preview"})
    html = unescape(response.content.decode())
    assert "give a tenant name in the Tenant field" in html and "--tenant" not in html


VCLUSTER_YAML = "privateNodes:\n  enabled: true\n  autoNodes: []\n"


def test_apply_creates_a_tenant_from_a_vcluster_yaml_only_when_asked(client, users):
    as_user(client, users["admin"])
    tenants = set(Tenant.objects.values_list("name", flat=True))
    events = Event.objects.count()
    form = {"text": VCLUSTER_YAML, "tenant": "onee"}
    page = client.get(reverse("apply")).content.decode()
    assert 'name="create_tenant"' in page and "checked" not in page.split('name="create_tenant"', 1)[1][:40]
    preview = unescape(client.post(reverse("apply"), {**form, "action": "preview"}).content.decode())
    assert "virtualclusterinstance/onee created (dry run)" in preview
    assert "tenant 'onee' does not exist: it would be created. Apply creates it only with \"Create tenant\" " \
           "ticked" in preview
    refused = client.post(reverse("apply"), {**form, "action": "apply"})
    assert refused.status_code == 400
    html = unescape(refused.content.decode())
    assert "tenant 'onee' does not exist: nothing was applied" in html and 'tick "Create tenant"' in html
    assert "--tenant" not in html
    assert set(Tenant.objects.values_list("name", flat=True)) == tenants and Event.objects.count() == events
    # An existing tenant needs no tick; a new one is made when it is ticked.
    assert client.post(reverse("apply"), {**form, "tenant": "one", "action": "apply"}).status_code == 200
    preview = unescape(client.post(reverse("apply"), {**form, "create_tenant": "on", "action": "preview"})
                       .content.decode())
    assert "apply-note" not in preview and not Tenant.objects.filter(name="onee").exists()
    applied = unescape(client.post(reverse("apply"), {**form, "create_tenant": "on", "action": "apply"})
                       .content.decode())
    assert "virtualclusterinstance/onee created" in applied and Tenant.objects.filter(name="onee").exists()


# --- claims and timing ------------------------------------------------------------------------------------

def test_claims_list_filters_by_phase(client, reconciled):
    as_user(client, reconciled["admin"])
    html = client.get(reverse("claims"), {"phase": ClaimPhase.PROVISIONING}).content.decode()
    assert html.count('data-phase="Provisioning"') >= 2
    assert client.get(reverse("claims"), {"phase": ClaimPhase.AVAILABLE}).content.decode().count("<tr id=\"claim-") == 0


def test_the_timing_page_charts_p50_and_p95_per_step(client, users):
    from events.services import event_record

    host = BareMetalHost.objects.first()
    for i, seconds in enumerate([10, 20, 30, 40, 100]):
        event_record(kind="step", object_type="host", object_name=host.name, host=host, step="write_image",
                     message="done", duration_s=seconds, actor="system:flow", data={"flow": "provision"})
    host_set_maintenance(host=host, on=True, actor="test")
    as_user(client, users["auditor"])
    html = client.get(reverse("timing")).content.decode()
    assert '<svg id="timing-chart"' in html and 'data-step="write_image"' in html
    row = html[html.index('<tr data-step="write_image">'):]
    assert "<td>5</td><td>30.00 s</td><td>88.00 s</td>" in row[: row.index("</tr>")]
    assert '<svg id="state-history"' in html and 'data-state="maintenance"' in html
