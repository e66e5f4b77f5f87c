"""Tenant isolation through the REST API: every endpoint × every role × list, retrieve, create, update (PATCH
and PUT), delete and the endpoints' actions gets the expected status; lists hold exactly what the caller may
see; a refused write changes nothing and an accepted one is in the Event log with the caller as actor."""
pytest_plugins = ["tests.api_conftest"]

import pytest  # noqa: E402

from access.models import ApiToken  # noqa: E402
from claims.models import NodeClaim  # noqa: E402
from events.models import Event  # noqa: E402
from hosts.models import EraseCertificate, HealthCheckRun  # noqa: E402
from hosts.models import BareMetalHost  # noqa: E402
from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant  # noqa: E402
from tests.api_conftest import ALPHA_POOLS  # noqa: E402

pytestmark = pytest.mark.django_db

ROLES = ("admin", "operator", "auditor", "member_a", "viewer_a", "member_b", "anonymous")
# Expected statuses in ROLES order: platform admin, operator, auditor, tenant admin of alpha, tenant viewer of
# alpha, tenant admin of bravo, anonymous. The target of retrieve / update / delete belongs to tenant alpha (or
# is shared configuration). "update" is a PATCH, "replace" a PUT of the whole object as an admin reads it, with
# the same change.
READ_ALL = (200, 200, 200, 200, 200, 200, 401)
READ_ALPHA = (200, 200, 200, 200, 200, 404, 401)  # alpha's object: bravo's member does not see it
ADMIN_ONLY = {code: (code, 403, 403, 403, 403, 403, 401) for code in (200, 201, 202, 204, 409)}
SHARED_CONFIG = {
    "list": READ_ALL,
    "retrieve": READ_ALL,
    "create": ADMIN_ONLY[201],
    "update": ADMIN_ONLY[200],
    "replace": ADMIN_ONLY[200],
    "delete": ADMIN_ONLY[204],
}
NOT_ALLOWED = (405, 405, 405, 405, 405, 405, 401)
READ_ONLY = {"create": NOT_ALLOWED, "update": NOT_ALLOWED, "replace": NOT_ALLOWED, "delete": NOT_ALLOWED}
# The release gate's evidence: alpha's is the certificate (and health run) of an erase of alpha's data.
EVIDENCE = {
    "list": READ_ALL,
    "retrieve": READ_ALPHA,
    **READ_ONLY,
}

MATRIX = {
    "tenants": {
        "list": READ_ALL,
        "retrieve": READ_ALPHA,
        "create": ADMIN_ONLY[201],
        "update": ADMIN_ONLY[200],
        "replace": ADMIN_ONLY[200],
        "delete": ADMIN_ONLY[202],  # alpha holds a node: its claims release first, then it goes
    },
    "pools": {
        "list": READ_ALL,
        "retrieve": READ_ALPHA,
        "create": (201, 403, 403, 201, 403, 400, 401),  # bravo's admin: tenant alpha does not exist for them
        "update": (200, 403, 403, 200, 403, 404, 401),
        "replace": (200, 403, 403, 200, 403, 404, 401),
        "delete": (204, 403, 403, 204, 403, 404, 401),
    },
    "claims": {
        "list": READ_ALL,
        "retrieve": READ_ALPHA,
        **READ_ONLY,
        "release": (200, 403, 403, 200, 403, 404, 401),
        # The claim's host is provisioning: a flow drives its power (409) for those who may ask.
        "power": (409, 409, 403, 409, 403, 404, 401),
    },
    "hosts": {
        "list": READ_ALL,
        "retrieve": READ_ALPHA,
        "create": ADMIN_ONLY[201],
        "update": ADMIN_ONLY[200],
        "replace": ADMIN_ONLY[200],
        # The host is provisioning: neither in error nor one that may go into maintenance nor be deleted; the
        # service says why. Operators act on hosts (retry, maintenance); they neither change nor delete one.
        "delete": ADMIN_ONLY[409],
        "retry": (409, 409, 403, 403, 403, 403, 401),
        "maintenance": (409, 409, 403, 403, 403, 403, 401),
    },
    "erase-certificates": {**EVIDENCE, "signed": READ_ALPHA},  # the signed file
    "health-runs": EVIDENCE,
    "nodeproviders": SHARED_CONFIG,
    "nodetypes": SHARED_CONFIG,
    "nodeenvironments": SHARED_CONFIG,
    "osimages": SHARED_CONFIG,
    "events": {
        "list": READ_ALL,
        "retrieve": READ_ALPHA,
        **READ_ONLY,
    },
    # Everyone signed in makes their own token (auditors need one to read); admins list and revoke anyone's,
    # others only their own. The target is alpha's admin's token; a token is never shown again (no retrieve).
    "tokens": {
        "list": READ_ALL,
        "retrieve": NOT_ALLOWED,
        "create": (201, 201, 201, 201, 201, 201, 401),
        "update": NOT_ALLOWED,
        "replace": NOT_ALLOWED,
        "delete": (204, 404, 404, 204, 404, 404, 401),
    },
    # POST only: admins apply anything, a tenant admin only its own tenant's vcluster.yaml, the others nothing.
    "apply": {
        "list": NOT_ALLOWED,
        "create": (200, 403, 403, 200, 403, 403, 401),
        "update": NOT_ALLOWED,
        "replace": NOT_ALLOWED,
        "delete": NOT_ALLOWED,
    },
}

