"""Web security around the API: agent tokens bound to host and boot, agent rate limits, login throttling,
CSRF, cookie and HSTS settings, password validators, and the secret check itself."""
pytest_plugins = ["tests.api_conftest"]

import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import secrets as random_secrets  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from django.contrib.auth.models import User  # noqa: E402
from django.contrib.auth.password_validation import validate_password  # noqa: E402
from django.core.exceptions import ValidationError  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test import Client  # noqa: E402

from conftest import agent_client_class, agent_lookup_body  # noqa: E402
from hosts.choices import HostState  # noqa: E402
from hosts.models import AgentSession, BareMetalHost, CommandStatus, HostCommand  # noqa: E402
from hosts.services import host_transition  # noqa: E402

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent


# --- agent endpoints ------------------------------------------------------------------------------

def agent_client() -> Client:
    """An agent at an address of its own (on the agent listener), so that rate-limit windows of other tests
    never count here."""
    return agent_client_class()(REMOTE_ADDR=f"fd00::{uuid.uuid4().hex[:4]}:{uuid.uuid4().hex[:4]}")


def post(client, path, body, token=None):
    """Each lookup is a new boot of its host, with the secret its boot path delivered (conftest)."""
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    if path == "/agent/lookup":
        body = agent_lookup_body(body)
    return client.post(path, json.dumps(body), content_type="application/json", **headers)


@pytest.fixture
def booting_host(demo_site):
    """gpu-02, inspecting (its agent is booting), with a queued command that carries a join token."""
    host = BareMetalHost.objects.get(name="gpu-02")
    host_transition(host=host, to_state=HostState.INSPECTING, actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"id": "flow-1", "name": "inspect", "done": {}})
    HostCommand.objects.create(host=host, flow_id="flow-1", step="inspect", name="inspect",
                               secret_args=json.dumps({"join_token": "abcdef.0123456789abcdef"}))
    return host


def test_a_token_from_an_earlier_boot_is_refused_and_changes_nothing(booting_host):
    agent = agent_client()
    first = post(agent, "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": "boot-1"}).json()["token"]
    second = post(agent, "/agent/lookup", {"macs": [booting_host.boot_mac.upper()], "boot_id": "boot-2"}).json()["token"]
    old_session = AgentSession.objects.get(host=booting_host, boot_id="boot-1")
    assert not old_session.active

    replayed = post(agent, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"}, token=first)
    assert replayed.status_code == 403 and replayed.json() == {"error": "token is not valid for this boot"}
    assert AgentSession.objects.get(pk=old_session.pk).last_seen_at == old_session.last_seen_at
    command = HostCommand.objects.get(host=booting_host)
    assert command.status == CommandStatus.QUEUED and command.session is None
    result = post(agent, "/agent/result", {"host_id": booting_host.pk, "command_id": command.public_id, "ok": True},
                  token=first)
    assert result.status_code == 403 and HostCommand.objects.get(pk=command.pk).status == CommandStatus.QUEUED

    foreign = post(agent, "/agent/heartbeat", {"host_id": booting_host.pk + 1, "status": "idle"}, token=second)
    assert foreign.status_code == 403  # bound to its host, too

    current = post(agent, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"}, token=second)
    assert current.status_code == 200
    assert current.json()["command"]["args"] == {"join_token": "abcdef.0123456789abcdef"}  # the agent's own
    assert HostCommand.objects.get(pk=command.pk).status == CommandStatus.SENT


def test_agent_calls_over_the_limit_get_429_with_retry_after_and_change_nothing(booting_host, settings):
    settings.AGENT_RATE_LIMITS = {"lookup": (3, 3600), "call": (5, 3600)}
    agent = agent_client()
    for boot in range(3):
        assert post(agent, "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": f"b{boot}"}).status_code == 200
    sessions = AgentSession.objects.count()
    limited = post(agent, "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": "b4"})
    assert limited.status_code == 429 and 0 < int(limited["Retry-After"]) <= 3600
    assert AgentSession.objects.count() == sessions
    assert post(agent_client(), "/agent/lookup", {"macs": ["52:54:00:ff:ff:ff"]}).status_code == 403  # another address

    token = post(agent_client(), "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": "b5"}).json()["token"]
    session = AgentSession.objects.get(boot_id="b5")
    for _ in range(5):
        assert post(agent, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "busy"}, token=token).status_code == 200
    seen = AgentSession.objects.get(pk=session.pk).last_seen_at
    over = post(agent, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"}, token=token)
    assert over.status_code == 429 and int(over["Retry-After"]) > 0
    assert AgentSession.objects.get(pk=session.pk).last_seen_at == seen
    assert HostCommand.objects.get(host=booting_host).status == CommandStatus.QUEUED
    result = post(agent, "/agent/result", {"host_id": booting_host.pk, "command_id": "c-1", "ok": True}, token=token)
    assert result.status_code == 429


def test_the_default_limits_let_a_lab_of_agents_on_one_address_work(booting_host):
    lab = agent_client()  # every lab agent comes from the same address
    answers = {post(lab, "/agent/lookup", {"macs": [f"52:54:00:ee:{i // 256:02x}:{i % 256:02x}"]}).status_code
               for i in range(200)}
    assert answers == {403}
    token = post(lab, "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": "b1"}).json()["token"]
    beats = {post(lab, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "busy"}, token=token).status_code
             for _ in range(120)}  # two minutes of heartbeats at once
    assert beats == {200}


