"""Which address login throttling and the agent rate limits count: REMOTE_ADDR, or X-Forwarded-For's only when
REMOTE_ADDR is a configured trusted proxy (TRUSTED_PROXIES). Behind no proxy a forged header locks no one out
and lets no one out; behind one, each client is counted by its own address, not the proxy's."""
import json
import uuid

import pytest

from conftest import agent_client_class
from axes.models import AccessAttempt
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"
PROXY = "10.20.0.5"


@pytest.fixture
def person(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; what is tested is axes
    return User.objects.create_user("carol-ops", password=PASSWORD, is_staff=True)


def login(password: str, remote: str, forwarded: str | None = None):
    headers = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded is not None else {}
    return Client().post("/admin/login/", {"username": "carol-ops", "password": password, "next": "/admin/"},
                         REMOTE_ADDR=remote, **headers)


def test_without_trusted_proxies_a_forged_forwarded_for_neither_locks_its_victim_nor_frees_the_attacker(person):
    for n in range(10):  # the attacker names the victim's address, and a new one each time
        login("wrong", "192.0.2.66", forwarded="198.51.100.7" if n % 2 else f"203.0.113.{n}")
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"192.0.2.66"}
    assert login(PASSWORD, "192.0.2.66", forwarded="203.0.113.200").status_code == 429  # still locked out
    assert login(PASSWORD, "198.51.100.7").status_code == 302  # the victim logs in


def test_behind_a_trusted_proxy_the_forwarded_client_is_locked_not_the_proxy(person, settings):
    settings.TRUSTED_PROXIES = ["10.20.0.0/16"]
    for n in range(10):  # what the client wrote comes first; the proxy appends the address it saw
        login("wrong", PROXY, forwarded=f"198.51.100.{n}, 192.0.2.66")
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"192.0.2.66"}
    assert login(PASSWORD, PROXY, forwarded="192.0.2.66").status_code == 429
    assert login(PASSWORD, PROXY, forwarded="198.51.100.7").status_code == 302  # another client, same proxy


def fresh_address(prefix: str) -> str:
    """An address of this run's own: the rate-limit windows live in the cache (Redis) across tests."""
    return f"{prefix}.{uuid.uuid4().int % 250 + 1}.{uuid.uuid4().int % 250 + 1}"


@pytest.mark.parametrize("trusted", [False, True])
def test_agent_lookups_are_counted_per_client_by_the_same_rule(demo_site, settings, trusted):
    settings.AGENT_RATE_LIMITS = {"lookup": (2, 3600)}
    settings.TRUSTED_PROXIES = ["10.20.0.0/16"] if trusted else []
    proxy, first, second = fresh_address("10.20"), fresh_address("198.18"), fresh_address("198.19")

    def lookup(forwarded):
        return agent_client_class()().post("/agent/lookup", json.dumps({"macs": ["52:54:00:ff:ff:ff"]}),
                             content_type="application/json", REMOTE_ADDR=proxy, HTTP_X_FORWARDED_FOR=forwarded)

    assert [lookup(first).status_code != 429 for _ in range(2)] == [True, True]
    assert lookup(first).status_code == 429
    other_client = lookup(second)
    assert (other_client.status_code == 429) is not trusted  # one address without a trusted proxy; two with
