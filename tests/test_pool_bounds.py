"""No one number makes the console work without end: every count of nodes (a static pool's quantity, a dynamic
pool's limits.nodes and group size, a NodeType's warm hosts) stays within POOL_MAX_NODES, refused with 400 naming
the bound by the API, apply (dry run too), the console and the admin alike; and a reconcile pass makes at most
RECONCILE_BATCH claims of a pool, each pool in its own short transaction, so no tenant's pool slows another's."""
import re
import threading

import pytest
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from claims.lifecycle import LIVE
from claims.models import NodeClaim
from claims.reconcile import pools_reconcile
from claims.task_names import RECONCILE_POOLS
from conftest import DEMO, is_postgres, wait_for
from events.models import Event
from pools.models import NodePool, NodeType
from pools.services import pool_create

from .factories import form_data

pytestmark = pytest.mark.django_db

HUGE = [2**31, 10**9]
BOUND = "at most 10000 nodes (POOL_MAX_NODES)"


@pytest.fixture
def reconciles(monkeypatch):
    """The pool ids each reconcile was asked for (instead of sending the Celery task)."""
    calls = []
    monkeypatch.setattr("pools.services.pools_changed", lambda *, pool_ids: calls.append(pool_ids))
    return calls


@pytest.fixture
def passes_asked(monkeypatch):
    """The pool ids each pass asked to be reconciled again (instead of sending the Celery task)."""
    calls = []
    monkeypatch.setattr("claims.reconcile.task_send_on_commit",
                        lambda name, **kwargs: calls.append(kwargs["pool_ids"]) if name == RECONCILE_POOLS else None)
    return calls


def state():
    return (sorted(NodePool.objects.values_list("name", "quantity", "limits", "group", "version")),
            NodeClaim.objects.count(), Event.objects.count())


@pytest.mark.parametrize("quantity", HUGE)
def test_a_member_s_huge_quantity_is_a_400_naming_the_bound_and_changes_nothing(world, api, reconciles, quantity):
    before = state()
    response = api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": quantity})
    assert response.status_code == 400, response.content
    assert response.json() == {"quantity": [f"{BOUND}, not {quantity}"]}
    assert state() == before and reconciles == []
    pools_reconcile()  # and a pass makes no claim for it
    assert NodeClaim.objects.count() == before[1]


@pytest.mark.parametrize("quantity", HUGE)
def test_a_member_s_new_pool_of_a_huge_quantity_is_a_400_and_makes_nothing(world, api, reconciles, quantity):
    before = state()
    response = api("member_a", "post", "/api/v1/pools/", {
        "tenant": "alpha", "name": "many", "provider": "metal3", "quantity": quantity,
        "node_type_selector": [{"property": "vcluster.com/node-type", "value": "cpu-server"}]})
    assert response.status_code == 400 and response.json() == {"quantity": [f"{BOUND}, not {quantity}"]}
    assert state() == before and reconciles == []


def test_the_bound_is_the_setting_and_a_quantity_at_it_is_taken(world, api, reconciles, settings):
    settings.POOL_MAX_NODES = 5
    assert api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 5}).status_code == 200
    refused = api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 6})
    assert refused.json() == {"quantity": ["at most 5 nodes (POOL_MAX_NODES), not 6"]}
    world.pool_a.refresh_from_db()
    assert world.pool_a.quantity == 5 and reconciles == [[world.pool_a.pk]]


def test_a_dynamic_pool_s_node_limit_and_a_group_size_are_bounded_alike(world, api, reconciles, settings):
    before = state()
    body = {"tenant": "alpha", "name": "burst", "provider": "metal3", "kind": "dynamic",
            "node_type_selector": [{"property": "vcluster.com/node-type", "value": "gpu-server"}]}
    refused = api("member_a", "post", "/api/v1/pools/", {**body, "limits": {"nodes": "1e9"}})
    assert refused.status_code == 400
    assert refused.json() == {"limits": [f"limits.nodes: {BOUND}, not 1000000000"]}
    settings.POOL_MAX_NODES = 3
    refused = api("member_a", "post", "/api/v1/pools/", {**body, "group": {"size": 4}})
    assert refused.status_code == 400
    assert refused.json() == {"group": ["group.size: at most 3 nodes (POOL_MAX_NODES), not 4"]}
    assert state() == before and reconciles == []


def test_an_admin_s_warm_hosts_past_the_bound_are_a_400(world, api):
    node_type = NodeType.objects.get(name="gpu-server")
    refused = api("admin", "patch", f"/api/v1/nodetypes/{node_type.pk}/", {"warm_hosts": 20000})
    assert refused.status_code == 400 and refused.json() == {"warm_hosts": [f"{BOUND}, not 20000"]}
    node_type.refresh_from_db()
    assert node_type.warm_hosts == 1


