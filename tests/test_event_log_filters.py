"""The Event log's search, as the page and /api/v1/events/ share it: `name`, `steps` (the page shows failed steps only
unless asked for every step; the API every event unless asked), the tenant, within the asker's scope; the links a
member gets (their claims, pools and tenant; no host pages)."""
import re

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from events.choices import EventKind, ObjectType
from events.services import event_record
from hosts.models import BareMetalHost
from pools.models import Tenant

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import pool  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db


@pytest.fixture
def logged(users):
    """Tenant two's claim on a host, with a step that went well and one that failed; a step of tenant one's."""
    from claims.allocation import claims_allocate
    from claims.reconcile import pools_reconcile

    cpu = pool("two", "cpu")
    pools_reconcile(pool_ids=[cpu.pk])
    claims_allocate(pool_ids=[cpu.pk])
    claim = cpu.claims.select_related("host").get()
    for name, message in (("write_image", "done"), ("boot_from_disk", "failed: no bootable disk")):
        event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=claim.host.name, host=claim.host,
                     claim=claim, tenant_id=claim.tenant_id, step=name, message=message, actor="system:flow")
    one = Tenant.objects.get(name="one")
    other = BareMetalHost.objects.exclude(pk=claim.host_id).order_by("name").first()
    event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=other.name, host=other,
                 tenant_id=one.pk, step="write_image", message="failed: one's secret step", actor="system:flow")
    return {**users, "claim": claim, "one": one}


def api_events(user, **query) -> list[dict]:
    client = APIClient()
    client.force_authenticate(user)
    response = client.get("/api/v1/events/", query)
    assert response.status_code == 200, response.content
    body = response.json()
    return body["results"] if isinstance(body, dict) else body


def test_the_api_searches_by_name_and_keeps_every_step_unless_asked(logged):
    host = logged["claim"].host.name
    named = api_events(logged["admin"], name=host.upper()[:5] + host[5:])  # contains, whatever the case
    assert named and {e["object_name"] for e in named} == {host}
    assert {e["message"] for e in named} >= {"done", "failed: no bootable disk"}
    failed = api_events(logged["admin"], name=host, steps="failed")
    assert "done" not in {e["message"] for e in failed} and "failed: no bootable disk" in {e["message"] for e in failed}
    assert [e for e in api_events(logged["admin"], steps="failed") if e["kind"] == "transition"]
    client = APIClient()
    client.force_authenticate(logged["admin"])
    assert client.get("/api/v1/events/", {"steps": "some"}).status_code == 400


def test_the_page_shows_failed_steps_by_default_and_every_step_on_demand(client, logged):
    client.force_login(logged["admin"])
    html = client.get(reverse("events")).content.decode()
    assert "failed: no bootable disk" in html and ">done<" not in html
    assert "write_image" in client.get(reverse("events"), {"steps": "all"}).content.decode()
    assert 'name="tenant"' in html and ">one</option>" in html and ">two</option>" in html


def test_a_member_searching_another_tenant_finds_nothing_and_gets_no_host_links(client, logged):
    bob, claim = logged["bob"], logged["claim"]  # a member of two
    assert api_events(bob, tenant=logged["one"].pk) == []
    assert api_events(bob, name="secret") == []
    client.force_login(bob)
    html = client.get(reverse("events"), {"tenant": logged["one"].pk, "steps": "all"}).content.decode()
    assert "secret step" not in html and "No events." in html
    html = client.get(reverse("events")).content.decode()
    assert 'name="tenant"' not in html  # one tenant: nothing to choose
    row = re.search(r'<tr data-event="\d+"[^>]*>(?:(?!</tr>).)*failed: no bootable disk(?:(?!</tr>).)*</tr>', html, re.S)
    assert row, html
    assert f'href="/claims/{claim.name}/"' in row.group(0) and 'href="/tenants/two/"' in row.group(0)
    assert 'data-link="host"' not in html and "/hosts/" not in row.group(0)
