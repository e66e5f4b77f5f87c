"""Hosts fixed from the console, over HTTP with CSRF as people use it: an admin edits a host's BMC address,
credentials, boot MAC and labels (the same checks as apply and the API, credentials never shown back, one Event
with them masked), one host from its page or the fleet's selection in bulk, and deletes a host with the refusal
reasons of hosts.services.host_delete. Auditors and tenant members may do none of it."""
import re
from html import unescape

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import NodeProvider, Tenant, TenantMembership

pytestmark = pytest.mark.django_db

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
OLD_PASSWORD = "edit-old-bmc-password-51c9"
NEW_PASSWORD = "edit-new-bmc-password-8d2e"
OLD_USER = "bmc-operator-old-7a1"


@pytest.fixture
def people(db):
    one = Tenant.objects.create(name="one")
    auditor = User.objects.create_user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    alice = User.objects.create_user("alice")
    TenantMembership.objects.create(tenant=one, user=alice)
    return {"admin": User.objects.create_user("root-admin", is_staff=True, is_superuser=True),
            "auditor": auditor, "alice": alice, "one": one}


def make_host(name: str, state: str, n: int, **fields) -> BareMetalHost:
    return BareMetalHost.objects.create(
        name=name, state=state, boot_mac=f"52:54:00:ed:00:{n:02x}", bmc_username=OLD_USER,
        bmc_password=OLD_PASSWORD, labels={"role": "gpu", "rack": "r1"},
        bmc_address=f"redfish+http://10.2.0.{n}:8000/redfish/v1/Systems/{n}", **fields)


@pytest.fixture
def fleet(people):
    """gpu-01 was registered with a wrong BMC address and failed; gpu-02 serves tenant one's claim one-k3x9;
    gpu-03 is free."""
    hosts = {"gpu-01": make_host("gpu-01", HostState.ERROR, 1, bmc_ok=False, bmc_error="BMC unreachable",
                                 error_message="BMC at 10.2.0.99 unreachable"),
             "gpu-02": make_host("gpu-02", HostState.PROVISIONED, 2),
             "gpu-03": make_host("gpu-03", HostState.AVAILABLE, 3)}
    BareMetalHost.objects.filter(pk=hosts["gpu-01"].pk).update(
        bmc_address="redfish+http://10.2.0.99:8000/redfish/v1/Systems/1")
    NodeClaim.objects.create(name="one-k3x9", tenant=people["one"], provider=NodeProvider.objects.create(name="metal3"),
                             pool_name="gpu", host=hosts["gpu-02"], host_name="gpu-02", phase="Available")
    return hosts