CREATE = {
    "tenants": {"name": "charlie", "quota_nodes": 4},
    "pools": {"tenant": "alpha", "name": "extra", "provider": "metal3", "quantity": 0,
              "node_type_selector": [{"property": "vcluster.com/node-type", "value": "gpu-server"}]},
    "claims": {"name": "forged"},
    "hosts": {"name": "gpu-09", "bmc_address": "redfish+http://127.0.0.1:8009/redfish/v1/Systems/gpu-09",
              "boot_mac": "52:54:00:00:09:09", "bmc_username": "bmcuser-new-host", "bmc_password": "bmcpass-new-7Qx",
              "labels": {"role": "gpu"}},
    "nodeproviders": {"name": "extra-provider", "display_name": "Extra"},
    "nodetypes": {"name": "extra-type", "provider": "metal3", "resources": {"cpu": "8"},
                  "host_selector": {"matchLabels": {"role": "extra"}}},
    "nodeenvironments": {"name": "extra-env", "namespace": "p-default"},
    "osimages": {"name": "extra-image", "url": "http://127.0.0.1/extra.raw", "checksum": "cd" * 32},
    "events": {"object_type": "host", "object_name": "forged", "actor": "user:nobody"},
    "erase-certificates": {"host_name": "forged", "disk": "nvme0n1", "result": "pass", "previous_tenant": "alpha"},
    "health-runs": {"host_name": "forged", "suite": "dcgmi", "verdict": "pass"},
    "tokens": {},
    # Alpha's pools as they are, and one more (empty): a change that needs no node.
    "apply": {"files": [{"name": "vcluster.yaml", "text": ALPHA_POOLS + """        - name: spare
          quantity: 0
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
"""}], "tenant": "alpha"},
}
UPDATE = {
    "tenants": {"display_name": "Alpha Corp"},
    "pools": {"quantity": 2},
    "claims": {"phase": "Available"},
    "hosts": {"labels": {"role": "gpu", "rack": "r9"}},
    "nodeproviders": {"display_name": "Spare parts"},
    "nodetypes": {"display_name": "Spare type"},
    "nodeenvironments": {"display_name": "Spare network"},
    "osimages": {"display_name": "Spare image"},
    "events": {"message": "rewritten history"},
    "erase-certificates": {"result": "pass", "previous_tenant": "bravo"},
    "health-runs": {"verdict": "pass"},
    "tokens": {"user": "ada-admin"},
    "apply": {"files": []},
}


