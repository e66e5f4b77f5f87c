"""Roles in the console's pages and commands: every role against every kind of page and change, two tenants
(one, two), and how person users are made (`manage.py user create`). The API's matrix is test_api_isolation."""
import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import TenantMembership

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD, pool  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db

ROLES = ("admin", "operator", "auditor", "alice", "vic", "bob", "anonymous")
# alice administers tenant one, vic views it, bob administers two.


@pytest.fixture
def people(users, console_site):
    from pools.services import pool_set_quantity

    operator = User.objects.create_user("otto", "otto@example.invalid", PASSWORD)
    operator.groups.add(Group.objects.get_or_create(name="operators")[0])
    vic = User.objects.create_user("vic", "vic@example.invalid", PASSWORD)
    TenantMembership.objects.create(tenant=console_site["one"], user=vic, role="viewer")
    pool_set_quantity(pool=pool("one", "gpu"), quantity=1, actor="test")
    call_command("reconcile", stdout=io.StringIO())
    return {**users, "operator": operator, "vic": vic}


def signs_in(client, username: str, password: str) -> bool:
    """Through the login form, as a person does."""
    response = client.post(reverse("login"), {"username": username, "password": password})
    return response.status_code == 302 and not response["Location"].startswith(reverse("login"))


def answers(client, people, method: str, url: str, data=None) -> dict:
    """Each role's status for one request; a redirect to the login page reads as "login"."""
    got = {}
    for role in ROLES:
        client.logout()
        if role != "anonymous":
            client.force_login(people[role])
        response = getattr(client, method)(url, data or {})
        login = response.status_code == 302 and response["Location"].startswith(reverse("login"))
        got[role] = "login" if login else response.status_code
    return got


def expect(*codes) -> dict:
    return dict(zip(ROLES, codes))


STAFF_PAGE = expect(200, 200, 200, 403, 403, 403, "login")
ADMIN_PAGE = expect(200, 403, 403, 403, 403, 403, "login")
ANYONE = expect(200, 200, 200, 200, 200, 200, "login")
ONES = expect(200, 200, 200, 200, 200, 404, "login")  # tenant one's: two's admin does not see it


def test_every_role_gets_the_expected_answer_from_every_page(client, people):
    claim = NodeClaim.objects.get(tenant__name="one")
    free = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    pages = {
        reverse("fleet"): STAFF_PAGE, reverse("repair"): STAFF_PAGE, reverse("timing"): STAFF_PAGE,
        reverse("providers"): STAFF_PAGE, reverse("node-types"): STAFF_PAGE, reverse("environments"): STAFF_PAGE,
        reverse("images"): STAFF_PAGE, reverse("fleet-export"): STAFF_PAGE,
        reverse("apply"): ADMIN_PAGE, reverse("catalogue-create", args=["providers"]): ADMIN_PAGE,
        reverse("catalogue-edit", args=["tenants", "one"]): ADMIN_PAGE,
        reverse("host-action", args=[free.name, "maintenance-on"]): expect(200, 200, 403, 403, 403, 403, "login"),
        reverse("host-action", args=[free.name, "retire"]): ADMIN_PAGE,
        reverse("fleet-bulk") + f"?action=power-on&host={free.name}": expect(200, 200, 403, 403, 403, 403, "login"),
        reverse("fleet-bulk") + f"?action=release&host={claim.host.name}": ADMIN_PAGE,
        reverse("tenants"): ANYONE, reverse("claims"): ANYONE, reverse("events"): ANYONE,
        reverse("tenant", args=["one"]): ONES, reverse("pool", args=["one", "gpu"]): ONES,
        reverse("claim", args=[claim.name]): ONES, reverse("host", args=[claim.host.name]): ONES,
        reverse("host", args=[free.name]): expect(200, 200, 200, 404, 404, 404, "login"),
    }
    mismatches = [f"{url}: {got}, expected {want}" for url, want in pages.items()
                  if (got := answers(client, people, "get", url)) != want]
    assert not mismatches, "\n" + "\n".join(mismatches)


def test_only_the_platform_admin_and_one_s_tenant_admin_change_one_s_pool(client, people):
    url = reverse("pool-quantity", args=["one", "gpu"])
    got = answers(client, people, "post", url, {"quantity": 1})
    assert got == expect(302, 403, 403, 302, 403, 404, "login")
    for role in ("operator", "auditor", "vic", "bob"):
        client.force_login(people[role])
        client.post(url, {"quantity": 2})
        assert pool("one", "gpu").quantity == 1, role
    assert not Event.objects.filter(actor__in=["user:otto", "user:audrey", "user:vic", "user:bob"]).exists()


def test_a_tenant_viewer_sees_no_quantity_form_and_no_join_button_and_may_not_join(client, people):
    client.force_login(people["vic"])
    html = client.get(reverse("tenant", args=["one"])).content.decode()
    assert "Join Node" not in html and 'name="quantity"' not in html
    assert client.post(reverse("tenant-join", args=["one"])).status_code == 403
    client.force_login(people["alice"])
    html = client.get(reverse("tenant", args=["one"])).content.decode()
    assert "Join Node" in html and 'name="quantity"' in html


