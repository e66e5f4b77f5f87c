"""The Django admin, used as an operator uses it: every page loads, secrets never show, and writes go
through the services with the admin named in the Event log."""
import io
import json

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from hosts.services import host_transition
from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant

from .factories import form_data, messages_of

pytestmark = pytest.mark.django_db

MODELS = [NodeProvider, NodeType, NodeEnvironment, OSImage, Tenant, NodePool, BareMetalHost, NodeClaim, Event]
KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: one\n  user:\n    token: kc-token-5f1e9a\n"


@pytest.fixture
def site(demo_site, apply, seed_block):
    """The demo site, tenant `one` with its seed pools (gpu: 1, cpu: 1), and their claims allocated."""
    apply(seed_block, tenant="one")
    call_command("reconcile", stdout=io.StringIO())


def url(model, view, *args):
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def host_action(client, action, hosts):
    return action_on(client, BareMetalHost, action, hosts)


def action_on(client, model, action, objects):
    """Run a changelist action and follow to the page that shows (and so consumes) its messages."""
    response = client.post(url(model, "changelist"), {"action": action, "_selected_action": [o.pk for o in objects]},
                           follow=True)
    assert response.redirect_chain == [(url(model, "changelist"), 302)]
    return response


def available_host(role="gpu") -> BareMetalHost:
    return BareMetalHost.objects.filter(state="available", name__startswith=role).order_by("name").first()


# --- Every page loads ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_each_models_list_and_change_pages_load(admin_client, site, model):
    objects = list(model.objects.all()[:3])
    assert objects, f"the site has no {model.__name__}"
    listing = admin_client.get(url(model, "changelist"))
    assert listing.status_code == 200
    html = listing.content.decode()
    for obj in objects:
        assert url(model, "change", obj.pk) in html
        assert admin_client.get(url(model, "change", obj.pk)).status_code == 200


@pytest.mark.parametrize("model", [m for m in MODELS if m not in (NodeClaim, Event)], ids=lambda m: m.__name__)
def test_add_pages_load_for_configuration(admin_client, site, model):
    assert admin_client.get(url(model, "add")).status_code == 200


def test_claims_are_not_added_by_hand(admin_client, site):
    assert admin_client.get(url(NodeClaim, "add")).status_code == 403


def test_host_list_shows_state_labels_claim_and_filters_by_label(admin_client, site):
    claimed = NodeClaim.objects.get(pool_name="gpu").host
    page = admin_client.get(url(BareMetalHost, "changelist"), {"label": "role=cpu"})
    html = page.content.decode()
    assert "cpu-01" in html and "gpu-01" not in html
    page = admin_client.get(url(BareMetalHost, "changelist"), {"state__exact": "provisioning", "q": "gpu"})
    html = page.content.decode()
    assert [h.name for h in page.context["cl"].result_list] == [claimed.name]
    assert "role=gpu" in html and "one-" in html  # its labels and its claim (named after the tenant)


def test_event_list_filters_by_kind_and_object_type_and_searches(admin_client, site):
    page = admin_client.get(url(Event, "changelist"), {"kind__exact": "transition", "object_type": "claim",
                                                       "q": "cli:reconcile"})
    events = list(page.context["cl"].result_list)
    assert events and all(e.kind == "transition" and e.object_type == "claim" and e.actor == "cli:reconcile"
                          for e in events)


# --- Lists do not query per row -------------------------------------------------------------------------

def test_node_type_list_counts_capacity_once_per_page(admin_client, site):
    with CaptureQueriesContext(connection) as two_types:
        page = admin_client.get(url(NodeType, "changelist"))
    capacity = {t.name: t.capacity for t in page.context["cl"].result_list}
    assert capacity["gpu-server"] == {"total": 4, "available": 3, "held_back": 0, "provisioned": 1,
                                      "preparing": 0, "repair": 0, "error": 0, "maintenance": 0, "held": 0, "retired": 0}
    provider = NodeProvider.objects.get()
    for i in range(4):
        NodeType.objects.create(name=f"extra-{i}", provider=provider, host_selector={"matchLabels": {"rack": "r1"}})
    with CaptureQueriesContext(connection) as six_types:
        page = admin_client.get(url(NodeType, "changelist"))
    assert len(page.context["cl"].result_list) == 6
    assert len(six_types) == len(two_types)


