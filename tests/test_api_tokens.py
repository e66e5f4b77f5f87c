"""API tokens that expire and have a scope: several per user, each named; expired, revoked and forged keys are
refused; a read-only token reads and writes nothing; a tenant-limited one sees and changes only its tenants; a
token makes no token broader than itself; the console's /tokens/ page makes one (key shown once) and revokes one.
Every response is checked for secrets (tests/api_conftest.py)."""
pytest_plugins = ["tests.api_conftest"]

import io  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402
from django.core.management import CommandError, call_command  # noqa: E402
from django.test import Client  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from access.models import ApiToken  # noqa: E402
from conftest import wait_for  # noqa: E402
from events.models import Event  # noqa: E402
from pools.models import NodePool, TenantMembership  # noqa: E402
from tests.api_conftest import ISSUED_KEYS  # noqa: E402

pytestmark = pytest.mark.django_db


def by_key(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def cli_token(*args) -> str:
    out = io.StringIO()
    call_command("token", "create", *args, stdout=out)
    key = out.getvalue().strip()
    ISSUED_KEYS.add(key)  # the leak check knows it from here on
    return key


def test_a_token_made_to_live_two_seconds_is_refused_once_they_are_over(world):
    key = cli_token("alice-alpha", "--name", "short", "--expires", "2s")
    client = by_key(key)
    assert client.get("/api/v1/pools/").status_code == 200
    refused = wait_for(lambda: (r := client.get("/api/v1/pools/")).status_code == 401 and r, timeout=10)
    assert "expired" in refused.json()["detail"] and refused["WWW-Authenticate"] == "Token"
    listed = by_key(world.tokens["member_a"]).get("/api/v1/tokens/").json()["results"]
    assert [(t["name"], t["expired"]) for t in listed] == [("short", True), ("token", False)]


def test_a_revoked_token_and_a_forged_one_are_refused_and_the_others_keep_working(world):
    first, second = cli_token("alice-alpha", "--name", "ci"), cli_token("alice-alpha", "--name", "laptop")
    assert by_key(first).delete(f"/api/v1/tokens/{second[:8]}/").status_code == 204
    assert by_key(second).get("/api/v1/pools/").status_code == 401
    assert by_key(first).get("/api/v1/pools/").status_code == 200
    assert by_key(world.tokens["member_a"]).get("/api/v1/pools/").status_code == 200
    forged = first[:8] + "0" * 56  # a real prefix, any key
    assert by_key(forged).get("/api/v1/pools/").status_code == 401
    assert by_key("f" * 64).get("/api/v1/pools/").status_code == 401


def test_posting_a_name_in_use_is_refused_and_replaces_nothing(world):
    client = world.client("member_a")
    made = client.post("/api/v1/tokens/", {"name": "ci", "expires": "12h"}, format="json")
    assert made.status_code == 201 and made.json()["name"] == "ci" and made.json()["scope"] == "read-write"
    again = client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert again.status_code == 400 and "has a token named 'ci'" in str(again.json())
    assert by_key(made.json()["token"]).get("/api/v1/pools/").status_code == 200
    assert ApiToken.objects.filter(user=world.users["member_a"]).count() == 2


@pytest.mark.parametrize("body, message", [
    ({"expires": "400d"}, "longer than the most a token may live"),
    ({"expires": "12"}, "expires"),
    ({"expires": "0s"}, "not a duration"),
    ({"tenants": ["bravo"]}, "no tenant bravo"),  # another tenant's is as unknown as one that does not exist
    ({"tenants": ["nowhere"]}, "no tenant nowhere"),
    ({"name": ""}, "name"),
])
def test_a_token_asked_for_wrongly_is_refused_saying_why_and_nothing_is_made(world, body, message):
    before = ApiToken.objects.count()
    refused = world.client("member_a").post("/api/v1/tokens/", body, format="json")
    assert refused.status_code == 400 and message in str(refused.json())
    assert ApiToken.objects.count() == before


def test_a_read_only_token_reads_but_every_write_is_refused(world):
    key = cli_token("alice-alpha", "--name", "dashboard", "--read-only")
    client = by_key(key)
    assert client.get(f"/api/v1/pools/{world.pool_a.pk}/").status_code == 200
    refused = client.patch(f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2}, format="json")
    assert refused.status_code == 403 and "read-only" in refused.json()["detail"]
    assert NodePool.objects.get(pk=world.pool_a.pk).quantity == 1
    assert client.delete(f"/api/v1/tokens/{world.tokens['member_a'][:8]}/").status_code == 403
    assert client.post("/api/v1/apply/", {}, format="json").status_code == 403
    # it may make tokens, no broader than itself: read only, expiring no later
    assert client.post("/api/v1/tokens/", {"name": "wider"}, format="json").status_code == 400
    made = client.post("/api/v1/tokens/", {"name": "narrow", "read_only": True}, format="json")
    assert made.status_code == 201 and made.json()["scope"] == "read-only"
    assert made.json()["expires_at"] <= client.get("/api/v1/tokens/").json()["results"][0]["expires_at"]


