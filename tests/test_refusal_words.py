"""Refusals say what to do, in one place (the host transition table's refusal, hosts.lifecycle.WHAT_TO_DO): the
fleet's bulk actions, the host page, the API and the admin all say "release its claim first" where they said
"provisioned → maintenance is not allowed (from provisioned: deprovisioning, error)". The repair ladder's words
say which rung runs now and what comes next."""
import re
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from claims.models import NodeClaim
from hosts.choices import HostState, RepairOutcome
from hosts.lifecycle import TRANSITIONS, WHAT_TO_DO, IllegalTransition, refusal
from hosts.models import BareMetalHost
from hosts.selectors import repair_position
from hosts.services import host_set_maintenance
from pools.models import NodeProvider, Tenant

pytestmark = pytest.mark.django_db

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
TABLE_WORDS = re.compile(r"is not allowed|\(from \w+:")


@pytest.fixture
def fleet(db):
    """gpu-05 serves tenant one's claim one-k3x9; gpu-06 is free."""
    served = BareMetalHost.objects.create(name="gpu-05", state=HostState.PROVISIONED, boot_mac="52:54:00:ab:00:05",
                                          bmc_address="redfish+http://10.1.0.5:8000/redfish/v1/Systems/5")
    free = BareMetalHost.objects.create(name="gpu-06", state=HostState.AVAILABLE, boot_mac="52:54:00:ab:00:06",
                                        bmc_address="redfish+http://10.1.0.6:8000/redfish/v1/Systems/6")
    NodeClaim.objects.create(name="one-k3x9", tenant=Tenant.objects.create(name="one"),
                             provider=NodeProvider.objects.create(name="metal3"), pool_name="gpu", host=served,
                             host_name="gpu-05", phase="Available")
    return {"served": served, "free": free}


@pytest.fixture
def admin():
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("root-admin", is_staff=True, is_superuser=True))
    return client


def text(response) -> str:
    return unescape(response.content.decode())


def test_every_state_says_why_and_what_to_do_and_no_refusal_reads_like_the_table():
    assert set(WHAT_TO_DO) == set(TRANSITIONS)
    for state, (why, do) in WHAT_TO_DO.items():
        assert why and do, state
    for from_state in TRANSITIONS:
        for to_state in (HostState.MAINTENANCE, HostState.RETIRED):
            words = refusal(from_state, to_state, "gpu-05")
            if words:
                assert not TABLE_WORDS.search(words), words
                assert words.endswith(WHAT_TO_DO[from_state][1]), words


def test_a_bulk_maintenance_on_a_provisioned_host_says_release_its_claim_first(fleet, admin):
    query = [("action", "maintenance-on"), ("next", ""), ("host", "gpu-05"), ("host", "gpu-06")]
    confirmation = admin.get(reverse("fleet-bulk"), query)
    page = text(confirmation)
    assert ("will be refused: gpu-05 is provisioned (it serves a claim), so it cannot go to maintenance: "
            "release its claim first") in page
    assert not TABLE_WORDS.search(page)
    token = CSRF.search(confirmation.content.decode()).group(1)
    done = admin.post(reverse("fleet-bulk"), {"csrfmiddlewaretoken": token, "action": "maintenance-on",
                                              "host": ["gpu-05", "gpu-06"], "reason": "", "next": ""}, follow=True)
    result = text(done)
    assert ("Maintenance on: gpu-05 is provisioned (it serves a claim), so it cannot go to maintenance: "
            "release its claim first") in result
    assert "Maintenance on: done for 1 host (gpu-06)" in result
    assert not TABLE_WORDS.search(result)
    assert BareMetalHost.objects.get(name="gpu-05").state == HostState.PROVISIONED


def test_the_api_and_the_service_give_the_same_words(fleet):
    with pytest.raises(IllegalTransition, match="release its claim first$"):
        host_set_maintenance(host=fleet["served"], on=True, actor="test")
    api = Client()
    api.force_login(User.objects.create_user("ada-admin", is_staff=True, is_superuser=True))
    busy = api.post(f"/api/v1/hosts/{fleet['served'].pk}/maintenance/", {"on": True},
                    content_type="application/json")
    assert busy.status_code == 409
    assert busy.json()["detail"] == ("gpu-05 is provisioned (it serves a claim), so it cannot go to maintenance: "
                                     "release its claim first")


def test_a_bulk_action_that_applies_elsewhere_says_where(fleet, admin):
    page = text(admin.get(reverse("fleet-bulk"), [("action", "retest"), ("host", "gpu-06")]))
    assert "will be refused: gpu-06 is available, so retest does not apply: only a host in repair is retested" in page


LADDER = ["gpu-reset", "power-cycle", "retest"]


@pytest.mark.parametrize("position, outcome, state, words", [
    (0, RepairOutcome.RUNNING, HostState.REPAIR, "next: rung 1 of 3, gpu-reset"),
    (1, RepairOutcome.RUNNING, HostState.REPAIRING, "rung 1 of 3 running: gpu-reset; next if it fails: rung 2, "
                                                    "power-cycle"),
    (2, RepairOutcome.RUNNING, HostState.REPAIRING, "rung 2 of 3 running: power-cycle; next if it fails: rung 3, "
                                                    "retest"),
    (2, RepairOutcome.RUNNING, HostState.REPAIR, "rung 2 of 3 failed: power-cycle; next: rung 3, retest"),
    (3, RepairOutcome.RUNNING, HostState.REPAIRING, "rung 3 of 3 running: retest; next if it fails: a person (the "
                                                    "last rung)"),
    (3, RepairOutcome.WAITING, HostState.REPAIR, "all 3 rungs tried (gpu-reset, power-cycle, retest): waiting for a "
                                                 "person"),
    (1, RepairOutcome.WAITING, HostState.RETESTING, "1 of 3 rungs tried, then taken over by a person: waiting for a "
                                                    "person"),
])
def test_the_ladder_says_which_rung_runs_now_and_what_comes_next(position, outcome, state, words):
    assert repair_position(ladder=LADDER, position=position, outcome=outcome, state=state) == words


def test_a_ladder_read_as_text_never_reads_as_no_rungs():
    # SQLite hands a JSON column nested in JSONObject over as text (hosts.selectors.attention_explain parses it);
    # a ladder that is not a list is no ladder at all, not "3/0 tried".
    assert repair_position(ladder=[], position=3, outcome=RepairOutcome.WAITING, state=HostState.REPAIR) == (
        "no automatic remedy for this failure: waiting for a person")
    assert "3/0" not in repair_position(ladder="[]", position=3, outcome=RepairOutcome.RUNNING,
                                        state=HostState.REPAIRING)


def test_the_host_pages_confirmation_says_what_to_do_for_an_action_its_state_does_not_offer(fleet, admin):
    page = text(admin.get(reverse("host-action", args=["gpu-05", "maintenance-on"])))
    assert ("Not possible now: gpu-05 is provisioned (it serves a claim), so it cannot go to maintenance: release "
            "its claim first.") in page
    assert "<form" not in page.split('id="confirm-action"', 1)[1]
