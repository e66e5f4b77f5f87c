"""One way to write a pool: the admin, the API and the console all call pools.services.pool_create and
pool_update, so each checks the quota the same way, refuses a stale version, bumps the version, records
the same Event and asks for the same reconcile."""
import pytest
from django.contrib.messages import get_messages
from django.forms import CheckboxInput
from django.test import Client
from django.urls import reverse

from events.models import Event
from pools.models import NodePool, Tenant
from pools.services import pool_create

from .factories import form_data

pytestmark = pytest.mark.django_db

QUOTA_MESSAGE = "tenant alpha may have at most 2 node(s); these pools ask for 3"


@pytest.fixture
def reconciles(monkeypatch):
    """The pool ids each reconcile was asked for (instead of sending the Celery task)."""
    calls = []
    monkeypatch.setattr("pools.services.pools_changed", lambda *, pool_ids: calls.append(pool_ids))
    return calls


@pytest.fixture
def admin_web(world) -> Client:
    """The platform admin in a browser: the Django admin and the console."""
    client = Client()
    client.force_login(world.users["admin"])
    return client


@pytest.fixture
def burst(world) -> NodePool:
    """A dynamic pool of tenant alpha, whose quota is 2 nodes (its static pool gpu has 1)."""
    Tenant.objects.filter(pk=world.alpha.pk).update(quota_nodes=2)
    return pool_create(tenant=world.alpha, actor="test", values={
        "name": "burst", "provider": world.provider, "kind": "dynamic",
        "node_type_selector": [{"property": "vcluster.com/node-type", "value": "gpu-server"}]})


def change_url(pool: NodePool) -> str:
    return reverse("admin:pools_nodepool_change", args=[pool.pk])


def admin_form(client: Client, pool: NodePool) -> dict:
    """The pool's admin change form as the browser posts it back unchanged."""
    return form_data(client.get(change_url(pool)))


def pool_events(pool: NodePool) -> list[Event]:
    return list(Event.objects.filter(object_type="pool", object_name=str(pool)).order_by("pk"))


def test_the_api_refuses_a_kind_change_past_the_quota(world, api, burst, reconciles):
    refused = api("admin", "patch", f"/api/v1/pools/{burst.pk}/", {"kind": "static", "quantity": 2})
    assert refused.status_code == 400 and refused.json() == {"quantity": [QUOTA_MESSAGE]}
    burst.refresh_from_db()
    assert (burst.kind, burst.quantity, burst.version) == ("dynamic", None, 1) and reconciles == []


