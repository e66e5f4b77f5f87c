"""Browser sessions' limits and sign-in rules: the idle timeout, the fresh sign-in that destructive actions ask
for, LOCAL_SIGN_IN=break-glass, and the roles an identity provider's groups give (the browser test against a real
provider is test_oidc_browser)."""
import time

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from access.roles import mapping_errors, roles_from_groups
from access.sessions import SEEN_AT, SIGNED_IN_AT
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import Tenant

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db


def session_aged(client, **ages_s) -> None:
    """Move the session's sign-in (signed_in_at) or last use (seen_at) this many seconds into the past."""
    session = client.session
    for key, age in ages_s.items():
        session[key] = int(time.time() - age)
    session.save()


def free_host() -> BareMetalHost:
    return BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()


# --- the idle timeout -------------------------------------------------------------------------------------------

def test_a_session_idle_longer_than_the_timeout_asks_to_sign_in_again(client, users, settings):
    client.force_login(users["admin"])
    assert client.get(reverse("fleet")).status_code == 200
    session_aged(client, seen_at=settings.SESSION_IDLE_TIMEOUT_S + 5)
    response = client.get(reverse("fleet"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert "idle=1" in response["Location"]
    assert client.get(reverse("fleet")).status_code == 302  # signed out, not just sent away once
    assert "idle too long" in client.get(response["Location"]).content.decode()


def test_a_session_in_use_stays_and_an_idle_one_is_refused_by_the_api_too(client, users, settings):
    client.force_login(users["admin"])
    session_aged(client, seen_at=settings.SESSION_IDLE_TIMEOUT_S - 120)
    assert client.get("/api/v1/pools/").status_code == 200
    assert time.time() - client.session[SEEN_AT] < 60  # the use counted: the session lives on
    session_aged(client, seen_at=settings.SESSION_IDLE_TIMEOUT_S + 5)
    response = client.get("/api/v1/pools/")
    assert response.status_code == 401 and "sign in again" in response.json()["detail"]


# --- a fresh sign-in before destructive actions ----------------------------------------------------------------

def test_retiring_a_host_with_an_old_sign_in_asks_for_a_new_one_and_retires_nothing(client, users, settings):
    from hosts.services import host_set_maintenance

    client.force_login(users["admin"])
    host = free_host()
    host_set_maintenance(host=host, on=True, actor="test", reason="to be retired")
    url = reverse("host-action", args=[host.name, "retire"])
    session_aged(client, signed_in_at=settings.FRESH_SIGN_IN_S + 5)
    page = client.get(url).content.decode()
    assert 'id="sign-in-again"' in page and 'id="id_reason"' not in page
    client.post(url, {"reason": "end of life"})
    host.refresh_from_db()
    assert host.state == HostState.MAINTENANCE
    again = client.post(reverse("sign-in-again"), {"next": url})
    assert again.status_code == 302 and again["Location"].startswith(reverse("login"))
    assert "fresh=1" in again["Location"] and client.get(url).status_code == 302  # signed out
    # Signing in again (the login form, as a person does) leads back to the action, which now goes ahead.
    back = client.post(reverse("login"), {"username": "root-admin", "password": PASSWORD, "next": url})
    assert back["Location"] == url
    assert 'id="id_reason"' in client.get(url).content.decode()
    client.post(url, {"reason": "end of life"})
    host.refresh_from_db()
    assert host.state == HostState.RETIRED


def test_a_non_destructive_action_does_not_ask_for_a_new_sign_in(client, users, settings):
    client.force_login(users["admin"])
    host = free_host()
    session_aged(client, signed_in_at=settings.FRESH_SIGN_IN_S + 5)
    client.post(reverse("host-action", args=[host.name, "maintenance-on"]), {"reason": "fan swap"})
    host.refresh_from_db()
    assert host.state == HostState.MAINTENANCE


def test_a_bulk_power_off_with_an_old_sign_in_does_nothing(client, users, settings):
    client.force_login(users["admin"])
    host = free_host()
    session_aged(client, signed_in_at=settings.FRESH_SIGN_IN_S + 5)
    query = f"?action=power-off&host={host.name}"
    assert 'id="sign-in-again"' in client.get(reverse("fleet-bulk") + query).content.decode()
    events = Event.objects.count()
    response = client.post(reverse("fleet-bulk"), {"action": "power-off", "host": [host.name]}, follow=True)
    assert "needs a sign-in of the last 15 minutes" in response.content.decode()
    assert Event.objects.count() == events


def test_a_join_command_with_an_old_sign_in_makes_no_token(client, users, settings, monkeypatch):
    from claims import tenant_api

    made = []
    monkeypatch.setattr(tenant_api.TenantAPI, "create_bootstrap_token", lambda *a, **k: made.append(1))
    tenant = Tenant.objects.get(name="one")
    tenant.kubeconfig = "apiVersion: v1\nclusters:\n- name: one\n  cluster:\n    server: https://10.0.0.5:443\n"
    tenant.save(update_fields=["kubeconfig"])
    client.force_login(users["alice"])
    session_aged(client, signed_in_at=settings.FRESH_SIGN_IN_S + 5)
    response = client.post(reverse("tenant-join", args=["one"]), HTTP_HX_REQUEST="true")
    assert 'id="sign-in-again"' in response.content.decode() and made == []


def test_deleting_a_host_through_the_api_with_an_old_browser_session_is_refused(client, users, settings):
    from hosts.services import host_set_maintenance

    host = free_host()
    host_set_maintenance(host=host, on=True, actor="test", reason="to be removed")
    client.force_login(users["admin"])
    session_aged(client, signed_in_at=settings.FRESH_SIGN_IN_S + 5)
    refused = client.delete(f"/api/v1/hosts/{host.pk}/", HTTP_X_CSRFTOKEN="x")
    assert refused.status_code == 403 and "sign in again" in refused.json()["detail"]
    assert BareMetalHost.objects.filter(pk=host.pk).exists()
    session_aged(client, signed_in_at=0)
    assert client.delete(f"/api/v1/hosts/{host.pk}/").status_code == 204


def test_signing_in_again_goes_back_only_to_a_page_of_this_console(client, users):
    client.force_login(users["admin"])
    again = client.post(reverse("sign-in-again"), {"next": "https://evil.example/steal"})
    assert "evil.example" not in again["Location"]


# --- break-glass ------------------------------------------------------------------------------------------------

def test_break_glass_refuses_passwords_of_everyone_but_superusers_on_both_login_pages(client, users, settings):
    settings.LOCAL_SIGN_IN = "break-glass"
    User.objects.create_user("stan", password=PASSWORD, is_staff=True)  # staff: the admin's login would let in
    for username in ("alice", "stan"):
        response = client.post(reverse("login"), {"username": username, "password": PASSWORD})
        assert response.status_code == 200 and "_auth_user_id" not in client.session, username
        response = client.post("/admin/login/", {"username": username, "password": PASSWORD})
        assert response.status_code == 200 and "_auth_user_id" not in client.session, username
    response = client.post(reverse("login"), {"username": "root-admin", "password": PASSWORD})
    assert response.status_code == 302 and client.session[SIGNED_IN_AT]


def test_break_glass_ends_a_non_superuser_s_password_session(client, users, settings):
    client.force_login(users["alice"], backend="access.sessions.LocalPasswordBackend")
    assert client.get(reverse("tenant", args=["one"])).status_code == 200
    settings.LOCAL_SIGN_IN = "break-glass"
    assert client.get(reverse("tenant", args=["one"])).status_code == 302


# --- groups to roles --------------------------------------------------------------------------------------------

def test_groups_map_to_roles_by_the_default_setting_keycloak_paths_included():
    roles = roles_from_groups(["/platform-auditors", "platform-operators", "tenant-my-team-admins",
                               "tenant-one-viewers", "tenant-one-admins", "tenant-two-viewers", "developers", 7])
    assert roles.platform == "operator"  # the strongest platform role given
    assert roles.tenants == {"my-team": "admin", "one": "admin", "two": "viewer"}
    assert roles_from_groups("platform-admins").platform is None  # a claim that is not a list gives nothing
    assert roles_from_groups(["tenant--admins", "tenant-Evil-admins"]).tenants == {}


def test_a_group_to_role_setting_that_names_no_role_is_an_error():
    assert mapping_errors({"ops": "operators"}) == [
        "OIDC_GROUP_ROLES['ops']: role 'operators', expected one of admin, operator, auditor, tenant-admin, "
        "tenant-viewer"]
    assert mapping_errors({"admins": "tenant-admin"})
    assert mapping_errors({"{tenant}-ops": "operator"})
    assert mapping_errors(["platform-admins"])
    assert mapping_errors({"k8s-{tenant}-owners": "tenant-admin", "sre": "operator"}) == []