def test_host_list_does_not_query_per_host(admin_client, site):
    with CaptureQueriesContext(connection) as eight:
        admin_client.get(url(BareMetalHost, "changelist"))
    for i in range(4):
        BareMetalHost.objects.create(name=f"extra-{i}", bmc_address=f"redfish+http://127.0.0.1:8001/x{i}",
                                     boot_mac=f"52:54:00:00:01:0{i}", labels={"role": "gpu"})
    with CaptureQueriesContext(connection) as twelve:
        admin_client.get(url(BareMetalHost, "changelist"))
    assert len(twelve) == len(eight)


# --- Secrets are write-only -----------------------------------------------------------------------------

def test_host_pages_never_show_bmc_credentials(admin_client, site):
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.bmc_password == "demo-password-gpu-01"
    host.bmc_username = "bmc-operator-7f3a"
    host.save(update_fields=["bmc_username"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT bmc_password FROM hosts_baremetalhost WHERE id = %s", [host.pk])
        ciphertext = cursor.fetchone()[0]
    for page in (admin_client.get(url(BareMetalHost, "changelist")),
                 admin_client.get(url(BareMetalHost, "changelist"), {"q": "gpu-01"}),
                 admin_client.get(url(BareMetalHost, "change", host.pk))):
        html = page.content.decode()
        assert page.status_code == 200
        assert "demo-password" not in html
        assert "bmc-operator-7f3a" not in html
        assert ciphertext not in html
    assert "password set (not shown)" in html


def test_a_new_bmc_password_is_set_through_the_form_never_shown_and_empty_keeps_it(admin_client, site):
    host = BareMetalHost.objects.get(name="gpu-02")
    change = url(BareMetalHost, "change", host.pk)
    data = form_data(admin_client.get(change))
    assert data["new_bmc_password"] == "" and "bmc_password" not in data
    response = admin_client.post(change, {**data, "new_bmc_password": "n3w-pa55-gpu-02"})
    assert response.status_code == 302
    host.refresh_from_db()
    assert (host.bmc_username, host.bmc_password) == ("admin", "n3w-pa55-gpu-02")
    event = Event.objects.filter(host=host, kind="change").latest("id")
    assert event.actor == "user:admin"
    assert "n3w-pa55" not in event.message + json.dumps(event.data)
    assert event.data == {"bmc_password": ["(set)", "(set)"]}
    assert "n3w-pa55" not in admin_client.get(change).content.decode()

    data = form_data(admin_client.get(change))
    response = admin_client.post(change, {**data, "labels": json.dumps({"role": "gpu", "rack": "r9"})})
    assert response.status_code == 302
    host.refresh_from_db()
    assert host.bmc_password == "n3w-pa55-gpu-02"
    assert host.labels == {"role": "gpu", "rack": "r9"}
    event = Event.objects.filter(host=host, kind="change").latest("id")
    assert (event.actor, list(event.data)) == ("user:admin", ["labels"])


def test_tenant_pages_never_show_the_kubeconfig_and_a_new_one_can_be_set(admin_client, site):
    tenant = Tenant.objects.get(name="one")
    tenant.kubeconfig = KUBECONFIG
    tenant.save(update_fields=["kubeconfig"])
    change = url(Tenant, "change", tenant.pk)
    for page in (admin_client.get(url(Tenant, "changelist")), admin_client.get(change)):
        assert page.status_code == 200
        assert "kc-token-5f1e9a" not in page.content.decode()
    data = form_data(admin_client.get(change))
    assert data["new_kubeconfig"] == ""
    response = admin_client.post(change, {**data, "new_kubeconfig": KUBECONFIG.replace("5f1e9a", "77aa00")})
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert "kc-token-77aa00" in tenant.kubeconfig
    event = Event.objects.filter(tenant=tenant, object_type="tenant", kind="change").latest("id")
    assert event.actor == "user:admin" and "kc-token" not in event.message + json.dumps(event.data)
    assert "kc-token" not in admin_client.get(change).content.decode()


# --- Host actions go through hosts.services ------------------------------------------------------------

def test_maintenance_on_then_off_moves_the_host_and_names_the_admin(admin_client, site):
    host = available_host()
    response = host_action(admin_client, "maintenance_on", [host])
    host.refresh_from_db()
    assert host.state == "maintenance"
    event = Event.objects.filter(host=host, to_state="maintenance").get()
    assert (event.from_state, event.actor) == ("available", "user:admin")
    assert ("success", f"Maintenance on: {host.name} → maintenance") in messages_of(response)

    response = host_action(admin_client, "maintenance_off", [host])
    host.refresh_from_db()
    assert host.state == "registering"
    event = Event.objects.filter(host=host, from_state="maintenance", to_state="registering").get()
    assert event.actor == "user:admin"


def test_maintenance_on_a_claimed_host_is_refused_with_a_warning_and_others_still_move(admin_client, site):
    claimed = NodeClaim.objects.get(pool_name="gpu").host
    free = available_host()
    response = host_action(admin_client, "maintenance_on", [claimed, free])
    claimed.refresh_from_db()
    free.refresh_from_db()
    assert (claimed.state, free.state) == ("provisioning", "maintenance")
    warnings = [text for level, text in messages_of(response) if level == "warning"]
    assert len(warnings) == 1 and claimed.name in warnings[0] and "release its claim first" in warnings[0]


def test_retry_on_a_host_not_in_error_warns_and_changes_nothing(admin_client, site):
    host = available_host()
    events = Event.objects.count()
    response = host_action(admin_client, "retry", [host])
    host.refresh_from_db()
    assert host.state == "available"
    assert Event.objects.count() == events
    assert messages_of(response) == [
        ("warning", f"Retry: {host.name} is available; only a host in error can be retried")]


def test_retry_on_a_host_in_error_registers_it_again(admin_client, site):
    host = available_host("cpu")
    host_transition(host=host, to_state="maintenance", actor="test")
    host_transition(host=host, to_state="registering", actor="test")
    host_transition(host=host, to_state="error", actor="test", reason="BMC unreachable")
    host_action(admin_client, "retry", [host])
    host.refresh_from_db()
    assert host.state == "registering"
    event = Event.objects.filter(host=host, from_state="error").get()
    assert event.actor == "user:admin" and "BMC unreachable" in event.message


def test_host_state_and_claim_phase_are_read_only(admin_client, site):
    host = available_host()
    change = url(BareMetalHost, "change", host.pk)
    data = form_data(admin_client.get(change))
    assert "state" not in data
    assert admin_client.post(change, {**data, "state": "error"}).status_code == 302
    host.refresh_from_db()
    assert host.state == "available"

    claim = NodeClaim.objects.get(pool_name="gpu")
    change = url(NodeClaim, "change", claim.pk)
    data = form_data(admin_client.get(change))
    assert "phase" not in data
    assert admin_client.post(change, {**data, "phase": "Released", "node_name": "gpu-node-a"}).status_code == 302
    claim.refresh_from_db()
    assert (claim.phase, claim.node_name) == ("Provisioning", "gpu-node-a")
    assert Event.objects.filter(claim=claim, kind="change").get().actor == "user:admin"


# --- Pools: through pool_create / pool_update ------------------------------------------------------------

@pytest.fixture
def reconciles(monkeypatch):
    """The pool ids each triggered reconcile was for (instead of sending the Celery task)."""
    calls = []
    monkeypatch.setattr("pools.services.pools_changed", lambda *, pool_ids: calls.append(pool_ids))
    return calls


def test_pool_quantity_beyond_the_tenant_quota_is_a_form_error_and_changes_nothing(admin_client, site, reconciles):
    Tenant.objects.filter(name="one").update(quota_nodes=2)
    pool = NodePool.objects.get(tenant__name="one", name="gpu")
    change = url(NodePool, "change", pool.pk)
    events = Event.objects.count()
    response = admin_client.post(change, {**form_data(admin_client.get(change)), "quantity": "5"})
    assert response.status_code == 200
    assert "tenant one may have at most 2 node(s); these pools ask for 6" in response.content.decode()
    assert response.context["adminform"].form.errors["quantity"]
    pool.refresh_from_db()
    assert (pool.quantity, pool.version) == (1, 1)
    assert Event.objects.count() == events
    assert reconciles == []


def test_pool_quantity_within_quota_goes_through_the_service_and_reconciles(
        admin_client, site, reconciles, django_capture_on_commit_callbacks):
    Tenant.objects.filter(name="one").update(quota_nodes=3)
    pool = NodePool.objects.get(tenant__name="one", name="gpu")
    change = url(NodePool, "change", pool.pk)
    data = form_data(admin_client.get(change))
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(change, {**data, "quantity": "2"})
    assert response.status_code == 302
    pool.refresh_from_db()
    assert (pool.quantity, pool.version) == (2, 2)
    event = Event.objects.filter(object_type="pool", kind="change").latest("id")
    assert (event.object_name, event.actor, event.message) == ("one/gpu", "user:admin", "quantity: 1 → 2")
    assert reconciles == [[pool.pk]]


def test_a_pool_form_from_an_older_version_is_refused(admin_client, site, reconciles):
    pool = NodePool.objects.get(tenant__name="one", name="gpu")
    change = url(NodePool, "change", pool.pk)
    data = form_data(admin_client.get(change))
    NodePool.objects.filter(pk=pool.pk).update(version=2)  # someone else saved meanwhile
    response = admin_client.post(change, {**data, "quantity": "2"})
    assert response.status_code == 200
    assert "changed meanwhile" in response.content.decode()
    pool.refresh_from_db()
    assert pool.quantity == 1


def test_other_pool_fields_are_recorded_and_bump_the_version(admin_client, site, reconciles,
                                                             django_capture_on_commit_callbacks):
    pool = NodePool.objects.get(tenant__name="one", name="cpu")
    change = url(NodePool, "change", pool.pk)
    data = form_data(admin_client.get(change))
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(change, {**data, "node_labels": json.dumps({"workload": "batch"})})
    assert response.status_code == 302
    pool.refresh_from_db()
    assert (pool.node_labels, pool.version) == ({"workload": "batch"}, 2)
    assert Event.objects.filter(object_type="pool", kind="change").latest("id").actor == "user:admin"
    assert reconciles == [[pool.pk]]


def test_a_quota_refusal_at_save_time_is_reported_and_nothing_is_saved(admin_client, site, reconciles, monkeypatch):
    """Another writer used up the quota between the form's check and the save: no 500, no partial save."""
    Tenant.objects.filter(name="one").update(quota_nodes=2)
    monkeypatch.setattr("pools.admin.tenant_check_quota", lambda **kwargs: None)  # the form's check passed
    pool = NodePool.objects.get(tenant__name="one", name="gpu")
    change = url(NodePool, "change", pool.pk)
    data = form_data(admin_client.get(change))
    log_entries = LogEntry.objects.count()
    response = admin_client.post(change, {**data, "quantity": "5", "node_labels": json.dumps({"w": "x"})},
                                 follow=True)
    assert response.redirect_chain == [(change, 302)]
    assert messages_of(response) == [
        ("error", "Nothing was saved: tenant one may have at most 2 node(s); these pools ask for 6")]
    pool.refresh_from_db()
    assert (pool.quantity, pool.node_labels, pool.version) == (1, {"workload": "gpu"}, 1)
    assert not Event.objects.filter(object_type="pool", kind="change", actor="user:admin").exists()
    assert LogEntry.objects.count() == log_entries


def test_deleting_a_pool_releases_its_claims_and_names_the_admin(admin_client, site):
    pool = NodePool.objects.get(tenant__name="one", name="cpu")
    claim = NodeClaim.objects.get(pool=pool)
    response = admin_client.post(url(NodePool, "delete", pool.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not NodePool.objects.filter(pk=pool.pk).exists()
    claim.refresh_from_db()
    assert claim.phase == "Releasing"
    assert Event.objects.filter(claim=claim, to_state="Releasing").get().actor == "user:admin"
    deleted = Event.objects.get(object_type="pool", message="deleted")
    assert (deleted.object_name, deleted.actor) == ("one/cpu", "user:admin")


def test_deleting_a_tenant_releases_its_claims_and_it_goes_when_they_are_released(admin_client, site):
    tenant = Tenant.objects.get(name="one")
    confirm = admin_client.get(url(Tenant, "delete", tenant.pk))
    assert confirm.status_code == 200 and b"protected" not in confirm.content.lower()  # claims do not block it
    response = admin_client.post(url(Tenant, "delete", tenant.pk), {"post": "yes"}, follow=True)
    assert ("warning", "tenant one is being deleted: it goes once its claims are released") in messages_of(response)
    tenant.refresh_from_db()
    assert tenant.deleting_since and not tenant.pools.exists()
    assert set(tenant.claims.values_list("phase", flat=True)) == {"Releasing"}
    assert set(Event.objects.filter(tenant=tenant, to_state="Releasing").values_list("actor", flat=True)) == {"user:admin"}

# --- Config objects: plain saves, recorded -----------------------------------------------------------------

def test_editing_a_node_type_records_an_event_with_the_admin(admin_client, site):
    node_type = NodeType.objects.get(name="gpu-server")
    change = url(NodeType, "change", node_type.pk)
    response = admin_client.post(change, {**form_data(admin_client.get(change)), "zone": "eu-1a"})
    assert response.status_code == 302
    node_type.refresh_from_db()
    assert node_type.zone == "eu-1a"
    event = Event.objects.filter(object_type="nodetype").latest("id")
    assert (event.object_name, event.actor, event.message) == ("gpu-server", "user:admin", "zone:  → eu-1a")


def test_an_invalid_value_is_a_form_error(admin_client, site):
    image = OSImage.objects.get()
    change = url(OSImage, "change", image.pk)
    response = admin_client.post(change, {**form_data(admin_client.get(change)), "checksum": "not-hex"})
    assert response.status_code == 200
    assert "must be hexadecimal" in response.content.decode()


def test_a_tenant_quota_below_its_pools_is_saved_with_a_warning(admin_client, site):
    tenant = Tenant.objects.get(name="one")
    change = url(Tenant, "change", tenant.pk)
    response = admin_client.post(change, {**form_data(admin_client.get(change)), "quota_nodes": "1"})
    assert response.status_code == 302
    assert ("warning", "tenant one's pools ask for 2 node(s), more than its new quota of 1: nothing is released; "
                       "its pools may shrink, but not grow, until they fit") in messages_of(response)
    tenant.refresh_from_db()
    assert tenant.quota_nodes == 1


def test_adding_a_host_records_it_with_its_credentials_masked(admin_client, site):
    add = url(BareMetalHost, "add")
    data = {**form_data(admin_client.get(add)), "name": "gpu-09",
            "bmc_address": "redfish+http://10.0.9.9/redfish/v1/Systems/1", "bmc_credentials_name": "gpu-09-bmc", "boot_mac": "52:54:00:00:09:09", "labels": '{"role": "gpu"}',
            "new_bmc_username": "root", "new_bmc_password": "pw-gpu-09"}
    assert admin_client.post(add, data).status_code == 302
    host = BareMetalHost.objects.get(name="gpu-09")
    assert (host.state, host.bmc_username, host.bmc_password) == ("registering", "root", "pw-gpu-09")
    event = Event.objects.get(host=host)  # registered as apply and the API register (hosts.services.host_create)
    assert (event.kind, event.to_state, event.actor, event.message) == ("transition", "registering", "user:admin",
                                                                        "created")
    assert "pw-gpu-09" not in event.message + json.dumps(event.data)


def test_a_host_serving_a_claim_cannot_be_deleted_and_a_free_one_is_deleted_on_the_record(admin_client, site):
    claimed = NodeClaim.objects.get(pool_name="gpu").host
    page = admin_client.get(url(BareMetalHost, "delete", claimed.pk)).content.decode()
    assert f"{claimed.name} cannot be deleted: it serves claim" in page and "must be released first" in page
    admin_client.post(url(BareMetalHost, "delete", claimed.pk), {"post": "yes"})
    assert BareMetalHost.objects.filter(pk=claimed.pk).exists()  # refused (hosts.services.host_delete says why)
    free = available_host("cpu")
    assert admin_client.post(url(BareMetalHost, "delete", free.pk), {"post": "yes"}).status_code == 302
    assert not BareMetalHost.objects.filter(pk=free.pk).exists()
    event = Event.objects.get(object_type="host", object_name=free.name, message="deleted")
    assert event.actor == "user:admin"


def test_a_hosts_event_log_link_lists_its_events(admin_client, site):
    host = NodeClaim.objects.get(pool_name="gpu").host
    page = admin_client.get(url(BareMetalHost, "change", host.pk))
    link = f"{url(Event, 'changelist')}?host__id__exact={host.pk}"
    assert link in page.content.decode()
    events = admin_client.get(link).context["cl"].result_list
    assert events and {e.host_id for e in events} == {host.pk}

# --- Claims: release through claims.phases ------------------------------------------------------------------

def test_release_action_releases_through_the_service(admin_client, site):
    claim = NodeClaim.objects.get(pool_name="gpu")
    host = claim.host
    action_on(admin_client, NodeClaim, "release", [claim])
    claim.refresh_from_db()
    host.refresh_from_db()
    assert (claim.phase, host.state) == ("Releasing", "deprovisioning")
    event = Event.objects.filter(claim=claim, to_state="Releasing").get()
    assert (event.actor, event.message) == ("user:admin", "released by admin")

    response = action_on(admin_client, NodeClaim, "release", [claim])
    assert messages_of(response) == [("warning", f"Release: {claim.name} is Releasing already")]


def test_a_claim_holding_a_host_cannot_be_deleted(admin_client, site):
    claim = NodeClaim.objects.get(pool_name="gpu")
    assert admin_client.get(url(NodeClaim, "delete", claim.pk)).status_code == 403


# --- The Event log is append-only ----------------------------------------------------------------------------

def test_the_event_log_cannot_be_added_changed_or_deleted(admin_client, site):
    event = Event.objects.order_by("id").first()
    count = Event.objects.count()
    assert admin_client.get(url(Event, "add")).status_code == 403
    assert admin_client.post(url(Event, "add"), {"message": "forged"}).status_code == 403
    view = admin_client.get(url(Event, "change", event.pk))
    assert view.status_code == 200 and 'name="_save"' not in view.content.decode()
    assert admin_client.post(url(Event, "change", event.pk), {"message": "rewritten"}).status_code == 403
    assert admin_client.get(url(Event, "delete", event.pk)).status_code == 403
    assert admin_client.post(url(Event, "delete", event.pk), {"post": "yes"}).status_code == 403
    assert "delete_selected" not in admin_client.get(url(Event, "changelist")).content.decode()
    event.refresh_from_db()
    assert event.message != "rewritten" and Event.objects.count() == count


# --- Users, groups and tenant members: roles, changed on the record ------------------------------------------

NEW_PASSWORD = "staple battery horse correct"


@pytest.fixture
def bob(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    return User.objects.create_user("bob", password="correct horse battery staple")


def recorded() -> list[tuple[str, str, str, str]]:
    """The Event log's user, group and membership entries, oldest first."""
    return [(e.object_type, e.object_name, e.actor, e.message) for e in
            Event.objects.filter(object_type__in=["user", "group", "membership"]).order_by("id")]


def test_making_a_user_staff_an_auditor_and_a_tenant_member_is_recorded_with_the_admin(admin_client, bob):
    auditors = Group.objects.get(name="auditors")  # made by a migration on a fresh install
    one = Tenant.objects.create(name="one")
    change = url(User, "change", bob.pk)
    data = form_data(admin_client.get(change))
    response = admin_client.post(change, {**data, "is_staff": "on", "groups": [auditors.pk],
                                          "tenant_memberships-TOTAL_FORMS": 1, "tenant_memberships-0-tenant": one.pk,
                                          "tenant_memberships-0-role": "admin"})
    assert response.status_code == 302
    bob.refresh_from_db()
    assert bob.is_staff and list(bob.groups.all()) == [auditors]
    assert list(bob.tenant_memberships.values_list("tenant__name", flat=True)) == ["one"]
    assert recorded() == [("user", "bob", "user:admin", "is_staff: False → True"),
                          ("user", "bob", "user:admin", "groups: +auditors"),
                          ("membership", "bob in one (admin)", "user:admin", "created")]
    assert Event.objects.get(object_type="membership").tenant_id == one.pk  # in the tenant's own log


def test_a_password_changed_in_the_admin_is_recorded_without_the_password_or_its_hash(admin_client, bob):
    change_password = url(User, "password_change", bob.pk)
    mismatch = admin_client.post(change_password, {"usable_password": "true", "password1": NEW_PASSWORD,
                                                   "password2": NEW_PASSWORD + "!"})
    assert mismatch.status_code == 200 and recorded() == []
    old_hash = bob.password
    response = admin_client.post(change_password, {"usable_password": "true", "password1": NEW_PASSWORD,
                                                   "password2": NEW_PASSWORD})
    assert response.status_code == 302
    bob.refresh_from_db()
    assert bob.check_password(NEW_PASSWORD)
    assert recorded() == [("user", "bob", "user:admin", "password changed")]
    event = Event.objects.get(object_type="user")
    assert not any(secret in event.message + json.dumps(event.data) for secret in (NEW_PASSWORD, old_hash, bob.password))
    admin_client.post(change_password, {"usable_password": "false", "unset-password": "1"})
    assert recorded()[-1] == ("user", "bob", "user:admin", "password-based authentication disabled")


def test_a_user_added_in_the_admin_is_recorded_and_deleting_them_ends_their_memberships_on_the_record(
        admin_client, bob):
    one = Tenant.objects.create(name="one")
    response = admin_client.post(url(User, "add"), {
        "username": "dave", "usable_password": "true", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD,
        "tenant_memberships-TOTAL_FORMS": 1, "tenant_memberships-INITIAL_FORMS": 0,
        "tenant_memberships-0-tenant": one.pk, "tenant_memberships-0-role": "admin"})
    assert response.status_code == 302
    dave = User.objects.get(username="dave")
    assert dave.check_password(NEW_PASSWORD) and dave.tenant_memberships.get().tenant == one
    response = admin_client.post(url(User, "delete", dave.pk), {"post": "yes"})
    assert response.status_code == 302 and not User.objects.filter(username="dave").exists()
    assert recorded() == [("user", "dave", "user:admin", "created"),
                          ("membership", "dave in one (admin)", "user:admin", "created"),
                          ("membership", "dave in one (admin)", "user:admin", "deleted"),
                          ("user", "dave", "user:admin", "deleted")]
    assert all(dave.password not in e.message + json.dumps(e.data) for e in Event.objects.all())


def test_tenant_members_are_added_and_removed_on_the_tenant_page_on_the_record(admin_client, bob):
    one = Tenant.objects.create(name="one")
    change = url(Tenant, "change", one.pk)
    data = form_data(admin_client.get(change))
    assert data["memberships-TOTAL_FORMS"] == 0
    response = admin_client.post(change, {**data, "memberships-TOTAL_FORMS": 1, "memberships-0-user": bob.pk,
                                          "memberships-0-role": "admin"})
    assert response.status_code == 302
    assert list(one.memberships.values_list("user__username", flat=True)) == ["bob"]
    page = admin_client.get(change)
    assert 'name="memberships-0-user"' not in page.content.decode()  # a membership is ended, never edited
    data = form_data(page)
    twice = admin_client.post(change, {**data, "memberships-TOTAL_FORMS": 2, "memberships-1-user": bob.pk})
    assert twice.status_code == 200 and one.memberships.count() == 1  # a form error, nothing changed
    response = admin_client.post(change, {**data, "memberships-0-DELETE": "on"})
    assert response.status_code == 302 and not one.memberships.exists()
    assert recorded() == [("membership", "bob in one (admin)", "user:admin", "created"),
                          ("membership", "bob in one (admin)", "user:admin", "deleted")]
    assert set(Event.objects.filter(object_type="membership").values_list("tenant_id", flat=True)) == {one.pk}


def test_a_group_and_its_permissions_are_recorded_with_the_admin(admin_client, db):
    view_events = Permission.objects.get(codename="view_event")
    response = admin_client.post(url(Group, "add"), {"name": "night-shift", "permissions": [view_events.pk]})
    assert response.status_code == 302
    assert list(Group.objects.get(name="night-shift").permissions.all()) == [view_events]
    assert recorded() == [("group", "night-shift", "user:admin", "created"),
                          ("group", "night-shift", "user:admin", f"permissions: +{view_events}")]