def target_id(world, resource: str) -> int:
    return {
        "tenants": world.alpha.pk, "pools": world.pool_a.pk, "claims": world.claim_a.pk, "hosts": world.host_a.pk,
        "nodeproviders": world.spare_provider.pk, "nodetypes": world.spare_type.pk,
        "nodeenvironments": world.spare_env.pk, "osimages": world.spare_image.pk,
        "events": Event.objects.filter(tenant=world.alpha).order_by("pk").first().pk,
        "erase-certificates": world.cert_a.pk, "health-runs": world.run_a.pk, "tokens": world.tokens["member_a"][:8],
    }[resource]


def visible_ids(world, resource: str, role: str) -> set:
    """What each role may see, written out here rather than asked of the scoping module under test."""
    tenant = {"member_a": world.alpha, "viewer_a": world.alpha, "member_b": world.bravo}.get(role)
    if resource == "tokens":  # by prefix: the key itself is never shown again
        if role == "admin":
            return set(ApiToken.objects.values_list("prefix", flat=True))
        return {world.tokens[role][:8]}
    if resource in ("erase-certificates", "health-runs"):
        model, theirs = ((EraseCertificate, {"member_a": world.cert_a, "member_b": world.cert_b}) if
                         resource == "erase-certificates" else
                         (HealthCheckRun, {"member_a": world.run_a, "member_b": world.run_b}))
        return set(model.objects.values_list("pk", flat=True)) if tenant is None else {
            theirs["member_a" if tenant == world.alpha else "member_b"].pk}
    if resource == "tenants":
        return {t.pk for t in Tenant.objects.all() if tenant is None or t == tenant}
    if resource == "pools":
        return set((NodePool.objects.filter(tenant=tenant) if tenant else NodePool.objects).values_list("pk", flat=True))
    if resource == "claims":
        return set((NodeClaim.objects.filter(tenant=tenant) if tenant else NodeClaim.objects).values_list("pk", flat=True))
    if resource == "hosts":
        if tenant is None:
            return set(BareMetalHost.objects.values_list("pk", flat=True))
        return {world.host_a.pk} if tenant == world.alpha else {world.host_b.pk}
    if resource == "events":
        return set((Event.objects.filter(tenant=tenant) if tenant else Event.objects).values_list("pk", flat=True))
    if resource == "nodeenvironments":
        envs = NodeEnvironment.objects.all()
        if tenant is not None:
            envs = [e for e in envs if e.tenant_id in (None, tenant.pk)]
        return {e.pk for e in envs}
    model = {"nodeproviders": NodeProvider, "nodetypes": NodeType, "osimages": OSImage}[resource]
    return set(model.objects.values_list("pk", flat=True))


def request_for(world, resource: str, op: str):
    base = f"/api/v1/{resource}/"
    item = base if resource == "apply" else f"{base}{target_id(world, resource)}/"  # apply: one URL, POST only
    return {
        "list": ("get", base + "?page_size=500", None),
        "retrieve": ("get", item, None),
        "create": ("post", base, CREATE[resource]),
        "update": ("patch", item, UPDATE[resource]),
        "replace": ("put", item, whole(world, item, UPDATE[resource])),
        "delete": ("delete", item, None),
        "release": ("post", item + "release/", {}),
        "power": ("post", item + "power/", {"action": "power-cycle"}),
        "retry": ("post", item + "retry/", {}),
        "signed": ("get", item + "signed/", None),
        "maintenance": ("post", item + "maintenance/", {"on": True, "reason": "fan swap"}),
    }[op]


def whole(world, item: str, change: dict) -> dict:
    """A PUT body: the object as an admin reads it (read-only fields are ignored), with the change."""
    read = world.client("admin").get(item)
    return {**read.json(), **change} if read.status_code == 200 else change