def test_the_admin_refuses_a_kind_change_past_the_quota_with_the_api_s_message(admin_web, burst, reconciles):
    events = Event.objects.count()
    response = admin_web.post(change_url(burst), {**admin_form(admin_web, burst), "kind": "static", "quantity": "2"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["quantity"] == [QUOTA_MESSAGE]
    burst.refresh_from_db()
    assert (burst.kind, burst.quantity, burst.version) == ("dynamic", None, 1)
    assert Event.objects.count() == events and reconciles == []


def test_the_admin_s_save_refuses_a_kind_change_past_the_quota_when_its_form_s_check_passed(
        admin_web, burst, reconciles, monkeypatch):
    """Another writer took the quota between the form's check and the save: the service checks again, under
    the tenant's lock."""
    monkeypatch.setattr("pools.admin.tenant_check_quota", lambda **kwargs: None)
    events = Event.objects.count()
    response = admin_web.post(change_url(burst), {**admin_form(admin_web, burst), "kind": "static", "quantity": "2"},
                              follow=True)
    assert [m.message for m in get_messages(response.wsgi_request)] == [f"Nothing was saved: {QUOTA_MESSAGE}"]
    burst.refresh_from_db()
    assert (burst.kind, burst.quantity, burst.version) == ("dynamic", None, 1)
    assert Event.objects.count() == events and reconciles == []


def test_a_kind_change_within_the_quota_is_made_alike_by_the_admin_and_the_api(world, api, admin_web, burst,
                                                                               reconciles):
    response = admin_web.post(change_url(burst), {**admin_form(admin_web, burst), "kind": "static", "quantity": "1"})
    assert response.status_code == 302
    burst.refresh_from_db()
    assert (burst.kind, burst.quantity, burst.version) == ("static", 1, 2)
    changed = api("admin", "patch", f"/api/v1/pools/{burst.pk}/", {"kind": "dynamic", "quantity": None},
                  HTTP_IF_MATCH='W/"2"')
    assert changed.status_code == 200 and changed["ETag"] == 'W/"3"'
    admin_change, api_change = pool_events(burst)[-2:]
    assert (admin_change.data, api_change.data) == ({"kind": ["dynamic", "static"], "quantity": [None, 1]},
                                                    {"kind": ["static", "dynamic"], "quantity": [1, None]})
    assert reconciles == [[burst.pk], [burst.pk]]


def test_the_admin_the_api_and_the_console_change_a_quantity_with_the_same_event_and_version_bump(
        world, api, admin_web, reconciles):
    pool = world.pool_a
    assert (pool.quantity, pool.version) == (1, 1)
    response = admin_web.post(change_url(pool), {**admin_form(admin_web, pool), "quantity": "2"})
    assert response.status_code == 302
    response = api("admin", "patch", f"/api/v1/pools/{pool.pk}/", {"quantity": 3}, HTTP_IF_MATCH='W/"2"')
    assert response.status_code == 200
    response = admin_web.post(reverse("pool-quantity", args=["alpha", "gpu"]), {"quantity": 4, "version": 3})
    assert response.status_code == 302
    pool.refresh_from_db()
    assert (pool.quantity, pool.version) == (4, 4)
    seen = [(e.kind, e.object_type, e.object_name, e.tenant_id, e.actor, e.message, e.data)
            for e in pool_events(pool)[-3:]]
    assert seen == [("change", "pool", "alpha/gpu", world.alpha.pk, "user:ada-admin", f"quantity: {n - 1} → {n}",
                     {"quantity": [n - 1, n]}) for n in (2, 3, 4)]
    assert reconciles == [[pool.pk]] * 3


def test_each_path_refuses_a_stale_version_and_changes_nothing(world, api, admin_web, reconciles):
    pool = world.pool_a
    form = admin_form(admin_web, pool)
    NodePool.objects.filter(pk=pool.pk).update(version=2)  # someone else saved meanwhile
    events = Event.objects.count()
    assert "changed meanwhile" in admin_web.post(change_url(pool), {**form, "quantity": "2"}).content.decode()
    assert api("admin", "patch", f"/api/v1/pools/{pool.pk}/", {"quantity": 2}, HTTP_IF_MATCH='W/"1"').status_code == 412
    console = admin_web.post(reverse("pool-quantity", args=["alpha", "gpu"]), {"quantity": 2, "version": 1})
    assert console.status_code == 400 and "was changed meanwhile" in console.content.decode()
    pool.refresh_from_db()
    assert (pool.quantity, pool.version) == (1, 2)
    assert Event.objects.count() == events and reconciles == []


def test_the_admin_and_the_api_create_a_pool_alike(world, api, admin_web, reconciles):
    body = {"tenant": "alpha", "name": "cpus", "provider": "metal3", "quantity": 1,
            "node_type_selector": [{"property": "vcluster.com/node-type", "value": "cpu-server"}]}
    assert api("admin", "post", "/api/v1/pools/", body).status_code == 201
    add = reverse("admin:pools_nodepool_add")
    form = {**admin_form_for_add(admin_web, add), "tenant": world.alpha.pk, "name": "cpus2",
            "provider": world.provider.pk, "kind": "static", "quantity": "1",
            "node_type_selector": '[{"property": "vcluster.com/node-type", "value": "cpu-server"}]'}
    response = admin_web.post(add, form)
    assert response.status_code == 302, response.context["adminform"].form.errors
    made = {p.name: p for p in NodePool.objects.filter(name__in=["cpus", "cpus2"])}
    assert {p.version for p in made.values()} == {1}
    created = [(e.kind, e.tenant_id, e.actor, e.message, e.data["before"], e.data["after"]["name"])
               for e in Event.objects.filter(object_type="pool", object_name__in=["alpha/cpus", "alpha/cpus2"])
               .order_by("pk")]
    assert created == [("change", world.alpha.pk, "user:ada-admin", "created", {}, name) for name in ("cpus", "cpus2")]
    assert reconciles == [[made["cpus"].pk], [made["cpus2"].pk]]


def admin_form_for_add(client: Client, url: str) -> dict:
    form = client.get(url).context["adminform"].form
    return {f.html_name: "" if f.value() is None else f.value() for f in form
            if not f.field.disabled and not isinstance(f.field.widget, CheckboxInput)}