def as_user(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def text(response) -> str:
    return unescape(response.content.decode())


def edit(client: Client, name: str, changes: dict):
    """The edit form as the browser sends it: every field as shown, with `changes`."""
    form = client.get(reverse("host-edit", args=[name]))
    assert form.status_code == 200
    html = form.content.decode()
    data = {"csrfmiddlewaretoken": CSRF.search(html).group(1)}
    for tag in re.findall(r"<input [^>]*>", html):
        field, value = re.search(r'name="([^"]*)"', tag), re.search(r'value="([^"]*)"', tag)
        if field and field.group(1) in ("bmc_address", "boot_mac", "bmc_username", "bmc_password"):
            data[field.group(1)] = unescape(value.group(1)) if value else ""
    data["labels"] = unescape(re.search(r'<textarea name="labels"[^>]*>\s*(.*?)</textarea>', html, re.S).group(1))
    data.update(changes)
    return html, client.post(reverse("host-edit", args=[name]), data, follow=True)


def test_an_admin_fixes_a_wrong_bmc_address_from_the_host_page_and_credentials_are_never_shown(fleet, people):
    admin = as_user(people["admin"])
    page = text(admin.get(reverse("host", args=["gpu-01"])))
    assert f'href="{reverse("host-edit", args=["gpu-01"])}"' in page
    form, done = edit(admin, "gpu-01", {"bmc_address": "redfish+http://10.2.0.1:8000/redfish/v1/Systems/1",
                                        "bmc_password": NEW_PASSWORD})
    assert OLD_PASSWORD not in form and OLD_USER not in form  # neither the password nor the user name
    assert done.redirect_chain, re.findall(r"<ul class=\"errorlist\".*?</ul>", text(done), re.S)
    assert done.redirect_chain[-1][0] == reverse("host", args=["gpu-01"])
    result = text(done)
    assert "Host gpu-01 saved; its preflight checks the BMC now; retry it to register it again" in result
    assert NEW_PASSWORD not in result and OLD_PASSWORD not in result
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.bmc_address == "redfish+http://10.2.0.1:8000/redfish/v1/Systems/1"
    assert (host.bmc_username, host.bmc_password) == (OLD_USER, NEW_PASSWORD)  # the empty user name kept
    event = Event.objects.get(host=host, kind="change")
    assert event.actor == "user:root-admin"
    assert event.data["bmc_password"] == ["(set)", "(set)"] and NEW_PASSWORD not in str(event.data)
    assert event.data["bmc_address"][1] == "redfish+http://10.2.0.1:8000/redfish/v1/Systems/1"


def test_an_edit_is_checked_as_apply_checks_it_and_changes_nothing_when_refused(fleet, people):
    admin = as_user(people["admin"])
    _, refused = edit(admin, "gpu-03", {"boot_mac": "52:54:00:ED:00:02", "bmc_address": "ftp://10.2.0.3/"})
    page = text(refused)
    assert refused.status_code == 400
    assert "boot MAC 52:54:00:ed:00:02 is already the boot MAC of host gpu-02" in page
    host = BareMetalHost.objects.get(name="gpu-03")
    assert (host.boot_mac, host.bmc_address) == ("52:54:00:ed:00:03", "redfish+http://10.2.0.3:8000/redfish/v1/Systems/3")
    assert not Event.objects.filter(host=host, kind="change").exists()
    _, labels = edit(admin, "gpu-03", {"labels": "role: [gpu]"})
    assert labels.status_code == 400 and BareMetalHost.objects.get(name="gpu-03").labels == {"role": "gpu", "rack": "r1"}


def test_delete_is_refused_with_host_deletes_reason_and_done_where_it_may(fleet, people):
    admin = as_user(people["admin"])
    refused = text(admin.get(reverse("host-action", args=["gpu-02", "delete"])))
    assert ("Not possible now: it serves claim one-k3x9: a host serving a tenant must be released first (shrink or "
            "delete its pool, or release the claim).") in refused
    assert 'id="confirm-action"' in refused and "<form" not in refused.split('id="confirm-action"', 1)[1]
    page = admin.get(reverse("host-action", args=["gpu-03", "delete"]))
    token = CSRF.search(page.content.decode()).group(1)
    done = admin.post(reverse("host-action", args=["gpu-03", "delete"]), {"csrfmiddlewaretoken": token},
                      follow=True)
    assert done.redirect_chain[-1][0] == reverse("fleet")
    assert "Delete: gpu-03 deleted; its certificates, health runs and Events are kept" in text(done)
    assert not BareMetalHost.objects.filter(name="gpu-03").exists()
    # Asked for anyway (a page left open), the service refuses it under its lock, with the same reason.
    forced = admin.post(reverse("host-action", args=["gpu-02", "delete"]),
                        {"csrfmiddlewaretoken": admin.cookies["csrftoken"].value}, follow=True)
    assert "Delete: gpu-02 cannot be deleted: it serves claim one-k3x9" in text(forced)
    assert BareMetalHost.objects.filter(name="gpu-02").exists()


def bulk(client: Client, action: str, hosts: list[str], data: dict):
    confirmation = client.get(reverse("fleet-bulk"), [("action", action)] + [("host", h) for h in hosts])
    assert confirmation.status_code == 200
    token = CSRF.search(confirmation.content.decode()).group(1)
    body = {"csrfmiddlewaretoken": token, "action": action, "host": hosts, "next": "", **data}
    return confirmation, client.post(reverse("fleet-bulk"), body, follow=True)


def test_a_bulk_edit_sets_credentials_and_labels_host_by_host(fleet, people):
    admin = as_user(people["admin"])
    confirmation, done = bulk(admin, "edit", ["gpu-01", "gpu-03"],
                              {"bmc_username": "ops", "bmc_password": NEW_PASSWORD, "labels_set": "rack: r7",
                               "labels_remove": "role"})
    assert OLD_PASSWORD not in confirmation.content.decode()
    assert "Edit: done for 2 hosts (gpu-01, gpu-03)" in text(done)
    for name in ("gpu-01", "gpu-03"):
        host = BareMetalHost.objects.get(name=name)
        assert (host.bmc_username, host.bmc_password, host.labels) == ("ops", NEW_PASSWORD, {"rack": "r7"})
        assert Event.objects.filter(host=host, kind="change", actor="user:root-admin").count() == 1
    nothing = bulk(admin, "edit", ["gpu-03"], {})[1]
    assert nothing.status_code == 400 and "say what to change" in text(nothing)


def test_a_bulk_delete_reports_each_refusal_and_deletes_the_rest(fleet, people):
    admin = as_user(people["admin"])
    confirmation, done = bulk(admin, "delete", ["gpu-02", "gpu-03"], {"reason": ""})
    assert "will be refused: gpu-02 cannot be deleted: it serves claim one-k3x9" in text(confirmation)
    result = text(done)
    assert "Delete: done for 1 host (gpu-03)" in result
    assert "Delete: gpu-02 cannot be deleted: it serves claim one-k3x9" in result
    assert set(BareMetalHost.objects.values_list("name", flat=True)) == {"gpu-01", "gpu-02"}


@pytest.mark.parametrize("who", ["auditor", "alice"])
def test_auditors_and_members_may_neither_edit_nor_delete(fleet, people, who):
    client = Client()  # without CSRF checks: what is refused is the role, not a missing token
    client.force_login(people[who])
    url = reverse("host-edit", args=["gpu-03"])
    assert client.get(url).status_code == 403
    assert client.post(url, {"bmc_address": "redfish+http://10.6.6.6/redfish/v1/Systems/1", "boot_mac":
                             "52:54:00:ed:00:03", "bmc_password": "mine"}).status_code == 403
    assert client.post(reverse("host-action", args=["gpu-03", "delete"])).status_code == 403
    bulk_edit = client.post(reverse("fleet-bulk"), {"action": "edit", "host": ["gpu-03"], "bmc_password": "mine"})
    assert bulk_edit.status_code == 403
    assert client.post(reverse("fleet-bulk"), {"action": "delete", "host": ["gpu-03"]}).status_code == 403
    host = BareMetalHost.objects.get(name="gpu-03")
    assert (host.bmc_address, host.bmc_password) == ("redfish+http://10.2.0.3:8000/redfish/v1/Systems/3", OLD_PASSWORD)
    assert not Event.objects.filter(actor__startswith="user:").exists()
    # Nor see the Edit link: members do not see the fleet at all; auditors see the host without it.
    if who == "auditor":
        assert url not in text(client.get(reverse("host", args=["gpu-03"])))


def test_a_vendor_s_redfish_address_and_an_inspection_mode_are_set_from_the_host_page_and_what_cannot_hold_is_refused(
        fleet, people):
    from hosts.bmc.client import SCHEME_LIST

    admin = as_user(people["admin"])
    form, done = edit(admin, "gpu-01", {"bmc_address": "ilo5-virtualmedia://10.2.0.1/redfish/v1/Systems/1",
                                        "inspection_mode": "fast"})
    assert 'name="inspection_mode"' in form and done.redirect_chain, text(done)
    host = BareMetalHost.objects.get(name="gpu-01")
    assert (host.bmc_address, host.inspection_mode) == ("ilo5-virtualmedia://10.2.0.1/redfish/v1/Systems/1", "fast")
    assert "fast <span class=\"small muted\">(the host)</span>" in text(admin.get(reverse("host", args=["gpu-01"])))

    _, refused = edit(admin, "gpu-03", {"bmc_address": "idrac://10.2.0.3"})
    assert refused.status_code == 400
    assert f"BMC address scheme idrac:// is not supported: use one of {SCHEME_LIST}" in text(refused)
    _, refused = edit(admin, "gpu-03", {"bmc_address": "ipmi://10.2.0.3", "inspection_mode": "fast"})
    assert refused.status_code == 400 and "fast inspection reads the inventory from a Redfish BMC" in text(refused)
    host = BareMetalHost.objects.get(name="gpu-03")
    assert (host.bmc_address, host.inspection_mode) == ("redfish+http://10.2.0.3:8000/redfish/v1/Systems/3", "")