@pytest.mark.parametrize("resource", sorted(MATRIX))
def test_every_role_gets_the_expected_answer_from_every_endpoint(world, evidence, api, rolled_back, resource):
    mismatches = []
    for op, expected_by_role in MATRIX[resource].items():
        for role, expected in zip(ROLES, expected_by_role):
            method, path, data = request_for(world, resource, op)
            with rolled_back():
                events_before = Event.objects.count()
                actor = world.actor(role) if role != "anonymous" else None
                mine_before = Event.objects.filter(actor=actor).count()
                response = api(role, method, path, data)
                if response.status_code != expected:
                    mismatches.append(f"{role:9} {op:8} {method.upper()} {path} → {response.status_code}, "
                                      f"expected {expected}: {response.content[:200]!r}")
                    continue
                if response.status_code >= 400:
                    assert Event.objects.count() == events_before, f"{role} {op} {resource}: refused, yet recorded"
                elif method != "get":
                    mine = Event.objects.filter(actor=actor).count()
                    assert mine > mine_before, f"{role} {op} {resource}: a write without an Event naming its actor"
                if op == "list" and response.status_code == 200:
                    body = response.json()
                    seen = {row["prefix" if resource == "tokens" else "id"] for row in body["results"]}
                    want = visible_ids(world, resource, role)
                    assert body["count"] == len(want)
                    if seen != want:
                        mismatches.append(f"{role:9} list {resource}: sees {sorted(seen)}, may see {sorted(want)}")
                if response.status_code == 401:
                    assert response["WWW-Authenticate"] == "Token"
    assert not mismatches, "\n" + "\n".join(mismatches)


def test_lists_of_members_hold_their_own_tenant_only(world, api):
    for role, tenant in (("member_a", "alpha"), ("member_b", "bravo")):
        assert {p["tenant"] for p in api(role, "get", "/api/v1/pools/").json()["results"]} == {tenant}
        assert {c["tenant"] for c in api(role, "get", "/api/v1/claims/").json()["results"]} == {tenant}
        assert {h["tenant"] for h in api(role, "get", "/api/v1/hosts/").json()["results"]} == {tenant}
        tenant_id = Tenant.objects.get(name=tenant).pk
        assert {e["tenant"] for e in api(role, "get", "/api/v1/events/?page_size=500").json()["results"]} == {tenant_id}


def test_a_filter_cannot_widen_what_a_member_sees(world, evidence, api):
    assert api("member_a", "get", "/api/v1/pools/?tenant=bravo").json()["count"] == 0
    assert api("member_a", "get", "/api/v1/claims/?tenant=bravo").json()["count"] == 0
    assert api("member_a", "get", "/api/v1/hosts/?tenant=bravo").json()["count"] == 0
    assert api("member_a", "get", f"/api/v1/events/?tenant={world.bravo.pk}").json()["count"] == 0
    assert api("member_a", "get", "/api/v1/nodeenvironments/?tenant=bravo").json()["count"] == 0
    for resource in ("erase-certificates", "health-runs"):
        assert api("member_a", "get", f"/api/v1/{resource}/?tenant=bravo").json()["count"] == 0
        # host_a serves alpha now, yet its evidence is of bravo's erase and of its registration: not alpha's.
        assert api("member_a", "get", f"/api/v1/{resource}/?host={world.host_a.pk}").json()["count"] == 0
        assert api("admin", "get", f"/api/v1/{resource}/?host={world.host_a.pk}").json()["count"] == 2


def test_members_see_their_hosts_without_any_bmc_detail(world, api):
    admin_view = api("admin", "get", f"/api/v1/hosts/{world.host_a.pk}/").json()
    member_view = api("member_a", "get", f"/api/v1/hosts/{world.host_a.pk}/").json()
    assert admin_view["bmc_address"] == world.host_a.bmc_address
    assert member_view["name"] == world.host_a.name and member_view["claim"] == world.claim_a.name
    assert not [k for k in member_view if k.startswith("bmc") or k in ("boot_mac", "error_message")]
    auditor_view = api("auditor", "get", f"/api/v1/hosts/{world.host_a.pk}/").json()
    assert auditor_view["bmc_address"] == world.host_a.bmc_address
    for view in (admin_view, member_view, auditor_view):
        assert "bmc_password" not in view and "bmc_username" not in view