@pytest.mark.parametrize("dry_run", [False, True])
def test_apply_refuses_a_huge_quantity_naming_file_document_and_line(world, apply, dry_run):
    before = state()
    text = (
        "privateNodes:\n"
        "  autoNodes:\n"
        "    - provider: metal3\n"
        "      static:\n"
        "        - name: gpu\n"
        f"          quantity: {2**31}\n"
        "          nodeTypeSelector:\n"
        "            - {property: vcluster.com/node-type, value: gpu-server}\n")
    with pytest.raises(CommandError) as info:
        apply(text, tenant="alpha", dry_run=dry_run, names=["alpha.yaml"])
    message = str(info.value)
    assert "/alpha.yaml: document 1" in message and "(line 6)" in message, message
    assert f"{BOUND}, not {2**31}" in message, message
    assert state() == before


def test_apply_refuses_a_dynamic_pool_s_node_limit_past_the_bound(world, apply):
    before = state()
    text = (
        "privateNodes:\n"
        "  autoNodes:\n"
        "    - provider: metal3\n"
        "      dynamic:\n"
        "        - name: burst\n"
        "          limits:\n"
        "            nodes: '1000000000'\n")
    with pytest.raises(CommandError) as info:
        apply(text, tenant="alpha", dry_run=True, names=["alpha.yaml"])
    message = str(info.value)
    assert "/alpha.yaml: document 1" in message and "(line 6)" in message, message
    assert f"limits.nodes: {BOUND}, not 1000000000" in message, message
    assert state() == before


def test_apply_refuses_a_node_type_s_warm_hosts_past_the_bound(world, apply):
    before = state()
    site = (DEMO / "site.yaml").read_text()
    line = site.splitlines().index("          hosts: 1") + 1
    with pytest.raises(CommandError) as info:
        apply(site.replace("          hosts: 1\n", "          hosts: 20000\n"), names=["site.yaml"])
    assert f"(line {line})" in str(info.value) and f"{BOUND}, not 20000" in str(info.value), str(info.value)
    assert state() == before and NodeType.objects.get(name="gpu-server").warm_hosts == 1


@pytest.mark.parametrize("dry_run", [False, True])
def test_the_apply_api_refuses_a_member_s_huge_quantity(world, api, dry_run):
    before = state()
    text = ("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
            f"          quantity: {10**9}\n")
    response = api("member_a", "post", "/api/v1/apply/", {"files": [{"name": "alpha.yaml", "text": text}],
                                                          "tenant": "alpha", "dry_run": dry_run})
    assert response.status_code == 400, response.content
    detail = response.json()["detail"]
    assert "alpha.yaml: document 1" in detail and "(line 6)" in detail and f"{BOUND}, not {10**9}" in detail, detail
    assert state() == before


@pytest.mark.parametrize("action", ["preview", "apply"])
def test_the_console_s_apply_page_refuses_a_huge_quantity_in_preview_and_apply(world, action):
    before = state()
    member = Client()
    member.force_login(world.users["admin"])  # the page is the admins'; members apply through the API
    text = ("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
            f"          quantity: {2**31}\n")
    page = member.post("/apply/", {"text": text, "tenant": "alpha", "action": action})
    assert page.status_code == 400
    assert "pasted.yaml: document 1" in page.content.decode() and f"{BOUND}, not {2**31}" in page.content.decode()
    assert state() == before


@pytest.mark.parametrize("quantity", HUGE)
def test_the_console_s_quantity_form_refuses_a_huge_quantity(world, reconciles, quantity):
    before = state()
    member = Client()
    member.force_login(world.users["member_a"])
    response = member.post(reverse("pool-quantity", args=["alpha", "gpu"]), {"quantity": quantity})
    assert response.status_code == 400
    assert f"{BOUND}, not {quantity}" in response.content.decode()
    assert state() == before and reconciles == []


@pytest.mark.parametrize("quantity", HUGE)
def test_the_admin_refuses_a_huge_quantity(world, reconciles, quantity):
    before = state()
    admin = Client()
    admin.force_login(world.users["admin"])
    url = reverse("admin:pools_nodepool_change", args=[world.pool_a.pk])
    response = admin.post(url, {**form_data(admin.get(url)), "quantity": str(quantity)})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["quantity"] == [f"{BOUND}, not {quantity}"]
    assert state() == before and reconciles == []


