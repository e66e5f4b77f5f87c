"""Concurrent pool changes never end in a deadlock's 500: quantity changes, applies of vcluster.yaml and
reconciles at once, across two tenants, in every order. Real threads, real transactions, PostgreSQL (the
lock order is in vmetal_console/transactions.py)."""
pytest_plugins = ["tests.api_conftest"]

import random  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402
from django.db import connection, transaction  # noqa: E402

import claims.reconcile  # noqa: E402
from claims.lifecycle import LIVE  # noqa: E402
from claims.reconcile import pools_reconcile  # noqa: E402
from pools.models import NodePool, Tenant  # noqa: E402
from core.transactions import retry_on_deadlock  # noqa: E402

from .api_conftest import waiting_for_a_lock  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

TWO_POOLS = """
privateNodes:
  autoNodes:
    - provider: metal3
      static:
        - {{name: {first}, quantity: {q_first}, nodeTypeSelector: [{{property: vcluster.com/node-type, value: {type_first}}}]}}
        - {{name: {second}, quantity: {q_second}, nodeTypeSelector: [{{property: vcluster.com/node-type, value: {type_second}}}]}}
"""


def two_pools(quantities: dict[str, int], gpu_first: bool = True) -> str:
    """A vcluster.yaml with pools gpu and cpu, in either order (an apply changes them in the order given)."""
    order = ["gpu", "cpu"] if gpu_first else ["cpu", "gpu"]
    return TWO_POOLS.format(first=order[0], second=order[1], q_first=quantities[order[0]],
                            q_second=quantities[order[1]], type_first=f"{order[0]}-server",
                            type_second=f"{order[1]}-server")


def failure(answer) -> str:
    """What a failed request raised (the test client keeps it), else its first bytes."""
    exc = getattr(answer, "exc_info", None)
    return repr(exc[1])[:300] if exc else answer.content[:300].decode(errors="replace")


def client(world, role="admin"):
    answer = world.client(role)
    answer.raise_request_exception = False  # a server error is an answer here, as a user would get it
    return answer


def live_claims(pool: NodePool) -> int:
    return pool.claims.filter(phase__in=list(LIVE)).count()


def test_a_quantity_change_during_a_reconcile_of_the_same_pool_both_succeed(world, monkeypatch):
    # The reconcile locks the pool and is held before it creates the missing claim; the change then locks
    # the tenant and waits for the pool. The claim's insert checks its tenant key: with the tenant locked
    # FOR UPDATE, the two wait for each other and PostgreSQL kills one.
    NodePool.objects.filter(pk=world.pool_a.pk).update(quantity=2)
    holding, release = threading.Event(), threading.Event()
    new_names = claims.reconcile._new_claim_names

    def held_new_names(tenant_names):
        if threading.current_thread().name == "reconcile":
            holding.set()
            assert release.wait(timeout=30), "the test never let the reconcile go on"
        return new_names(tenant_names)

    monkeypatch.setattr(claims.reconcile, "_new_claim_names", held_new_names)
    outcome = {}

    def reconcile():
        try:
            outcome["reconcile"] = pools_reconcile(pool_ids=[world.pool_a.pk])
        except Exception as exc:  # noqa: BLE001: what failed is the test's answer
            outcome["reconcile"] = exc
        finally:
            connection.close()

    def change():
        try:
            outcome["change"] = client(world, "member_a").patch(f"/api/v1/pools/{world.pool_a.pk}/",
                                                                {"quantity": 3}, format="json")
        finally:
            connection.close()

    first = threading.Thread(target=reconcile, name="reconcile")
    second = threading.Thread(target=change, name="change")
    try:
        first.start()
        assert holding.wait(timeout=30), "the reconcile never reached the claims it creates"
        second.start()
        deadline = time.monotonic() + 30
        while second.is_alive() and not waiting_for_a_lock() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert waiting_for_a_lock() or not second.is_alive(), "the change neither waited nor answered"
    finally:
        release.set()
        first.join(60)
        second.join(60)
    assert not isinstance(outcome["reconcile"], Exception), repr(outcome["reconcile"])
    assert outcome["change"].status_code == 200, failure(outcome["change"])
    assert NodePool.objects.get(pk=world.pool_a.pk).quantity == 3
    pools_reconcile(pool_ids=[world.pool_a.pk])
    assert live_claims(world.pool_a) == 3


