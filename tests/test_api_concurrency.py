"""Two clients change a pool's quantity at the same moment, both from the same ETag: one wins, the other gets
412 and changes nothing. Real threads, real transactions. The first request is held inside its transaction,
after it has read and locked the pool, until the second one is waiting for that lock (PostgreSQL) or has
answered: without the lock, both would read version 1 and both would win."""
pytest_plugins = ["tests.api_conftest"]

import threading  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402
from django.db import connection  # noqa: E402

import pools.services  # noqa: E402
from events.models import Event  # noqa: E402
from pools.models import NodePool  # noqa: E402

from .api_conftest import waiting_for_a_lock  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("via", ["if-match", "version"])
def test_two_concurrent_quantity_updates_with_the_same_etag_one_wins_one_gets_412(world, via, monkeypatch):
    url = f"/api/v1/pools/{world.pool_a.pk}/"
    etag = world.client("member_a").get(url)["ETag"]
    assert etag == 'W/"1"'
    holding, release = threading.Event(), threading.Event()
    check_quota = pools.services.tenant_check_quota

    def held_check_quota(**kwargs):
        # pool_set_quantity checks the quota after it has locked the pool and compared versions.
        if threading.current_thread().name == "first":
            holding.set()
            assert release.wait(timeout=30), "the test never let the first request go on"
        return check_quota(**kwargs)

    monkeypatch.setattr(pools.services, "tenant_check_quota", held_check_quota)
    answers = {}

    def change(role: str, quantity: int):
        client = world.client(role)
        try:
            if via == "if-match":
                answers[role] = client.patch(url, {"quantity": quantity}, format="json", HTTP_IF_MATCH=etag)
            else:
                answers[role] = client.patch(url, {"quantity": quantity, "version": 1}, format="json")
        finally:
            connection.close()

    first = threading.Thread(target=change, args=("member_a", 2), name="first")
    second = threading.Thread(target=change, args=("admin", 3), name="second")
    try:
        first.start()
        assert holding.wait(timeout=30), "the first request never reached the quota check"
        second.start()
        # On SQLite the second transaction queues behind the first at BEGIN IMMEDIATE, whenever it comes.
        if connection.vendor == "postgresql":
            deadline = time.monotonic() + 30
            while second.is_alive() and not waiting_for_a_lock() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert waiting_for_a_lock() or not second.is_alive(), "the second request neither waited nor answered"
    finally:
        release.set()
        first.join(30)
        second.join(30)
    assert {role: r.status_code for role, r in answers.items()} == {"member_a": 200, "admin": 412}, {
        role: (r.status_code, r.content) for role, r in answers.items()}
    pool = NodePool.objects.get(pk=world.pool_a.pk)
    assert pool.quantity == 2 and pool.version == 2
    assert answers["member_a"]["ETag"] == 'W/"2"'
    assert "changed meanwhile" in answers["admin"].json()["detail"]
    changes = Event.objects.filter(object_type="pool", object_name="alpha/gpu", kind="change").exclude(message="created")
    assert [(e.actor, e.message) for e in changes] == [(world.actor("member_a"), "quantity: 1 → 2")]
