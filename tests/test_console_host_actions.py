"""Host actions on the console, over HTTP with CSRF as people use them: the repair pool's retest, return to
service (after a passing retest, or an admin override with a reason) and retire; a power cycle sent by a real
Celery worker to the lab's Redfish emulator. Only admins may act; the Event log names who did."""
import re
import socket

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost
from lab.redfish import RedfishLab
from pools.models import Tenant, TenantMembership

PASSWORD = "host-actions-test-password-5c1e"
BMC_USER, BMC_PASSWORD = "admin", "lab-bmc-password-9d2b"
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture
def people(db):
    admin = User.objects.create_user("root-admin", "root@example.invalid", PASSWORD, is_staff=True,
                                     is_superuser=True)
    auditor = User.objects.create_user("audrey", "audrey@example.invalid", PASSWORD)
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    member = User.objects.create_user("alice", "alice@example.invalid", PASSWORD)
    TenantMembership.objects.create(tenant=Tenant.objects.create(name="one"), user=member)
    return {"admin": admin, "auditor": auditor, "member": member}


def browser(user) -> Client:
    """A client that, like a browser, must carry the CSRF token of the form it posts."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def confirm(client: Client, host: str, action: str, data: dict | None = None, query: str = ""):
    """Open the confirmation page, then submit its form (with its CSRF token); follows the redirect."""
    url = reverse("host-action", args=[host, action])
    page = client.get(url + query)
    assert page.status_code == 200, page.status_code
    token = CSRF.search(page.content.decode())
    assert token, "the confirmation page has no form"
    return client.post(url, {"csrfmiddlewaretoken": token.group(1), **(data or {})}, follow=True)


def text(response) -> str:
    from html import unescape

    return unescape(response.content.decode())


def host_in(state: str, name: str = "gpu-09", **fields) -> BareMetalHost:
    return BareMetalHost.objects.create(name=name, state=state, boot_mac="52:54:00:00:00:09",
                                        bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/9", **fields)


@pytest.fixture
def broken_host(people):
    """A host the release gate set aside, as hosts.flows leaves it (a transition into repair with evidence)."""
    host = host_in("repair")
    Event.objects.create(kind="transition", object_type="host", object_name=host.name, host=host,
                         from_state="deprovisioning", to_state="repair", step="health_dcgm", actor="system:flow",
                         message="deprovision failed at health_dcgm: dcgmi diag -r 2: Detected XID 48 for GPU 3")
    return host


def passed_retest(host: BareMetalHost) -> None:
    Event.objects.create(kind="transition", object_type="host", object_name=host.name, host=host,
                         from_state="retesting", to_state="repair", actor="system:flow",
                         message="retest passed", data={"retest": "passed", "flow_id": "f-1"})


# --- the repair pool's actions ------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_host_page_and_the_repair_rows_offer_the_repair_actions_to_admins_only(broken_host, people):
    admin, auditor = browser(people["admin"]), browser(people["auditor"])
    page = text(admin.get(reverse("host", args=[broken_host.name])))
    for slug in ("retest", "return-to-service", "retire", "power-cycle"):
        assert reverse("host-action", args=[broken_host.name, slug]) in page, slug
    assert reverse("host-action", args=[broken_host.name, "retry"]) not in page  # not in error
    rows = text(admin.get(reverse("repair")))
    assert reverse("host-action", args=[broken_host.name, "retest"]) + "?next=repair" in rows
    assert "/actions/" not in text(auditor.get(reverse("host", args=[broken_host.name])))
    assert "/actions/" not in text(auditor.get(reverse("repair")))


@pytest.mark.django_db
def test_an_admin_retests_a_host_from_the_repair_page(broken_host, people):
    response = confirm(browser(people["admin"]), broken_host.name, "retest", {"reason": "PSU swapped",
                                                                             "next": "repair"}, "?next=repair")
    assert response.redirect_chain[-1][0] == reverse("repair")
    assert "Retest: gpu-09 is being cleaned and checked again" in text(response)
    assert BareMetalHost.objects.get().state == "retesting"
    event = Event.objects.get(host=broken_host, to_state="retesting")
    assert (event.actor, event.message) == ("user:root-admin", "PSU swapped")


@pytest.mark.django_db
def test_return_to_service_without_a_passing_retest_needs_the_override_and_its_reason(broken_host, people):
    admin = browser(people["admin"])
    page = text(admin.get(reverse("host-action", args=[broken_host.name, "return-to-service"])))
    assert "no passing retest since it went to repair" in page and "Detected XID 48" in page
    assert 'name="override"' in page
    events = Event.objects.count()

    # A reason alone is not an override: refused, with the why, and nothing changes.
    refused = confirm(admin, broken_host.name, "return-to-service", {"reason": "looks fine to me"})
    assert ("Return to service: gpu-09 has no passing retest since it went to repair (deprovision failed at "
            "health_dcgm: dcgmi diag -r 2: Detected XID 48 for GPU 3): retest it, or override with a reason"
            ) in text(refused)
    # The override without a reason: refused too.
    assert "or override with a reason" in text(confirm(admin, broken_host.name, "return-to-service",
                                                       {"override": "on", "reason": "  "}))
    assert BareMetalHost.objects.get().state == "repair"
    assert Event.objects.count() == events

    done = confirm(admin, broken_host.name, "return-to-service", {"override": "on", "reason": "vendor replaced GPU 3"})
    assert "Return to service: done for gpu-09" in text(done)
    assert BareMetalHost.objects.get().state == "available"
    back = Event.objects.get(host=broken_host, to_state="available")
    assert back.actor == "user:root-admin"
    assert back.message == "returned to service by admin override without a passing retest: vendor replaced GPU 3"
    assert back.data["override"] is True and back.data["override_reason"] == "vendor replaced GPU 3"


@pytest.mark.django_db
def test_return_to_service_after_a_passing_retest_needs_no_override(broken_host, people):
    passed_retest(broken_host)
    admin = browser(people["admin"])
    page = text(admin.get(reverse("host-action", args=[broken_host.name, "return-to-service"])))
    assert "It passed its retest" in page and 'name="override"' not in page
    confirm(admin, broken_host.name, "return-to-service")
    assert BareMetalHost.objects.get().state == "available"
    back = Event.objects.get(host=broken_host, to_state="available")
    assert (back.actor, back.data) == ("user:root-admin", {"retest": "passed", "retest_flow_id": "f-1"})


@pytest.mark.django_db
def test_retire_needs_a_reason_and_records_it(broken_host, people):
    admin = browser(people["admin"])
    assert "required" in text(admin.get(reverse("host-action", args=[broken_host.name, "retire"])))
    refused = confirm(admin, broken_host.name, "retire", {"reason": ""})
    assert "Retire: retiring gpu-09 needs a reason" in text(refused)
    assert BareMetalHost.objects.get().state == "repair"

    confirm(admin, broken_host.name, "retire", {"reason": "mainboard dead, out of warranty"})
    assert BareMetalHost.objects.get().state == "retired"
    event = Event.objects.get(host=broken_host, to_state="retired")
    assert (event.actor, event.message) == ("user:root-admin", "retired: mainboard dead, out of warranty")
    page = text(admin.get(reverse("host", args=[broken_host.name])))
    # A retired host offers nothing, not even a power cycle: only its removal from the fleet.
    assert re.findall(r"/actions/([\w-]+)/", page) == ["delete"]


@pytest.mark.django_db
@pytest.mark.parametrize("who", ["auditor", "member"])
def test_only_admins_may_act_on_hosts(broken_host, people, who):
    client = Client()  # without CSRF checks: what is refused is the role, not a missing token
    client.force_login(people[who])
    for action in ("retest", "return-to-service", "retire", "power-cycle", "maintenance-on"):
        url = reverse("host-action", args=[broken_host.name, action])
        assert client.get(url).status_code == 403, action
        assert client.post(url, {"reason": "x", "override": "on"}).status_code == 403, action
    assert BareMetalHost.objects.get().state == "repair"
    assert not Event.objects.filter(actor__startswith="user:").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("state", ["registering", "inspecting", "provisioning", "deprovisioning", "retesting",
                                   "retired"])
def test_a_power_cycle_is_refused_while_a_flow_drives_the_power(people, state):
    host = host_in(state)
    admin = browser(people["admin"])
    page = text(admin.get(reverse("host-action", args=[host.name, "power-cycle"])))
    assert "refused while a flow drives its power" in page  # the rule, on every confirmation
    assert "Not possible now: the host is " + state in page and 'id="id_reason"' not in page
    client = Client()
    client.force_login(people["admin"])
    refused = text(client.post(reverse("host-action", args=[host.name, "power-cycle"]), follow=True))
    assert f"Power cycle: gpu-09 cannot be power cycled now: the host is {state}" in refused
    assert not Event.objects.filter(step="power_cycle").exists()


# --- power cycle: the console, a real worker, the lab's BMC emulator -------------------------------------------

@pytest.fixture
def redfish():
    systems = [{"name": "gpu-01", "mac": "52:54:00:00:01:01", "power_state": "On"},
               {"name": "gpu-02", "mac": "52:54:00:00:01:02", "power_state": "Off"},
               {"name": "gpu-03", "mac": "52:54:00:00:01:03", "power_state": "On"}]
    with RedfishLab(systems, BMC_USER, BMC_PASSWORD, power_delay=(0.2, 0.5)) as lab:
        yield lab


@pytest.fixture
def fast_worker(worker_settings):
    worker_settings.update({"POWER_POLL_S": "0.2", "POWER_DEADLINE_S": "15"})


def lab_host(lab, name: str, state: str, password: str = BMC_PASSWORD, address: str | None = None):
    return BareMetalHost.objects.create(
        name=name, state=state, bmc_address=address or lab.system_address(name), bmc_username=BMC_USER,
        bmc_password=password, boot_mac=f"52:54:00:00:01:0{name[-1]}", power_state="unknown")


def outcome(host: BareMetalHost, timeout: float = 30) -> Event:
    wait_for(lambda: Event.objects.filter(host_id=host.pk, step="power_cycle", data__has_key="request_id").exists(),
             timeout=timeout)
    return Event.objects.get(host_id=host.pk, step="power_cycle", data__has_key="request_id")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_an_admin_power_cycles_hosts_through_the_console_and_the_worker_resets_them(
        people, redfish, fast_worker, celery_worker_process):
    on = lab_host(redfish, "gpu-01", "provisioned")
    off = lab_host(redfish, "gpu-02", "repair")
    admin = browser(people["admin"])
    since = max((e["seq"] for e in redfish.events()), default=0)

    response = confirm(admin, on.name, "power-cycle", {"reason": "kernel hung"})
    assert "Power cycle: asked for gpu-01" in text(response)
    request = Event.objects.get(host_id=on.pk, step="power_cycle", data__reason="kernel hung")
    assert (request.kind, request.actor, request.message) == ("action", "user:root-admin",
                                                              "power cycle requested: kernel hung")
    # The emulator received a reset: the power went off and came back on, both caused by the reset.
    went_off = redfish.wait_event("gpu-01", "Off", since=since, timeout=30)
    came_on = redfish.wait_event("gpu-01", "On", since=went_off["seq"], timeout=30)
    assert (went_off["cause"], came_on["cause"]) == ("reset", "reset")
    done = outcome(on)
    assert done.actor == "user:root-admin" and done.data["ok"] is True, done.message
    assert done.message == "power cycle done: reset; power on again"
    assert (done.data["power_before"], done.data["power_after"]) == ("on", "on")
    assert done.data["request_id"] == request.pk
    assert BareMetalHost.objects.get(pk=on.pk).power_state == "on"
    assert BareMetalHost.objects.get(pk=on.pk).state == "provisioned"  # a power cycle changes no state

    # A host that is off is switched on.
    confirm(admin, off.name, "power-cycle")
    assert redfish.wait_event("gpu-02", "On", since=since, timeout=30)["cause"] == "power-on"
    assert outcome(off).message == "power cycle done: powered on (it was off); power on again"
    assert redfish.state("gpu-02")["power_state"] == "On"

    # The host page's timeline shows who asked and what the BMC answered.
    page = text(admin.get(reverse("host", args=[on.name])))
    assert "power cycle done: reset; power on again" in page and "user:root-admin" in page


@pytest.mark.django_db(transaction=True)
def test_a_power_cycle_the_bmc_refuses_is_in_the_event_log_with_the_reason(
        people, redfish, fast_worker, celery_worker_process):
    wrong = lab_host(redfish, "gpu-03", "maintenance", password="not-the-bmc-password")
    away = lab_host(redfish, "gpu-01", "error",
                    address=f"redfish+http://127.0.0.1:{closed_port()}/redfish/v1/Systems/gpu-01")
    admin = browser(people["admin"])
    since = max((e["seq"] for e in redfish.events()), default=0)

    confirm(admin, wrong.name, "power-cycle")
    failed = outcome(wrong)
    assert failed.message == "power cycle failed: BMC rejected credentials (401)"
    assert (failed.actor, failed.data["ok"], failed.data["error"]) == ("user:root-admin", False, "auth")
    assert redfish.state("gpu-03")["power_state"] == "On"
    assert not [e for e in redfish.events(since) if e["system"] == "gpu-03"]  # nothing reached the system

    confirm(admin, away.name, "power-cycle")
    unreachable = outcome(away)
    assert unreachable.message == "power cycle failed: BMC unreachable: connection refused"
    assert unreachable.data["error"] == "unreachable"
    page = text(admin.get(reverse("host", args=[wrong.name])))
    assert "power cycle failed: BMC rejected credentials (401)" in page


def power_outcome(host: BareMetalHost, step: str, timeout: float = 30) -> Event:
    wait_for(lambda: Event.objects.filter(host_id=host.pk, step=step, data__has_key="request_id").exists(),
             timeout=timeout)
    return Event.objects.get(host_id=host.pk, step=step, data__has_key="request_id")


@pytest.mark.django_db(transaction=True)
def test_an_admin_powers_hosts_off_and_on_through_the_console_and_the_worker_sends_it(
        people, redfish, fast_worker, celery_worker_process):
    on = lab_host(redfish, "gpu-01", "maintenance")
    off = lab_host(redfish, "gpu-02", "available")
    admin = browser(people["admin"])
    since = max((e["seq"] for e in redfish.events()), default=0)

    response = confirm(admin, on.name, "power-off", {"reason": "PSU swap"})
    assert "Power off: asked for gpu-01" in text(response)
    request = Event.objects.get(host_id=on.pk, step="power_off")
    assert (request.actor, request.message) == ("user:root-admin", "power off requested: PSU swap")
    assert redfish.wait_event("gpu-01", "Off", since=since, timeout=30)["cause"] == "power-off"
    done = power_outcome(on, "power_off")
    assert done.message == "power off done: powered off; power off" and done.data["ok"] is True
    assert BareMetalHost.objects.get(pk=on.pk).power_state == "off"
    assert redfish.state("gpu-01")["power_state"] == "Off"

    confirm(admin, off.name, "power-on")
    assert redfish.wait_event("gpu-02", "On", since=since, timeout=30)["cause"] == "power-on"
    assert power_outcome(off, "power_on").message == "power on done: powered on; power on"
    assert BareMetalHost.objects.get(pk=off.pk).state == "available"  # power changes no state

    # A host that is on already is left alone, and the answer says so.
    seq = max(e["seq"] for e in redfish.events())
    Event.objects.filter(host_id=off.pk, step="power_on").delete()
    confirm(admin, off.name, "power-on")
    assert power_outcome(off, "power_on").message == "power on done: it was on already; power on"
    assert not [e for e in redfish.events(seq) if e["system"] == "gpu-02"]