def test_a_tenant_limited_token_sees_and_changes_only_its_tenants(world):
    TenantMembership.objects.create(tenant=world.bravo, user=world.users["member_a"])
    whole = by_key(world.tokens["member_a"])
    assert {p["tenant"] for p in whole.get("/api/v1/pools/").json()["results"]} == {"alpha", "bravo"}
    key = cli_token("alice-alpha", "--name", "alpha-ci", "--only-tenant", "alpha")
    limited = by_key(key)
    assert {p["tenant"] for p in limited.get("/api/v1/pools/").json()["results"]} == {"alpha"}
    assert limited.get(f"/api/v1/pools/{world.pool_b.pk}/").status_code == 404
    assert limited.patch(f"/api/v1/pools/{world.pool_b.pk}/", {"quantity": 2}, format="json").status_code == 404
    assert NodePool.objects.get(pk=world.pool_b.pk).quantity == 1
    assert limited.patch(f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2}, format="json").status_code == 200
    # what it makes is limited as it is: to alpha when it says nothing, and never to bravo
    made = limited.post("/api/v1/tokens/", {"name": "child"}, format="json")
    assert made.status_code == 201 and made.json()["tenants"] == ["alpha"]
    assert limited.post("/api/v1/tokens/", {"name": "escape", "tenants": ["bravo"]}, format="json").status_code == 400
    assert whole.post("/api/v1/tokens/", {"name": "bravo-only", "tenants": ["bravo"]},
                      format="json").json()["tenants"] == ["bravo"]


def test_a_token_expires_no_later_than_the_token_that_made_it(world):
    key = cli_token("alice-alpha", "--name", "short", "--expires", "1h")
    client = by_key(key)
    refused = client.post("/api/v1/tokens/", {"name": "longer", "expires": "2h"}, format="json")
    assert refused.status_code == 400 and "after the token that makes it" in str(refused.json())
    made = client.post("/api/v1/tokens/", {"name": "default"}, format="json").json()
    assert made["expires_at"] == ApiToken.objects.get(prefix=key[:8]).expires_at.isoformat().replace("+00:00", "Z")


def test_admins_and_auditors_tokens_take_no_tenant_limit(world):
    with pytest.raises(CommandError, match="a tenant limit is for members"):
        cli_token("audrey-auditor", "--only-tenant", "alpha")
    with pytest.raises(CommandError, match="a tenant limit is for members"):
        cli_token("ada-admin", "--only-tenant", "alpha")


def test_manage_py_token_list_shows_tokens_without_their_keys_and_last_use(world):
    key = cli_token("bob-bravo", "--name", "ci", "--expires", "12h", "--read-only")
    by_key(key).get("/api/v1/pools/")
    out = io.StringIO()
    call_command("token", "list", "bob-bravo", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and key not in out.getvalue()
    ci = next(line for line in lines if line.startswith(key[:8]))
    assert "  ci  read-only  tenants -  expires " in ci and "last used never" not in ci


def test_the_console_tokens_page_makes_a_token_shown_once_and_revokes_it(world):
    client = Client()
    client.force_login(world.users["member_a"])
    made = client.post("/tokens/", {"name": "laptop", "expires": "12h", "tenants": [world.alpha.pk]})
    assert made.status_code == 201
    key = re.search(r'id="token-key">([0-9a-f]{64})<', made.content.decode())[1]
    token = ApiToken.objects.get(prefix=key[:8])
    assert token.name == "laptop" and list(token.tenants.all()) == [world.alpha]
    assert by_key(key).get("/api/v1/pools/").status_code == 200
    page = client.get("/tokens/").content.decode()
    assert key[:8] in page and key not in page  # listed by prefix; the key was shown that once
    other = Client()
    other.force_login(world.users["member_b"])
    assert other.post(f"/tokens/{key[:8]}/revoke/").status_code == 404  # another's token: not found
    assert client.post(f"/tokens/{key[:8]}/revoke/").status_code == 302
    assert by_key(key).get("/api/v1/pools/").status_code == 401
    assert Event.objects.filter(object_type="token", message=f"API token {key[:8]}… revoked",
                                actor="user:alice-alpha").exists()
    refused = client.post("/tokens/", {"name": "laptop2", "tenants": [world.bravo.pk]})
    assert refused.status_code == 400 and ApiToken.objects.filter(name="laptop2").count() == 0


def test_a_token_s_use_is_recorded_at_most_once_a_minute(world):
    key = cli_token("bob-bravo", "--name", "ci")
    client = by_key(key)
    client.get("/api/v1/pools/")
    first = ApiToken.objects.get(prefix=key[:8]).last_used_at
    assert first is not None
    client.get("/api/v1/pools/")
    assert ApiToken.objects.get(prefix=key[:8]).last_used_at == first


@pytest.mark.django_db(transaction=True)
def test_a_token_made_before_tokens_had_names_and_expiries_keeps_working_after_the_migration():
    import hashlib

    from django.contrib.auth.models import User
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("vmetal_api", "0001_api_token")])
    try:
        user = User.objects.create(username="old-bot", is_staff=True)
        key = "ab" * 32
        ISSUED_KEYS.add(key)
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO vmetal_api_apitoken (prefix, key_hash, user_id, created) "
                           "VALUES (%s, %s, %s, %s)", [key[:8], hashlib.sha256(key.encode()).hexdigest(), user.pk,
                                                       "2026-01-01 00:00:00+00:00"])
    finally:
        MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    token = ApiToken.objects.get(prefix=key[:8])
    assert token.name == "token" and not token.read_only and not token.expired()
    assert by_key(key).get("/api/v1/hosts/").status_code == 200