def test_fifty_mixed_concurrent_changes_give_no_server_error_and_a_consistent_state(world):
    admin = client(world)
    for tenant in ("alpha", "bravo"):
        answer = admin.post("/api/v1/apply/", {"files": [{"name": "vcluster.yaml",
                                                          "text": two_pools({"gpu": 1, "cpu": 1})}],
                                               "tenant": tenant}, format="json")
        assert answer.status_code == 200, answer.content
    pools = list(NodePool.objects.filter(tenant__name__in=["alpha", "bravo"]).order_by("pk"))
    assert len(pools) == 4
    rng = random.Random(10)
    work = ([("patch", rng.choice(pools).pk, rng.randint(0, 2)) for _ in range(22)]
            + [("apply", tenant, {"gpu": rng.randint(0, 2), "cpu": rng.randint(0, 2)}, rng.random() < 0.5)
               for tenant in ["alpha", "bravo"] * 7]
            + [("reconcile", sorted(rng.sample([p.pk for p in pools], rng.randint(1, 4))) if rng.random() < 0.8
                else None) for _ in range(14)])
    rng.shuffle(work)
    assert len(work) == 50
    start = threading.Barrier(10)

    def run(job):
        try:
            if threading.current_thread().name not in started:
                started.add(threading.current_thread().name)
                start.wait(timeout=30)  # the first ten jobs begin together
            kind = job[0]
            if kind == "patch":
                answer = client(world).patch(f"/api/v1/pools/{job[1]}/", {"quantity": job[2]}, format="json")
                return kind, answer.status_code, failure(answer)
            if kind == "apply":
                _, tenant, quantities, gpu_first = job
                answer = client(world).post("/api/v1/apply/", {
                    "files": [{"name": "vcluster.yaml", "text": two_pools(quantities, gpu_first)}], "tenant": tenant,
                }, format="json")
                return kind, answer.status_code, failure(answer)
            try:
                pools_reconcile(pool_ids=job[1])
                return kind, 200, ""
            except Exception as exc:  # noqa: BLE001: a failed reconcile task, as the worker would log it
                return kind, 500, repr(exc)[:300]
        finally:
            connection.close()

    started: set[str] = set()
    with ThreadPoolExecutor(max_workers=10) as pool:
        answers = list(pool.map(run, work))
    failures = [(kind, status, body) for kind, status, body in answers if status >= 500]
    assert failures == [], f"{len(failures)} of {len(answers)} failed: {failures[:3]}"
    assert {status for _, status, _ in answers} == {200}, answers
    pools_reconcile()
    for pool in NodePool.objects.filter(pk__in=[p.pk for p in pools]):
        assert live_claims(pool) == pool.quantity, (pool, pool.quantity, live_claims(pool))


def test_a_service_that_loses_a_deadlock_runs_again_and_succeeds(world):
    # Two transactions lock the two tenants in opposite orders, each holding its first when it asks for its
    # second: PostgreSQL kills one, and the service boundary runs it again.
    both_hold_one = threading.Barrier(2)
    calls = []

    @retry_on_deadlock()
    @transaction.atomic
    def lock_both(first: int, second: int) -> str:
        calls.append(threading.current_thread().name)
        Tenant.objects.select_for_update().get(pk=first)
        if len(calls) <= 2:  # the first try of each
            both_hold_one.wait(timeout=30)
        Tenant.objects.select_for_update().get(pk=second)
        return "done"

    outcome = {}

    def run(name, first, second):
        try:
            outcome[name] = lock_both(first, second)
        except Exception as exc:  # noqa: BLE001: what failed is the test's answer
            outcome[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=("ab", world.alpha.pk, world.bravo.pk), name="ab"),
               threading.Thread(target=run, args=("ba", world.bravo.pk, world.alpha.pk), name="ba")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert outcome == {"ab": "done", "ba": "done"}
    assert len(calls) == 3  # one of them twice
