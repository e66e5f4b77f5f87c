"""Two clients change a pool's quantity at the same moment, both from the same ETag: one wins, the other gets
412 and changes nothing. Real threads, real transactions (on PostgreSQL the row lock decides; on SQLite the
write lock)."""
pytest_plugins = ["tests.api_conftest"]

import threading  # noqa: E402

import pytest  # noqa: E402
from django.db import connection  # noqa: E402

from events.models import Event  # noqa: E402
from pools.models import NodePool  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("via", ["if-match", "version"])
def test_two_concurrent_quantity_updates_with_the_same_etag_one_wins_one_gets_412(world, via):
    url = f"/api/v1/pools/{world.pool_a.pk}/"
    etag = world.client("member_a").get(url)["ETag"]
    assert etag == 'W/"1"'
    barrier = threading.Barrier(2)
    answers = {}

    def change(role: str, quantity: int):
        client = world.client(role)
        try:
            barrier.wait(timeout=10)
            if via == "if-match":
                answers[role] = client.patch(url, {"quantity": quantity}, format="json", HTTP_IF_MATCH=etag)
            else:
                answers[role] = client.patch(url, {"quantity": quantity, "version": 1}, format="json")
        finally:
            connection.close()

    threads = [threading.Thread(target=change, args=("member_a", 2)), threading.Thread(target=change, args=("admin", 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    statuses = sorted(r.status_code for r in answers.values())
    assert statuses == [200, 412], {k: (r.status_code, r.content) for k, r in answers.items()}
    winner = next(role for role, r in answers.items() if r.status_code == 200)
    loser = next(role for role, r in answers.items() if r.status_code == 412)
    pool = NodePool.objects.get(pk=world.pool_a.pk)
    assert pool.quantity == {"member_a": 2, "admin": 3}[winner] and pool.version == 2
    assert answers[winner]["ETag"] == 'W/"2"'
    assert "changed meanwhile" in answers[loser].json()["detail"]
    changes = Event.objects.filter(object_type="pool", object_name="alpha/gpu", kind="change").exclude(message="created")
    assert [(e.actor, e.message) for e in changes] == [(world.actor(winner), f"quantity: 1 → {pool.quantity}")]
