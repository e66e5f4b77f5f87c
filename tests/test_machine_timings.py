"""Timings of an external provider's machines: a machine claim's page shows its machine's steps (make: made →
running; join: running → its node Ready, the claim Available; release: released → every object gone) on the claim's
time axis, and the fleet's timing page counts them per step beside the hosts' flows. The kind is the seam's in-test
provider (tests/test_machines_seam.py); the claims live through the real services."""
import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from claims.choices import ClaimPhase as P
from claims.models import NodeClaim
from claims.phases import claims_release
from machines.choices import MachineState
from machines.models import Machine
from machines.services import claims_fill, machine_advance
from pools.models import Tenant, TenantMembership

from .test_machines_seam import advance_all, kind, reconcile, tenant_api  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def admin(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("root-admin", is_staff=True, is_superuser=True))
    return client


def steps(page: str) -> dict[str, dict]:
    """The claim page's step rows of the machine flow: {step: {"status", "duration"}}."""
    rows = re.findall(r'<div class="row" id="[^"]+" data-step="(\w+)" data-flow="machine" data-status="(\w+)" '
                      r'data-duration="([^"]*)"', page)
    return {name: {"status": status, "duration": float(duration) if duration else None}
            for name, status, duration in rows}


def test_a_machine_claims_page_shows_make_join_and_release_and_the_fleet_times_them(kind, tenant_api, admin):
    reconcile()
    claims_fill()
    advance_all()  # made; the first look: booting
    claim = NodeClaim.objects.filter(tenant__name="alpha").order_by("pk").first()
    shown = steps(unescape(admin.get(reverse("claim", args=[claim.name])).content.decode()))
    assert shown["make"]["status"] == "running" and "join" not in shown

    advance_all()  # running, joined: Available
    claim.refresh_from_db()
    assert claim.phase == P.AVAILABLE
    machine = Machine.objects.get(claim=claim)
    shown = steps(unescape(admin.get(reverse("claim", args=[claim.name])).content.decode()))
    assert shown["make"] == {"status": "done",
                             "duration": pytest.approx((machine.running_at - machine.created_at).total_seconds(),
                                                       abs=0.05)}
    assert shown["join"]["status"] == "done"
    assert shown["join"]["duration"] == pytest.approx((claim.available_at - machine.running_at).total_seconds(),
                                                      abs=0.05)

    claims_release(claims=[claim], actor="user:test", reason="done with it")
    machine_advance(machine_id=machine.pk)  # the node goes; the kind deletes
    shown = steps(unescape(admin.get(reverse("claim", args=[claim.name])).content.decode()))
    assert shown["release"]["status"] == "running"
    machine_advance(machine_id=machine.pk)
    machine.refresh_from_db()
    assert machine.state == MachineState.GONE
    page = unescape(admin.get(reverse("claim", args=[claim.name])).content.decode())
    assert steps(page)["release"] == {"status": "done", "duration": pytest.approx(
        (machine.gone_at - machine.released_at).total_seconds(), abs=0.05)}
    assert machine.name in page

    timing = unescape(admin.get(reverse("timing")).content.decode())
    table = timing[timing.index("<tbody>", timing.index('data-step=')):]
    rows = {step: int(n) for step, n in re.findall(
        r'<tr data-step="(\w+)"><td>machine</td><td>\w+</td><td>(\d+)</td>', table)}
    # Two claims made and joined, one of them released and gone.
    assert rows == {"make": 2, "join": 2, "release": 1}
    assert list(rows) == ["make", "join", "release"]  # in the order a machine lives them


def test_another_tenants_member_sees_no_machine_steps_and_no_timing_page(kind, tenant_api, django_user_model):
    reconcile()
    claims_fill()
    advance_all(2)
    claim = NodeClaim.objects.filter(tenant__name="alpha").first()
    other = Tenant.objects.create(name="beta")
    outsider = django_user_model.objects.create_user("bob")
    TenantMembership.objects.create(tenant=other, user=outsider)
    client = Client()
    client.force_login(outsider)
    assert client.get(reverse("claim", args=[claim.name])).status_code == 404
    assert client.get(reverse("timing")).status_code == 403