def test_the_admin_refuses_warm_hosts_past_the_bound(world):
    node_type = NodeType.objects.get(name="gpu-server")
    admin = Client()
    admin.force_login(world.users["admin"])
    url = reverse("admin:pools_nodetype_change", args=[node_type.pk])
    response = admin.post(url, {**form_data(admin.get(url)), "warm_hosts": "20000"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["warm_hosts"] == [f"{BOUND}, not 20000"]
    assert NodeType.objects.get(pk=node_type.pk).warm_hosts == 1


# --- the reconciler's work per pass -------------------------------------------------------------------


def live(pool) -> int:
    return NodeClaim.objects.filter(pool=pool, phase__in=list(LIVE)).count()


def test_a_pool_asking_for_more_than_a_batch_gets_a_batch_a_pass_and_its_quantity_over_passes(
        world, settings, passes_asked):
    settings.RECONCILE_BATCH = 3
    pool = pool_create(tenant=world.bravo, actor="test", values={
        "name": "many", "provider": world.provider, "quantity": 8,
        "node_type_selector": [{"property": "vcluster.com/node-type", "value": "cpu-server"}]})
    made = []
    for _ in range(3):
        made.append(len(pools_reconcile(pool_ids=[pool.pk]).created))
    assert made == [3, 3, 2] and live(pool) == 8
    assert passes_asked == [[pool.pk], [pool.pk]]  # the last pass left nothing to do
    assert pools_reconcile(pool_ids=[pool.pk]).created == [] and live(pool) == 8
    NodePool.objects.filter(pk=pool.pk).update(quantity=1)
    released = [len(pools_reconcile(pool_ids=[pool.pk]).released) for _ in range(3)]
    assert released == [3, 3, 1] and live(pool) == 1


def test_a_pool_of_the_largest_quantity_gets_one_batch_per_pass(world, settings, passes_asked):
    pool = pool_create(tenant=world.bravo, actor="test", values={
        "name": "most", "provider": world.provider, "quantity": settings.POOL_MAX_NODES,
        "node_type_selector": [{"property": "vcluster.com/node-type", "value": "cpu-server"}]})
    result = pools_reconcile()
    assert len(result.created) == settings.RECONCILE_BATCH == live(pool)
    assert passes_asked == [[pool.pk]]


def test_a_pool_of_groups_gets_whole_groups_within_a_batch_a_pass(world, settings, passes_asked):
    settings.RECONCILE_BATCH = 5
    pool = pool_create(tenant=world.bravo, actor="test", values={
        "name": "gangs", "provider": world.provider, "quantity": 6, "group": {"size": 2},
        "node_type_selector": [{"property": "vcluster.com/node-type", "value": "cpu-server"}]})
    made = [len(pools_reconcile(pool_ids=[pool.pk]).created) for _ in range(2)]
    assert made == [4, 2] and live(pool) == 6
    assert all(c.group_id for c in NodeClaim.objects.filter(pool=pool))
    settings.RECONCILE_BATCH = 1  # a group bigger than the batch still comes whole
    NodePool.objects.filter(pk=pool.pk).update(quantity=8)
    assert len(pools_reconcile(pool_ids=[pool.pk]).created) == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_another_tenant_s_write_succeeds_while_a_big_pool_is_reconciled(world, api, settings, monkeypatch,
                                                                           passes_asked):
    """The full pass is held inside alpha's batch (holding alpha's pool): bravo's member changes bravo's pool
    meanwhile. Before, the pass locked every static pool at once and bravo's write waited for all of it."""
    assert is_postgres()
    monkeypatch.setattr("pools.services.pools_changed", lambda *, pool_ids: None)
    settings.RECONCILE_BATCH = 50
    NodePool.objects.filter(pk=world.pool_a.pk).update(quantity=settings.POOL_MAX_NODES)
    from claims import reconcile

    original, inside, go_on = reconcile._claims_create, threading.Event(), threading.Event()

    def held(growing, actor, **kwargs):
        if any(pool.pk == world.pool_a.pk for pool, _ in growing):
            inside.set()
            go_on.wait(30)
        return original(growing, actor, **kwargs)

    monkeypatch.setattr(reconcile, "_claims_create", held)
    passed, written = {}, {}

    def reconcile():
        try:
            passed["result"] = pools_reconcile()
        finally:
            from django.db import connection
            connection.close()

    def write():
        try:
            written["response"] = api("member_b", "patch", f"/api/v1/pools/{world.pool_b.pk}/", {"quantity": 2})
            written["while_held"] = not go_on.is_set()
        finally:
            from django.db import connection
            connection.close()

    reconciler = threading.Thread(target=reconcile)
    reconciler.start()
    try:
        assert inside.wait(30), "the reconcile reached alpha's pool"
        writer = threading.Thread(target=write)
        writer.start()
        writer.join(20)
        assert written.get("while_held"), "bravo's write finished while alpha's pass held alpha's pool"
    finally:
        go_on.set()
        reconciler.join(60)
    assert written["response"].status_code == 200, written["response"].content
    assert NodePool.objects.get(pk=world.pool_b.pk).quantity == 2
    assert live(world.pool_a) == 1 + 50  # its one claim and one batch; the rest on the passes asked for
    assert world.pool_a.pk in passes_asked[0]


@pytest.fixture
def small_batches(worker_settings):
    worker_settings["RECONCILE_BATCH"] = "5"


@pytest.mark.django_db(transaction=True)
def test_a_worker_reaches_a_big_quantity_over_passes_of_a_batch_each(world, api, small_batches,
                                                                     celery_worker_process):
    """The member's change asks for one reconcile; each pass makes 5 claims and asks for the next itself."""
    response = api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 23})
    assert response.status_code == 200
    wait_for(lambda: live(world.pool_a) == 23, timeout=60)

    def made() -> list[int]:
        return [int(n) for n in re.findall(r"'created': (\d+)", celery_worker_process.log.read_text())]

    # The last pass's result is logged after its claims were committed: wait for the log to say it too.
    wait_for(lambda: sum(made()) >= 22, timeout=30)
    assert max(made()) == 5 and sum(made()) == 22, made()  # 1 claim was there; never more than a batch in one pass