def test_an_operator_acts_on_hosts_but_retires_none_and_edits_no_catalogue(client, people):
    client.force_login(people["operator"])
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    page = client.get(reverse("host", args=[host.name])).content.decode()
    assert "Maintenance on…" in page and "Retire…" not in page
    client.post(reverse("host-action", args=[host.name, "maintenance-on"]), {"reason": "fan swap"})
    host.refresh_from_db()
    assert host.state == HostState.MAINTENANCE
    assert Event.objects.filter(host_id=host.pk, to_state="maintenance", actor="user:otto").exists()
    assert client.post(reverse("host-action", args=[host.name, "retire"]), {"reason": "x"}).status_code == 403
    host.refresh_from_db()
    assert host.state == HostState.MAINTENANCE
    claim_host = NodeClaim.objects.get(tenant__name="one").host
    refused = client.post(reverse("fleet-bulk"), {"action": "release", "host": [claim_host.name]})
    assert refused.status_code == 403 and NodeClaim.objects.get(tenant__name="one").phase != "Releasing"
    fleet = client.get(reverse("fleet")).content.decode()
    assert 'id="bulk-form"' in fleet and 'value="release"' not in fleet
    assert client.post(reverse("catalogue-create", args=["providers"]), {"name": "x"}).status_code == 403


def test_the_auditor_sees_the_fleet_without_any_action(client, people):
    client.force_login(people["auditor"])
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    assert "Maintenance on…" not in client.get(reverse("host", args=[host.name])).content.decode()
    assert 'id="bulk-form"' not in client.get(reverse("fleet")).content.decode()


# --- roles on a fresh install, and person users ----------------------------------------------------------------

def test_a_fresh_install_has_every_group_the_docs_name():
    assert set(Group.objects.values_list("name", flat=True)) >= {"operators", "auditors"}


def test_user_create_prints_a_made_password_once_and_it_signs_in(client, console_site):
    out = io.StringIO()
    call_command("user", "create", "olga", "--role", "operator", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "user olga made (operator)"
    password = lines[1].removeprefix("password: ")
    assert len(password) >= 20 and password not in "".join(Event.objects.values_list("message", flat=True))
    assert signs_in(client, "olga", password)
    olga = User.objects.get(username="olga")
    assert olga.groups.filter(name="operators").exists() and not olga.is_staff
    assert Event.objects.filter(object_type="user", object_name="olga", actor__startswith="cli:").exists()


def test_user_create_reads_a_password_from_standard_input_never_from_the_command_line(
        client, console_site, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("a-Long-enough-passphrase-93\n"))
    out = io.StringIO()
    call_command("user", "create", "tess", "--role", "tenant-viewer", "--tenant", "one", "--password-stdin",
                 stdout=out)
    assert "password" not in out.getvalue()
    assert signs_in(client, "tess", "a-Long-enough-passphrase-93")
    assert TenantMembership.objects.get(user__username="tess").role == "viewer"
    with pytest.raises(CommandError, match="unrecognized arguments"):
        call_command("user", "create", "eve", "--role", "admin", "--password", "on-the-command-line")


@pytest.mark.parametrize("argv, error", [
    (["--role", "tenant-admin"], "give --tenant"),
    (["--role", "tenant-admin", "--tenant", "nowhere"], "no tenant 'nowhere'"),
    (["--role", "auditor", "--tenant", "one"], "--tenant is for tenant-admin and tenant-viewer"),
])
def test_user_create_refuses_a_wrong_role_or_tenant_and_makes_nothing(console_site, argv, error):
    with pytest.raises(CommandError, match=error):
        call_command("user", "create", "mallory", *argv, stdout=io.StringIO())
    assert not User.objects.filter(username="mallory").exists()


def test_user_create_refuses_an_existing_user_and_a_weak_password(console_site, monkeypatch):
    User.objects.create_user("taken")
    with pytest.raises(CommandError, match="exists already"):
        call_command("user", "create", "taken", "--role", "admin", stdout=io.StringIO())
    assert not User.objects.get(username="taken").is_staff
    monkeypatch.setattr("sys.stdin", io.StringIO("1234\n"))
    with pytest.raises(CommandError, match="too short"):
        call_command("user", "create", "weak", "--role", "admin", "--password-stdin", stdout=io.StringIO())
    assert not User.objects.filter(username="weak").exists()


def test_membership_gives_a_tenant_role_and_changes_it(console_site):
    User.objects.create_user("pat")
    call_command("membership", "add", "pat", "one", "--role", "viewer", stdout=io.StringIO())
    assert TenantMembership.objects.get(user__username="pat").role == "viewer"
    call_command("membership", "add", "pat", "one", "--role", "admin", stdout=io.StringIO())
    assert TenantMembership.objects.get(user__username="pat").role == "admin"
    assert Event.objects.filter(object_type="membership", message__contains="viewer → admin").exists()


def test_the_admin_s_user_form_assigns_the_role_groups_and_each_tenant_s_role(client, people):
    client.force_login(people["admin"])
    page = client.get(f"/admin/auth/user/{people['vic'].pk}/change/").content.decode()
    assert ">operators<" in page and ">auditors<" in page  # the groups to pick from
    assert 'name="tenant_memberships-__prefix__-role"' in page  # a new membership row takes its role
    assert "tenant viewer" in page and "tenant admin" in page  # vic's row, and the choices of a new one
