"""Auto Nodes over the API (issue 12, point 5): GET /api/v1/pools/<id>/status/ and GET /api/v1/decisions/, read
only and tenant-scoped: members see their tenants' pools and decisions, others get 404 (or an empty list), and
no secret (a tenant's kubeconfig) ever appears."""
import pytest
from django.test import Client

from autonodes.choices import DecisionReason
from pools.models import NodePool, Tenant

pytest.register_assert_rewrite("tests.autonodes_conftest")
from .autonodes_conftest import backing_off, decision, tenant_decision

pytest_plugins = ["tests.console_conftest", "tests.autonodes_conftest"]
pytestmark = pytest.mark.django_db


def api(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def get(client: Client, url: str, status: int = 200, **params):
    response = client.get(url, params)
    assert response.status_code == status, (url, response.status_code, response.content[:300])
    return response.json() if status == 200 else response


def test_the_pool_status_has_the_watcher_demand_nodes_limits_budgets_and_decisions(auto_rows):
    train = auto_rows["train"]
    body = get(api(auto_rows["users"]["bob"]), f"/api/v1/pools/{train.pk}/status/")
    assert (body["id"], body["name"], body["tenant"], body["kind"]) == (train.pk, "train", "two", "dynamic")
    assert body["watch"]["state"] == "watching"
    states = {p["pod"]: (p["state"], p["status"], p["claim"]) for p in body["demand"]}
    assert states == {"ml/train-7-0": ("provisioning", "launched", "two-inst1"),
                      "ml/train-7-1": ("ready", "launched", "two-empty1"),
                      "ml/train-7-2": ("waiting", "waiting", None), "ml/huge-0": ("unservable", "unservable", None)}
    waiting = next(p for p in body["demand"] if p["pod"] == "ml/train-7-2")
    assert waiting["reason"] == "not added: limit nvidia.com/gpu 32 reached"
    assert waiting["requests"]["nvidia.com/gpu"] == "8" and waiting["state_display"] == "waiting for capacity"
    provisioning = next(p for p in body["demand"] if p["pod"] == "ml/train-7-0")
    assert "write_image on gpu-03" in provisioning["reason"]
    nodes = {n["claim"]: n for n in body["nodes"]}
    assert set(nodes) == {"two-busy1", "two-empty1", "two-inst1"}
    empty = nodes["two-empty1"]
    assert empty["pods"] == 0 and empty["empty_since"] and empty["next_action_at"]
    assert empty["next_action"] == "empty since 12:03, released at 12:13 unless a pod arrives"
    assert empty["node_type"] == "gpu-server" and empty["age_s"] >= 29 * 60
    assert nodes["two-inst1"]["step"] == "write_image" and nodes["two-inst1"]["pods"] is None
    assert {(lim["resource"], lim["used"], lim["limit"]) for lim in body["limits"]} == {
        ("nodes", 3.0, 4.0), ("nvidia.com/gpu", 24.0, 32.0)}
    assert [(b["nodes"], b["schedule"], b["in_force"], b["blocks"]) for b in body["budgets"]] == [
        ("0", "0 * * * *", True, True), ("1", "", True, False), ("5", "0 0 1 1 *", False, False)]
    assert body["budgets"][0]["until"] and body["budgets"][1]["until"] is None
    assert body["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert [d["id"] for d in body["decisions"]] == sorted((e.pk for e in auto_rows["decisions"]), reverse=True)


def test_a_static_pools_status_has_its_claims_and_no_demand(auto_site):
    from django.core.management import call_command

    call_command("reconcile")
    cpu = NodePool.objects.get(tenant__name="two", name="cpu")
    body = get(api(auto_site["users"]["bob"]), f"/api/v1/pools/{cpu.pk}/status/")
    assert body["kind"] == "static" and body["quantity"] == 1 and len(body["nodes"]) == 1
    assert body["demand"] == [] and body["watch"] is None and body["decisions"] == []


def test_the_watchers_trouble_is_in_the_status(auto_rows):
    backing_off(auto_rows["two"])
    body = get(api(auto_rows["users"]["admin"]), f"/api/v1/pools/{auto_rows['train'].pk}/status/")
    assert body["watch"]["state"] == "backing-off" and "connection refused" in body["watch"]["error"]
    assert body["watch"]["failures"] == 3 and body["watch"]["retry_at"]


def test_outsiders_get_404_for_a_pools_status_and_anonymous_callers_401(auto_rows):
    users, train = auto_rows["users"], auto_rows["train"]
    url = f"/api/v1/pools/{train.pk}/status/"
    for who in ("admin", "auditor", "bob"):
        get(api(users[who]), url)
    response = get(api(users["alice"]), url, status=404)
    assert b"train-7" not in response.content
    assert api(None).get(url).status_code in (401, 403)
    get(api(users["admin"]), "/api/v1/pools/999999999/status/", status=404)
    get(api(users["admin"]), "/api/v1/pools/99999999999999999999999/status/", status=404)
    for method in ("post", "put", "patch", "delete"):
        assert getattr(api(users["admin"]), method)(url).status_code == 405


def test_decisions_are_paginated_newest_first_with_reason_pods_and_claims(auto_rows):
    train = auto_rows["train"]
    for i in range(55):
        decision(train, f"decision {i}", pods=[f"ml/p-{i}"], claims=[f"two-c{i}"])
    client = api(auto_rows["users"]["bob"])
    first = get(client, "/api/v1/decisions/", tenant=auto_rows["two"].pk, pool=train.pk)
    assert first["count"] == 58 and len(first["results"]) == 50 and first["next"]
    ids = [d["id"] for d in first["results"]]
    assert ids == sorted(ids, reverse=True)
    newest = first["results"][0]
    assert newest["message"] == "decision 54" and newest["pods"] == ["ml/p-54"] and newest["claims"] == ["two-c54"]
    assert newest["reason"] == "Launched" and newest["reason_display"] == "Nodes added"
    assert newest["pool"] == "train" and newest["tenant"] == auto_rows["two"].pk
    assert newest["node_type"] == "gpu-server"
    second = get(client, "/api/v1/decisions/", pool=train.pk, page=2)
    assert [d["message"] for d in second["results"]][-3:] == [e.message for e in reversed(auto_rows["decisions"])]
    limited = get(client, "/api/v1/decisions/", reason=DecisionReason.LIMIT)
    assert [d["message"] for d in limited["results"]] == ["not added: limit nvidia.com/gpu 32 reached"]
    assert get(client, "/api/v1/decisions/", pool_name="train")["count"] == 58
    assert get(client, "/api/v1/decisions/", pool=999999)["count"] == 0
    get(client, "/api/v1/decisions/", status=400, reason="NotAReason")
    get(client, "/api/v1/decisions/", status=400, pool="x")
    about_tenant = tenant_decision(auto_rows["two"], "no pool matches pod ml/odd-0", pods=["ml/odd-0"])
    everything = get(client, "/api/v1/decisions/")
    assert everything["count"] == 59 and everything["results"][0]["id"] == about_tenant.pk
    assert everything["results"][0]["pool"] is None and everything["results"][0]["reason"] == "NoPool"
    assert get(client, "/api/v1/decisions/", pool=train.pk)["count"] == 58  # a pool's own decisions only
    assert get(client, "/api/v1/decisions/", pool_name="two")["count"] == 0  # the tenant's name is no pool's
    single = get(client, f"/api/v1/decisions/{auto_rows['decisions'][1].pk}/")
    assert single["reason"] == "LimitReached" and single["pods"] == ["ml/train-7-2"]


def test_members_see_only_their_tenants_decisions(auto_rows):
    one = Tenant.objects.get(name="one")
    theirs = decision(one.pools.get(name="gpu"), "tenant one's decision", pods=["ml/a-0"])
    users = auto_rows["users"]
    seen = {who: {d["message"] for d in get(api(users[who]), "/api/v1/decisions/")["results"]}
            for who in ("admin", "auditor", "alice", "bob")}
    assert seen["alice"] == {"tenant one's decision"}
    assert "tenant one's decision" not in seen["bob"] and len(seen["bob"]) == 3
    assert seen["admin"] == seen["auditor"] == seen["bob"] | seen["alice"]
    get(api(users["bob"]), f"/api/v1/decisions/{theirs.pk}/", status=404)
    assert get(api(users["bob"]), "/api/v1/decisions/", tenant=one.pk)["count"] == 0
    assert get(api(users["bob"]), "/api/v1/decisions/", pool=one.pools.get(name="gpu").pk)["count"] == 0
    assert api(None).get("/api/v1/decisions/").status_code in (401, 403)
    assert api(users["admin"]).post("/api/v1/decisions/", {}).status_code == 405


def test_no_secret_appears_in_the_status_or_the_decisions(auto_rows):
    two = auto_rows["two"]
    Tenant.objects.filter(pk=two.pk).update(kubeconfig="apiVersion: v1\nusers:\n- user: {token: kubeconfig-secret-7731}")
    client = api(auto_rows["users"]["bob"])
    for url in (f"/api/v1/pools/{auto_rows['train'].pk}/status/", "/api/v1/decisions/"):
        body = client.get(url).content.decode()
        assert "kubeconfig" not in body and "kubeconfig-secret-7731" not in body and "bmc" not in body.lower()


def test_the_openapi_schema_describes_the_status_and_the_decisions(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert "/api/v1/pools/{id}/status/" in schema["paths"] and "/api/v1/decisions/" in schema["paths"]
    status = schema["components"]["schemas"]["PoolStatus"]["properties"]
    assert {"watch", "demand", "nodes", "limits", "budgets", "decisions"} <= set(status)
    parameters = {p["name"] for p in schema["paths"]["/api/v1/decisions/"]["get"]["parameters"]}
    assert {"tenant", "pool", "reason", "page"} <= parameters