def test_a_flood_of_forged_tokens_from_one_address_gets_429_and_other_agents_go_on(booting_host, settings):
    settings.AGENT_RATE_LIMITS = {"lookup": (600, 60), "call": (3, 3600), "call_per_address": (10, 3600)}
    token = post(agent_client(), "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": "b1"}).json()["token"]
    session = AgentSession.objects.get(boot_id="b1")
    flood = agent_client()
    answers = [post(flood, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"},
                    token=random_secrets.token_urlsafe(32)).status_code for _ in range(20)]
    assert answers == [403] * 10 + [429] * 10  # each forged token is new: only the address's count stops them
    assert post(flood, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"},
                token=token).status_code == 429  # from that address, even a valid token waits
    assert AgentSession.objects.get(pk=session.pk).last_seen_at == session.last_seen_at
    assert HostCommand.objects.get(host=booting_host).status == CommandStatus.QUEUED

    beat = post(agent_client(), "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"}, token=token)
    assert beat.status_code == 200 and beat.json()["command"]["name"] == "inspect"  # the agent elsewhere goes on
    assert HostCommand.objects.get(host=booting_host).status == CommandStatus.SENT


# --- logins, CSRF, cookies, passwords -------------------------------------------------------------

@pytest.fixture
def person(db, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; what is tested is axes
    return User.objects.create_user("carol-ops", password="correct horse battery staple", is_staff=True)


def login(client, path, password):
    return client.post(path, {"username": "carol-ops", "password": password, "next": "/admin/"},
                       REMOTE_ADDR="192.0.2.10")


@pytest.mark.parametrize("path", ["/login/", "/admin/login/", "/api/auth/login/"])
def test_ten_failed_logins_lock_the_username_out_from_that_address(person, path):
    client = Client()
    for _ in range(9):
        assert login(client, path, "wrong").status_code == 200  # the form again, with an error
    assert login(client, path, "correct horse battery staple").status_code == 302  # a success resets the count
    client.logout()
    for _ in range(10):
        login(client, path, "wrong")
    locked = login(client, path, "correct horse battery staple")
    assert locked.status_code == 429 and "_auth_user_id" not in client.session
    assert locked.content.decode() == "Account locked: too many login attempts. Please try again later."
    elsewhere = client.post(path, {"username": "carol-ops", "password": "correct horse battery staple"},
                            REMOTE_ADDR="192.0.2.99")
    assert elsewhere.status_code == 302  # only that username from that address


def test_force_login_still_works_beside_axes(admin_client):
    assert admin_client.get("/admin/").status_code == 200


def test_login_forms_need_the_csrf_token(person):
    client = Client(enforce_csrf_checks=True)
    assert login(client, "/admin/login/", "correct horse battery staple").status_code == 403
    page = client.get("/admin/login/")
    assert b"csrfmiddlewaretoken" in page.content


def test_weak_passwords_are_refused():
    for weak in ("password", "12345678", "short"):
        with pytest.raises(ValidationError):
            validate_password(weak)
    validate_password("correct horse battery staple")


def settings_in_production() -> dict:
    code = ("import django, json; django.setup(); from django.conf import settings as s; print(json.dumps({k: "
            "getattr(s, k, None) for k in ('SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS', "
            "'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SESSION_COOKIE_HTTPONLY', 'SECURE_CONTENT_TYPE_NOSNIFF', "
            "'X_FRAME_OPTIONS', 'AXES_FAILURE_LIMIT')}))")
    # A production database (never connected to here) and its keys (this run's, tests/run_keys.py); DEBUG unset.
    env = {**{k: v for k, v in os.environ.items() if k != "DEBUG"}, "SECRET_KEY": "production-like-key-" +
           uuid.uuid4().hex, "DATABASE_URL": "postgres://nobody@127.0.0.1:1/production",
           "DJANGO_SETTINGS_MODULE": "vmetal_console.settings", "LOG_LEVEL": "WARNING"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_cookies_are_secure_and_hsts_is_on_when_debug_is_off():
    production = settings_in_production()
    assert production["SESSION_COOKIE_SECURE"] and production["CSRF_COOKIE_SECURE"]
    assert production["SECURE_HSTS_SECONDS"] >= 31536000 and production["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert production["SESSION_COOKIE_HTTPONLY"] and production["SECURE_CONTENT_TYPE_NOSNIFF"]
    assert production["X_FRAME_OPTIONS"] == "DENY" and production["AXES_FAILURE_LIMIT"] == 10


# --- the secret check catches what it is for -------------------------------------------------------

def test_the_secret_check_fails_a_response_or_a_log_line_that_carries_a_secret(world, no_secrets_leak):
    from tests.api_conftest import SecretLeak

    password = BareMetalHost.objects.get(name="gpu-01").bmc_password
    with pytest.raises(SecretLeak):
        no_secrets_leak.check("GET", "/somewhere", HttpResponse(f"<p>{password}</p>"))
    with pytest.raises(SecretLeak):
        no_secrets_leak.check("GET", "/somewhere", HttpResponse(json.dumps({"kubeconfig": world.alpha.kubeconfig})))
    with pytest.raises(SecretLeak):
        no_secrets_leak.check("GET", "/somewhere", HttpResponse(world.tokens["auditor"]))
    from django.conf import settings

    from hosts.gate import certificates

    # The console's keys: the private key that signs erase certificates (whole, or its key material), the session
    # key and the field key. The signing key's public half and its id are public.
    pem = settings.CERTIFICATE_SIGNING_KEY
    for key in (pem, pem.splitlines()[1], settings.SECRET_KEY, settings.FIELD_ENCRYPTION_KEYS[0]):
        with pytest.raises(SecretLeak):
            no_secrets_leak.check("GET", "/somewhere", HttpResponse(key))
    no_secrets_leak.check("GET", "/somewhere", HttpResponse(certificates.published_keys()))
    no_secrets_leak.check("GET", "/somewhere", HttpResponse("nothing to see"))
    logging.getLogger("hosts.bmc.client").warning("login failed with %s", password)
    with pytest.raises(SecretLeak):
        no_secrets_leak.check_logs()
    no_secrets_leak.records.clear()


def test_a_log_line_with_a_secret_fails_the_test_even_when_no_response_was_checked(demo_site, no_secrets_leak):
    from tests.api_conftest import SecretLeak

    password = BareMetalHost.objects.get(name="gpu-01").bmc_password
    logging.getLogger("hosts.bmc.client").warning("login failed with %s", password)
    assert no_secrets_leak.checked == 0
    with pytest.raises(SecretLeak, match="a log line of hosts.bmc.client"):
        no_secrets_leak.finish()  # what the fixture does when the test ends
    no_secrets_leak.records.clear()


def test_a_child_process_that_logs_a_secret_fails_the_test(demo_site, no_secrets_leak, tmp_path):
    from tests.api_conftest import SecretLeak, watch_child_log

    log = tmp_path / "child.log"
    watch_child_log(log)  # as the Celery worker and daphne fixtures do
    password = BareMetalHost.objects.get(name="gpu-02").bmc_password
    with log.open("w") as out:
        subprocess.run([sys.executable, "-c", "import sys; print('redfish login as', sys.argv[1])", password],
                       stdout=out, check=True)
    with pytest.raises(SecretLeak, match="child.log, a child process's log"):
        no_secrets_leak.finish()
    log.write_text("")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_websocket_frame_with_a_secret_fails_where_the_test_receives_it(demo_site):
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from tests.api_conftest import SecretLeak

    password = await database_sync_to_async(lambda: BareMetalHost.objects.get(name="gpu-03").bmc_password)()

    async def leaky(scope, receive, send):  # a consumer that sends what it must not
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": "<td>ok</td>"})
        await send({"type": "websocket.send", "text": f"<td>{password}</td>"})

    communicator = WebsocketCommunicator(leaky, "/ws/fleet/")
    assert (await communicator.connect())[0]
    assert await communicator.receive_from() == "<td>ok</td>"
    with pytest.raises(SecretLeak, match="WS /ws/fleet/"):
        await communicator.receive_from()
    await communicator.disconnect()


def test_an_agent_gets_its_own_hosts_token_and_secret_args_never_another_hosts(booting_host, no_secrets_leak):
    from django.test import RequestFactory

    from tests.api_conftest import SecretLeak

    other = BareMetalHost.objects.get(name="gpu-03")
    host_transition(host=other, to_state=HostState.INSPECTING, actor="test")
    BareMetalHost.objects.filter(pk=other.pk).update(flow={"id": "flow-2", "name": "inspect", "done": {}})
    HostCommand.objects.create(host=other, flow_id="flow-2", step="inspect", name="inspect",
                               secret_args=json.dumps({"join_token": "ghijkl.ghijklmnopqrstuv"}))
    agent = agent_client()
    lookup = post(agent, "/agent/lookup", {"macs": [booting_host.boot_mac], "boot_id": "b1"}).json()
    own = post(agent, "/agent/heartbeat", {"host_id": booting_host.pk, "status": "idle"}, token=lookup["token"])
    assert own.json()["command"]["args"] == {"join_token": "abcdef.0123456789abcdef"}  # passed the check
    other_token = post(agent_client(), "/agent/lookup", {"macs": [other.boot_mac], "boot_id": "b2"}).json()["token"]
    mine = HostCommand.objects.get(host=booting_host).public_id
    theirs = HostCommand.objects.get(host=other).public_id

    def heartbeat_answer(command_id, args):
        response = HttpResponse(json.dumps({"command": {"id": command_id, "name": "inspect", "args": args}}))
        response.wsgi_request = RequestFactory().post("/agent/heartbeat",
                                                      HTTP_AUTHORIZATION=f"Bearer {lookup['token']}")
        return response

    no_secrets_leak.check("POST", "/agent/heartbeat", heartbeat_answer(mine, {"join_token": "abcdef.0123456789abcdef"}))
    for command_id in (theirs, mine):  # another host's args, under its command's id or under the agent's own
        with pytest.raises(SecretLeak):
            no_secrets_leak.check("POST", "/agent/heartbeat",
                                  heartbeat_answer(command_id, {"join_token": "ghijkl.ghijklmnopqrstuv"}))
    with pytest.raises(SecretLeak):  # the bootstrap token's secret part alone is a secret too
        no_secrets_leak.check("POST", "/agent/heartbeat", heartbeat_answer(mine, {"note": "ghijklmnopqrstuv"}))
    foreign_lookup = HttpResponse(json.dumps({"host_id": booting_host.pk, "token": other_token}))
    foreign_lookup.wsgi_request = RequestFactory().post("/agent/lookup")
    with pytest.raises(SecretLeak):  # a lookup answer with another host's token
        no_secrets_leak.check("POST", "/agent/lookup", foreign_lookup)
    with pytest.raises(SecretLeak):  # and an agent token anywhere else
        no_secrets_leak.check("GET", "/hosts/gpu-02/", HttpResponse(lookup["token"]))


def test_a_join_token_is_shown_to_who_may_join_nodes_to_its_tenant_on_the_join_answer_only(world, no_secrets_leak, monkeypatch):
    from django.test import RequestFactory
    from django.utils import timezone

    from claims import tenant_api
    from pools.models import Tenant
    from tests.api_conftest import SecretLeak

    secret = "".join(random_secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(16))
    monkeypatch.setattr(tenant_api.TenantAPI, "create_bootstrap_token", lambda self, ttl_s=0, description="":
                        tenant_api.BootstrapToken(id="abcdef", secret=secret, expires_at=timezone.now()))
    Tenant.objects.filter(pk=world.alpha.pk).update(
        api_endpoint="10.0.0.5:443", kubeconfig="apiVersion: v1\nclusters:\n- name: a\n  cluster:\n    server: x\n")
    member = Client()
    member.force_login(world.users["member_a"])
    answer = member.post("/tenants/alpha/join/", HTTP_HX_REQUEST="true")  # checked centrally, and allowed
    assert f"abcdef.{secret}" in answer.content.decode()

    def join_answer(path, user):
        response = HttpResponse(f"<pre>token=abcdef.{secret}</pre>")
        response.wsgi_request = RequestFactory().post(path)
        response.wsgi_request.user = user
        return response

    no_secrets_leak.made_in_request = {f"abcdef.{secret}", secret}  # as if the token were made just now
    for path, user in [("/tenants/alpha/join/", world.users["member_b"]),  # a member of another tenant
                       ("/tenants/alpha/join/", world.users["auditor"]),  # reads everything, joins nothing
                       ("/tenants/bravo/join/", world.users["member_a"]),  # another tenant's page
                       ("/tenants/alpha/", world.users["member_a"])]:  # any other page
        with pytest.raises(SecretLeak):
            no_secrets_leak.check("POST", path, join_answer(path, user))
    # An admin may join nodes to any tenant: the join answer is theirs too.
    no_secrets_leak.check("POST", "/tenants/alpha/join/", join_answer("/tenants/alpha/join/", world.users["admin"]))
    no_secrets_leak.made_in_request = set()
    with pytest.raises(SecretLeak):  # a token made by an earlier request
        no_secrets_leak.check("POST", "/tenants/alpha/join/", join_answer("/tenants/alpha/join/", world.users["member_a"]))