def test_members_read_event_messages_with_bmc_addresses_masked(world, api):
    from events.services import event_record

    event_record(kind="step", object_type="host", object_name=world.host_a.name, host=world.host_a,
                 tenant=world.alpha, actor="system:flow", message=f"BMC {world.host_a.bmc_address} did not answer")
    rows = api("member_a", "get", f"/api/v1/events/?host={world.host_a.pk}").json()["results"]
    message = next(r["message"] for r in rows if r["message"].startswith("BMC"))
    assert message == "BMC (BMC) did not answer" and "data" not in rows[0]
    rows = api("auditor", "get", f"/api/v1/events/?host={world.host_a.pk}").json()["results"]
    assert any(world.host_a.bmc_address in r["message"] for r in rows)


def test_an_inactive_user_s_token_no_longer_works(world, api):
    world.users["member_a"].is_active = False
    world.users["member_a"].save()
    assert api("member_a", "get", "/api/v1/pools/").status_code == 401


def test_a_user_in_no_tenant_and_no_role_sees_nothing(world):
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    from tests.api_conftest import issue_token

    stranger = User.objects.create_user("stranger")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(stranger)}")
    for resource in ("tenants", "pools", "claims", "hosts", "events"):
        assert client.get(f"/api/v1/{resource}/").json()["count"] == 0, resource
    refused = client.post("/api/v1/pools/", CREATE["pools"], format="json")
    assert refused.status_code == 403 and "you administer no tenant" in refused.json()["detail"]
    assert not NodePool.objects.filter(name=CREATE["pools"]["name"]).exists()


def test_an_operator_puts_a_host_in_maintenance_but_changes_no_pool_or_catalogue(world, api):
    from hosts.choices import HostState

    spare = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    answer = api("operator", "post", f"/api/v1/hosts/{spare.pk}/maintenance/", {"on": True, "reason": "fan swap"})
    assert answer.status_code == 200, answer.content
    spare.refresh_from_db()
    assert spare.state == HostState.MAINTENANCE
    assert Event.objects.filter(host=spare, actor=world.actor("operator")).exists()
    refused = api("operator", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 3})
    assert refused.status_code == 403 and "operators act on hosts" in refused.json()["detail"]
    world.pool_a.refresh_from_db()
    assert world.pool_a.quantity != 3


def test_a_tenant_viewer_reads_its_tenant_and_is_told_why_a_write_is_refused(world, api):
    assert api("viewer_a", "get", f"/api/v1/pools/{world.pool_a.pk}/").status_code == 200
    assert api("viewer_a", "get", f"/api/v1/pools/{world.pool_b.pk}/").status_code == 404
    refused = api("viewer_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 3})
    assert refused.status_code == 403 and refused.json()["detail"].startswith("tenant viewers read only")
    world.pool_a.refresh_from_db()
    assert world.pool_a.quantity != 3


def test_a_tenant_admin_power_cycles_its_claim_s_node_and_a_viewer_or_another_tenant_may_not(world, api):
    from hosts.choices import HostState

    BareMetalHost.objects.filter(pk=world.host_a.pk).update(state=HostState.PROVISIONED)
    path = f"/api/v1/claims/{world.claim_a.pk}/power/"
    assert api("viewer_a", "post", path, {"action": "power-off"}).status_code == 403
    assert api("member_b", "post", path, {"action": "power-off"}).status_code == 404
    assert api("member_a", "post", path, {"action": "power-sideways"}).status_code == 400
    assert not Event.objects.filter(host_id=world.host_a.pk, step="power_off").exists()
    answer = api("member_a", "post", path, {"action": "power-cycle", "reason": "hung kernel"})
    assert answer.status_code == 200, answer.content
    assert Event.objects.filter(host_id=world.host_a.pk, step="power_cycle", actor=world.actor("member_a"),
                                message__contains="hung kernel").exists()
