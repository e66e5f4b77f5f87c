"""All-or-nothing groups over the API (issue 14, point 5): GET /api/v1/claim-groups/ lists groups with their state,
where they sit (or why they wait) and their members, tenant-scoped (a member sees their tenants' groups; another
tenant's is 404); each claim in /api/v1/claims/ names its group. Responses are checked for secrets."""
pytest_plugins = ["tests.api_conftest"]

import pytest  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from claims.models import ClaimGroup, NodeClaim  # noqa: E402

pytestmark = pytest.mark.django_db


@pytest.fixture
def groups(world):
    """Alpha's claim is a placed group's member (rail r1); bravo has a group waiting to be placed, with a reason."""
    placed = ClaimGroup.objects.create(name="alpha-gplace", tenant=world.alpha, pool=world.pool_a,
                                       pool_name=world.pool_a.name, size=1, shares=["rail_group"],
                                       on_member_failure="Replace", rail_group="r1", placed_at=timezone.now(),
                                       placements=1, reason="Placed", message="1 hosts on rail r1")
    NodeClaim.objects.filter(pk=world.claim_a.pk).update(group=placed)
    waiting = ClaimGroup.objects.create(name="bravo-gwait", tenant=world.bravo, pool=world.pool_b,
                                        pool_name=world.pool_b.name, size=4, shares=["rail_group"],
                                        on_member_failure="ReleaseGroup", reason="NoGroupPlacement",
                                        message="needs 4 on one rail group; largest free group has 3 (rail r2)")
    NodeClaim.objects.create(name="bravo-w1", tenant=world.bravo, pool=world.pool_b, pool_name=world.pool_b.name,
                             provider=world.provider, group=waiting, reason="NoGroupPlacement",
                             message=waiting.message)
    return placed, waiting


def test_a_member_lists_only_their_tenants_groups_with_state_place_and_members(world, api, groups):
    body = api("member_a", "get", "/api/v1/claim-groups/").json()
    assert [g["name"] for g in body["results"]] == ["alpha-gplace"]
    [row] = body["results"]
    assert (row["tenant"], row["pool"], row["size"], row["state"], row["rail_group"]) == (
        "alpha", world.pool_a.name, 1, "Provisioning", "r1")
    assert (row["on_member_failure"], row["reason"], row["placements"]) == ("Replace", "Placed", 1)
    assert [(m["name"], m["phase"], m["host"]) for m in row["members"]] == [
        (world.claim_a.name, world.claim_a.phase, world.claim_a.host_name)]


def test_admins_see_every_group_and_a_waiting_group_says_why(world, api, groups):
    body = api("admin", "get", "/api/v1/claim-groups/", {"placed": "false"}).json()
    [row] = body["results"]
    assert (row["name"], row["state"], row["reason"]) == ("bravo-gwait", "Waiting", "NoGroupPlacement")
    assert row["message"] == "needs 4 on one rail group; largest free group has 3 (rail r2)"
    names = {g["name"] for g in api("auditor", "get", "/api/v1/claim-groups/").json()["results"]}
    assert names == {"alpha-gplace", "bravo-gwait"}
    assert [g["name"] for g in api("admin", "get", "/api/v1/claim-groups/", {"tenant": "alpha"}).json()["results"]] \
        == ["alpha-gplace"]


def test_another_tenants_group_is_404_to_a_member_and_nothing_is_shown_to_anonymous_callers(world, api, groups):
    placed, waiting = groups
    assert api("member_a", "get", f"/api/v1/claim-groups/{waiting.pk}/").status_code == 404
    assert api("member_b", "get", f"/api/v1/claim-groups/{placed.pk}/").status_code == 404
    assert api("member_b", "get", f"/api/v1/claim-groups/{waiting.pk}/").json()["name"] == "bravo-gwait"
    assert api("anonymous", "get", "/api/v1/claim-groups/").status_code == 401
    assert api("anonymous", "get", f"/api/v1/claim-groups/{placed.pk}/").status_code == 401
    # Read only: no one writes a group through the API (its pool or a decision makes it).
    assert api("admin", "delete", f"/api/v1/claim-groups/{placed.pk}/").status_code == 405
    assert api("member_a", "post", "/api/v1/claim-groups/", {"name": "x"}).status_code == 405
    assert ClaimGroup.objects.count() == 2


def test_each_claim_names_its_group_and_claims_of_no_group_say_null(world, api, groups):
    claims = {c["name"]: c for c in api("admin", "get", "/api/v1/claims/").json()["results"]}
    assert claims[world.claim_a.name]["group"] == {
        "name": "alpha-gplace", "size": 1, "state": "Provisioning", "rack": "", "rail_group": "r1",
        "reason": "Placed", "message": "1 hosts on rail r1"}
    assert claims["bravo-w1"]["group"]["state"] == "Waiting"
    assert claims["bravo-w1"]["group"]["message"].startswith("needs 4 on one rail group")
    one = api("member_b", "get", f"/api/v1/claims/{world.claim_b.pk}/").json()
    assert one["group"] is None
    waiting = NodeClaim.objects.get(name="bravo-w1")
    assert api("member_b", "get", f"/api/v1/claims/{waiting.pk}/").json()["group"]["name"] == "bravo-gwait"


def test_the_groups_of_a_page_of_claims_are_read_in_a_fixed_number_of_queries(world, api, groups):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert api("admin", "get", "/api/v1/claims/").status_code == 200
        return len(queries)

    count()  # the token's first use of the minute records it (access.authentication): not the list's reads
    before = count()
    _, waiting = groups
    for i in range(5):
        NodeClaim.objects.create(name=f"bravo-w{i + 2}", tenant=world.bravo, pool=world.pool_b,
                                 pool_name=world.pool_b.name, provider=world.provider, group=waiting)
    assert count() == before


def test_the_schema_describes_the_groups_endpoint(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert "/api/v1/claim-groups/" in schema["paths"] and "/api/v1/claim-groups/{id}/" in schema["paths"]
    claim = schema["components"]["schemas"]["NodeClaim"]["properties"]["group"]
    assert "GroupSummary" in str(claim)
