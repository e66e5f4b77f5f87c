"""The REST API used as automation uses it: tokens, schema and docs, pagination and filters, pools with
optimistic concurrency and quotas, host registration and actions, claim release, apply, and bad input that
gets 400 with field errors and changes nothing. Every response is checked for secrets (tests/api_conftest.py)."""
pytest_plugins = ["tests.api_conftest"]

import io  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

import jsonschema  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402
from django.core.management import CommandError, call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.urls import resolve, reverse  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from access.models import ApiToken  # noqa: E402
from claims.models import NodeClaim  # noqa: E402
from claims.phases import claims_transition  # noqa: E402
from events.models import Event  # noqa: E402
from hosts.choices import HostState  # noqa: E402
from hosts.models import BareMetalHost  # noqa: E402
from hosts.services import host_transition  # noqa: E402
from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant  # noqa: E402
from tests.api_conftest import ISSUED_KEYS  # noqa: E402

pytestmark = pytest.mark.django_db

ROLES = ("admin", "member_a", "member_b", "auditor", "anonymous")


def snapshot():
    """Everything a write could touch, to show that a refused one touched nothing."""
    rows = []
    for model in (Tenant, NodePool, NodeClaim, BareMetalHost, NodeProvider, NodeType, NodeEnvironment, OSImage):
        rows.append(sorted((o.pk, o.updated_at if hasattr(o, "updated_at") else None,
                            getattr(o, "version", None), getattr(o, "state", None), getattr(o, "phase", None))
                           for o in model.objects.all()))
    return rows, Event.objects.count()


# --- schema, docs, the browsable API --------------------------------------------------------------

def test_the_openapi_schema_describes_every_endpoint(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in ("/api/v1/tenants/", "/api/v1/pools/{id}/", "/api/v1/claims/{id}/release/", "/api/v1/hosts/",
                 "/api/v1/hosts/{id}/maintenance/", "/api/v1/hosts/{id}/retry/", "/api/v1/nodeproviders/",
                 "/api/v1/nodetypes/", "/api/v1/nodeenvironments/", "/api/v1/osimages/", "/api/v1/events/",
                 "/api/v1/apply/", "/api/v1/tokens/", "/api/v1/erase-certificates/",
                 "/api/v1/erase-certificates/{id}/", "/api/v1/health-runs/", "/api/v1/health-runs/{id}/"):
        assert path in schema["paths"], path
    host = schema["components"]["schemas"]["Host"]["properties"]
    assert "bmc_password" not in host and "bmc_username" not in host  # write-only: request bodies only
    assert "bmc_password" in schema["components"]["schemas"]["HostRequest"]["properties"]
    assert set(schema["components"]["securitySchemes"]) == {"tokenAuth", "cookieAuth"}
    # The claims page's "not released" is a filter of the API too, documented with the others.
    phase = next(p for p in schema["paths"]["/api/v1/claims/"]["get"]["parameters"] if p["name"] == "phase")
    assert "live" in phase["schema"]["items"]["enum"] and "Released" in phase["schema"]["items"]["enum"]
    filters = {p["name"] for p in schema["paths"]["/api/v1/erase-certificates/"]["get"]["parameters"]}
    assert {"host", "result", "tenant", "page", "page_size"} <= filters
    filters = {p["name"] for p in schema["paths"]["/api/v1/health-runs/"]["get"]["parameters"]}
    assert {"host", "verdict", "tenant", "page", "page_size"} <= filters
    assert "signature" in schema["components"]["schemas"]["EraseCertificate"]["properties"]


def test_the_docs_pages_load_without_the_internet(client):
    for path in ("/api/docs/", "/api/redoc/"):
        page = client.get(path)
        assert page.status_code == 200
        assert b"cdn." not in page.content and b"/static/drf_spectacular_sidecar/" in page.content


def test_the_browsable_api_works_for_a_signed_in_admin(world):
    client = APIClient()
    client.force_login(world.users["admin"])
    page = client.get("/api/v1/hosts/", HTTP_ACCEPT="text/html")
    assert page.status_code == 200 and b"gpu-01" in page.content
    # The API reads JSON only: each page's form is the JSON one, filled with what a GET returns, so without the
    # write-only fields (the fixture fails the test on any secret).
    for path, name in [(f"/api/v1/tenants/{world.alpha.pk}/", "alpha"),
                       (f"/api/v1/hosts/{world.host_a.pk}/", "gpu-01")]:
        page = client.get(path, HTTP_ACCEPT="text/html").content.decode()
        assert f'<form action="{path}" data-method="PUT"' in page and f"&quot;name&quot;: &quot;{name}&quot;" in page
        assert '<option value="application/json" selected>' in page and 'name="_content"' in page
        assert '<option value="multipart/form-data"' not in page and '<option value="application/x-www' not in page
        assert "&quot;kubeconfig&quot;" not in page and "bmc_password" not in page
    page = client.get("/api/v1/tokens/", HTTP_ACCEPT="text/html").content.decode()  # the README's button
    assert '<form action="/api/v1/tokens/" method="POST"' in page and 'value="application/json" selected' in page
    made = client.post("/api/v1/tokens/", "{}", content_type="application/json")  # what its script sends
    assert made.status_code == 201 and len(made.json()["token"]) == 64


def test_session_writes_need_the_csrf_token(world):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(world.users["member_a"])
    refused = client.patch(f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2}, format="json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert NodePool.objects.get(pk=world.pool_a.pk).quantity == 1
    client.get("/api/v1/pools/", HTTP_ACCEPT="text/html")  # a page sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    accepted = client.patch(f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2}, format="json",
                            HTTP_X_CSRFTOKEN=token)
    assert accepted.status_code == 200


# --- tokens ---------------------------------------------------------------------------------------

def test_a_token_is_shown_once_listed_by_prefix_and_revocable_and_leaves_the_earlier_one_working(world):
    client = APIClient()
    client.force_login(world.users["member_a"])
    old_key = world.tokens["member_a"]
    made = client.post("/api/v1/tokens/")
    assert made.status_code == 201
    key = made.json()["token"]
    assert len(key) == 64 and made.json()["prefix"] == key[:8] and made.json()["user"] == "alice-alpha"
    old = APIClient()
    old.credentials(HTTP_AUTHORIZATION=f"Token {old_key}")
    assert old.get("/api/v1/pools/").status_code == 200  # several per user: making one revokes none

    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [(t["prefix"], t["name"], t["scope"], t["expired"]) for t in listed] == [
        (old_key[:8], "token", "read-write", False), (key[:8], "token-2", "read-write", False)]

    by_token = APIClient()
    by_token.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert by_token.get("/api/v1/pools/").status_code == 200
    assert client.delete(f"/api/v1/tokens/{key[:8]}/").status_code == 204
    assert by_token.get("/api/v1/pools/").status_code == 401
    actions = list(Event.objects.filter(object_type="token", actor="user:alice-alpha").values_list("message", flat=True))
    assert [a.split(" (")[0] for a in actions] == [f"API token {key[:8]}… revoked", f"API token {key[:8]}… made"]
    assert actions[1].startswith(f"API token {key[:8]}… made (token-2, read-write, expires ")


def test_the_key_is_in_no_column_of_its_token_row(world):
    key = world.tokens["member_a"]
    row = ApiToken.objects.filter(user=world.users["member_a"]).values().get()
    assert row["prefix"] == key[:8]
    assert not [name for name, value in row.items() if key in str(value)]
    with connection.cursor() as cursor:  # nor in the table's raw text, whatever its columns are
        cursor.execute(f"SELECT * FROM {ApiToken._meta.db_table}")
        assert not [value for row in cursor.fetchall() for value in row if key in str(value)]


def test_a_wrong_key_with_a_valid_prefix_gets_401(world):
    key = world.tokens["member_a"]
    forged = APIClient()
    forged.credentials(HTTP_AUTHORIZATION=f"Token {key[:-1]}{'1' if key[-1] == '0' else '0'}")  # one character off
    response = forged.get("/api/v1/pools/")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Token"


def test_manage_py_token_create_prints_a_working_key_once_and_revoke_ends_it(world):
    out = io.StringIO()
    call_command("token", "create", "bob-bravo", stdout=out)
    key = out.getvalue().strip()
    ISSUED_KEYS.add(key)  # the leak check knows it from here on
    assert len(key) == 64 and key != world.tokens["member_b"]
    by_token = APIClient()
    by_token.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    pools = by_token.get("/api/v1/pools/")
    assert pools.status_code == 200 and {p["tenant"] for p in pools.json()["results"]} == {"bravo"}
    listed = by_token.get("/api/v1/tokens/").json()["results"]
    assert [t["prefix"] for t in listed] == [world.tokens["member_b"][:8], key[:8]] and "token" not in listed[1]

    out = io.StringIO()
    call_command("token", "revoke", key[:8], stdout=out)
    assert out.getvalue().strip() == f"revoked {key[:8]}… (bob-bravo)"
    assert by_token.get("/api/v1/pools/").status_code == 401
    events = Event.objects.filter(object_type="token", object_name="bob-bravo", actor__startswith="cli:")
    assert [m.split(" (")[0] for m in events.values_list("message", flat=True)] == [
        f"API token {key[:8]}… revoked", f"API token {key[:8]}… made"]
    with pytest.raises(CommandError, match="no token"):
        call_command("token", "revoke", key[:8])
    with pytest.raises(CommandError, match="no user"):
        call_command("token", "create", "nobody-here")


def test_only_admins_see_and_revoke_other_people_s_tokens(world, api):
    alice_prefix = world.tokens["member_a"][:8]
    assert api("member_b", "delete", f"/api/v1/tokens/{alice_prefix}/").status_code == 404
    assert len(api("admin", "get", "/api/v1/tokens/").json()["results"]) == len(world.users)  # one each
    assert api("admin", "delete", f"/api/v1/tokens/{alice_prefix}/").status_code == 204
    assert api("member_a", "get", "/api/v1/pools/").status_code == 401
    assert api("auditor", "post", "/api/v1/tokens/").status_code == 201  # auditors need one to read
    assert api("anonymous", "post", "/api/v1/tokens/").status_code == 401


def test_the_django_admin_lists_tokens_by_prefix_and_deleting_one_revokes_it_on_the_record(world, admin_client):
    page = admin_client.get("/admin/vmetal_api/apitoken/")
    assert page.status_code == 200 and world.tokens["member_a"][:8].encode() in page.content
    token = ApiToken.objects.get(user=world.users["member_a"])
    assert b"read_only" in page.content or b"Read only" in page.content
    assert admin_client.get(f"/admin/vmetal_api/apitoken/{token.pk}/change/").status_code == 200
    assert admin_client.post(f"/admin/vmetal_api/apitoken/{token.pk}/delete/", {"post": "yes"}).status_code == 302
    assert world.client("member_a").get("/api/v1/pools/").status_code == 401
    event = Event.objects.filter(object_type="token", object_name="alice-alpha").first()
    assert event.message == f"API token {token.prefix}… revoked" and event.actor == "user:admin"


# --- pagination and filters -----------------------------------------------------------------------

def test_lists_are_paginated_fifty_by_default_and_at_most_five_hundred(world, api):
    NodeProvider.objects.bulk_create([NodeProvider(name=f"p-{i:03}") for i in range(520)])
    page = api("member_a", "get", "/api/v1/nodeproviders/").json()
    assert page["count"] == 522 and len(page["results"]) == 50 and "page=2" in page["next"]
    assert len(api("member_a", "get", "/api/v1/nodeproviders/?page_size=1000").json()["results"]) == 500
    assert api("member_a", "get", "/api/v1/nodeproviders/?page=99").status_code == 404
    assert api("member_a", "get", "/api/v1/nodeproviders/", {"page": "9" * 40}).status_code == 404


@pytest.mark.parametrize("page", ["", "0", "last", "1.5", "-1", " 2", "٢"])
def test_a_page_that_is_not_a_whole_number_is_a_400_naming_it(world, api, page):
    """The schema says `page` is an integer of 1 or more; DRF would read an empty one as the first page."""
    refused = api("member_a", "get", "/api/v1/nodeproviders/", {"page": page})
    assert refused.status_code == 400 and refused.json() == {"page": ["a whole number, 1 or more"]}


def test_filters_are_the_html_lists_filtersets(world, api):
    from claims.filtersets import NodeClaimFilterSet
    from claims.api.views import NodeClaimViewSet
    from hosts.api.views import HostViewSet
    from hosts.filtersets import HostFilterSet

    assert HostViewSet.filterset_class is HostFilterSet and NodeClaimViewSet.filterset_class is NodeClaimFilterSet
    hosts = api("admin", "get", "/api/v1/hosts/?state=available&label=role=gpu").json()["results"]
    assert {h["name"] for h in hosts} == {"gpu-02", "gpu-03", "gpu-04"}
    assert {h["name"] for h in api("admin", "get", "/api/v1/hosts/?node_type=cpu-server&tenant=bravo")
            .json()["results"]} == {world.host_b.name}
    claims = api("admin", "get", "/api/v1/claims/?phase=Provisioning&tenant=alpha").json()["results"]
    assert [c["name"] for c in claims] == [world.claim_a.name]
    assert api("admin", "get", "/api/v1/pools/?tenant=bravo").json()["results"][0]["name"] == "cpu"
    events = api("admin", "get", f"/api/v1/events/?object_type=claim&tenant={world.alpha.pk}").json()["results"]
    assert events and {e["object_name"] for e in events} == {world.claim_a.name}
    bad = api("admin", "get", "/api/v1/hosts/?state=flying")
    assert bad.status_code == 400 and "state" in bad.json()


# (role, console page, the page's rows, API endpoint, query, whether it narrows the list or empties it): the page
# and its endpoint filter through one FilterSet, so they list the same objects. {host_a}, {alpha}: the world's ids.
HOST_ROW, CLAIM_ROW, EVENT_ROW, ROW = r'id="host-(\d+)"', r'id="claim-(\d+)"', r'data-event="(\d+)"', r'data-id="(\d+)"'
LISTS = [
    ("admin", "fleet", HOST_ROW, "/api/v1/hosts/", {"state": "available", "label": "role=gpu"}, "narrows"),
    ("admin", "claims", CLAIM_ROW, "/api/v1/claims/", {"tenant": "alpha"}, "narrows"),
    ("admin", "claims", CLAIM_ROW, "/api/v1/claims/", {"phase": "live"}, "narrows"),  # the page's, now the API's
    ("admin", "claims", CLAIM_ROW, "/api/v1/claims/", {"phase": "Released", "q": "", "tenant": ""}, "narrows"),
    ("admin", "claims", CLAIM_ROW, "/api/v1/claims/", {"pool": "gpu"}, "narrows"),  # the API's, now the page's
    ("member_a", "claims", CLAIM_ROW, "/api/v1/claims/", {"tenant": "bravo"}, "empties"),
    ("admin", "events", EVENT_ROW, "/api/v1/events/", {"kind": "transition", "host": "{host_a}"}, "narrows"),
    ("admin", "events", EVENT_ROW, "/api/v1/events/", {"object_type": "claim", "tenant": "{alpha}"}, "narrows"),
    ("member_b", "events", EVENT_ROW, "/api/v1/events/", {"actor": "tes", "object_type": "claim"}, "narrows"),
    ("admin", "providers", ROW, "/api/v1/nodeproviders/", {"q": "spa"}, "narrows"),
    ("admin", "node-types", ROW, "/api/v1/nodetypes/", {"provider": "metal3", "q": "server"}, "narrows"),
    ("admin", "environments", ROW, "/api/v1/nodeenvironments/", {"tenant": "bravo"}, "narrows"),
    ("admin", "images", ROW, "/api/v1/osimages/", {"q": "spare"}, "narrows"),
    ("admin", "tenants", ROW, "/api/v1/tenants/", {"name": "bravo"}, "narrows"),
    ("member_b", "tenants", ROW, "/api/v1/tenants/", {"q": "alp"}, "empties"),
]


@pytest.mark.parametrize("role, page, row, endpoint, query, effect", LISTS)
def test_a_filter_lists_the_same_objects_on_the_page_and_in_the_api(world, api, client, role, page, row, endpoint,
                                                                     query, effect):
    claims_transition(claims=[world.claim_b], to_phase="Releasing", actor="test")
    claims_transition(claims=[NodeClaim.objects.get(pk=world.claim_b.pk)], to_phase="Released", actor="test",
                      fields={"host": None})
    query = {k: v.format(host_a=world.host_a.pk, alpha=world.alpha.pk) for k, v in query.items()}
    client.force_login(world.users[role])
    response = client.get(reverse(page), query)
    assert response.status_code == 200
    assert type(response.context["filters"]) is resolve(endpoint).func.cls.filterset_class
    on_page = {int(pk) for pk in re.findall(row, response.content.decode())}
    listed = api(role, "get", endpoint, {**query, "page_size": 500}).json()
    in_api = {o["id"] for o in listed["results"]}
    assert listed["count"] < 50 and on_page == in_api  # both fit on one page
    everything = {o["id"] for o in api(role, "get", endpoint, {"page_size": 500}).json()["results"]}
    assert (bool(in_api) and in_api < everything) if effect == "narrows" else not in_api


@pytest.mark.parametrize("page, endpoint, query, bad", [
    ("fleet", "/api/v1/hosts/", {"label": "bad key!", "state": "available"}, "label"),
    ("claims", "/api/v1/claims/", {"phase": "flying", "tenant": "alpha"}, "phase"),
    ("events", "/api/v1/events/", {"host": "abc", "object_type": "claim"}, "host"),
    ("providers", "/api/v1/nodeproviders/", {"kind": "flying", "q": "spa"}, "kind"),
])
def test_a_bad_filter_value_is_a_400_in_the_api_and_ignored_with_a_message_on_the_page(world, api, client, page,
                                                                                        endpoint, query, bad):
    refused = api("admin", "get", endpoint, query)
    assert refused.status_code == 400 and bad in refused.json()
    client.force_login(world.users["admin"])
    response = client.get(reverse(page), query)
    assert response.status_code == 200 and f"Filter {bad} ignored" in response.content.decode()
    # The other filters still apply: the page lists what the API lists without the bad one.
    good = {k: v for k, v in query.items() if k != bad}
    listed = {o["id"] for o in api("admin", "get", endpoint, {**good, "page_size": 500}).json()["results"]}
    assert {o.pk for o in response.context["filters"].qs} == listed
    assert listed < {o["id"] for o in api("admin", "get", endpoint, {"page_size": 500}).json()["results"]}


@pytest.mark.parametrize("endpoint, name, invalid", [
    ("/api/v1/events/", "since", "yesterday"), ("/api/v1/events/", "until", "2026-01-01T00:00:00+23:00"),
    ("/api/v1/events/", "host", "abc"), ("/api/v1/events/", "kind", "flying"),
    ("/api/v1/decisions/", "reason", "Bored"), ("/api/v1/decisions/", "since", "soon"),
    ("/api/v1/hosts/", "online", "maybe"), ("/api/v1/hosts/", "power_state", "dim"),
    ("/api/v1/claim-groups/", "placed", "perhaps"), ("/api/v1/erase-certificates/", "result", "unsure"),
    ("/api/v1/repair/", "kind", "boredom"),
])
def test_an_empty_filter_is_no_filter_and_the_schema_says_so(world, api, endpoint, name, invalid):
    """The HTML lists' forms send their empty fields (`?since=&reason=`) to the same FilterSets: an empty id, time,
    choice or boolean means no filter, in the API too, and its schema takes "" for each; a value that is not one
    is still a 400."""
    schema = api("admin", "get", "/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    parameter = next(p for p in schema["paths"][endpoint]["get"]["parameters"] if p["name"] == name)
    jsonschema.Draft4Validator(parameter["schema"]).validate("")
    assert not jsonschema.Draft4Validator(parameter["schema"]).is_valid(invalid)
    everything, unfiltered = (api("admin", "get", endpoint, query).json() for query in ({}, {name: ""}))
    assert {k: v for k, v in unfiltered.items() if k not in ("next", "previous")} == \
        {k: v for k, v in everything.items() if k not in ("next", "previous")}
    refused = api("admin", "get", endpoint, {name: invalid})
    assert refused.status_code == 400 and name in refused.json()


def test_an_empty_state_is_still_refused_as_its_schema_says(world, api):
    """`state` is a list of states (`?state=a&state=b`): an empty one is no state, a 400, and the schema agrees."""
    schema = api("admin", "get", "/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    parameter = next(p for p in schema["paths"]["/api/v1/hosts/"]["get"]["parameters"] if p["name"] == "state")
    assert not jsonschema.Draft4Validator(parameter["schema"]).is_valid([""])
    assert api("admin", "get", "/api/v1/hosts/", {"state": ""}).status_code == 400


def test_a_sort_with_an_empty_column_sorts_by_the_others_on_the_board_and_in_the_api(world, api, client):
    by_state = [h["name"] for h in api("admin", "get", "/api/v1/hosts/", {"sort": "-state,name"}).json()["results"]]
    for sort in ("-state,,name", ",-state,name,", "-state,name,,"):
        response = api("admin", "get", "/api/v1/hosts/", {"sort": sort})
        assert response.status_code == 200 and [h["name"] for h in response.json()["results"]] == by_state
    client.force_login(world.users["admin"])
    page = client.get(reverse("fleet"), {"sort": "-state,,name"})
    assert page.status_code == 200 and [h.name for h in page.context["filters"].qs] == by_state


def test_node_types_show_their_capacity_in_a_constant_number_of_queries(world, api):
    gpu = next(t for t in api("member_a", "get", "/api/v1/nodetypes/").json()["results"] if t["name"] == "gpu-server")
    assert gpu["capacity"] == {"total": 4, "available": 3, "held_back": 0, "provisioned": 1,
                               "preparing": 0, "repair": 0, "error": 0, "maintenance": 0, "held": 0, "retired": 0}

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert api("member_a", "get", "/api/v1/nodetypes/").status_code == 200
        return len(ctx.captured_queries)

    api("admin", "get", "/api/v1/hosts/")  # the token's first use is recorded (then at most once a minute)
    few = queries()
    NodeType.objects.bulk_create([NodeType(name=f"t-{i}", provider=world.provider,
                                           host_selector={"matchLabels": {"role": f"r{i}"}}) for i in range(30)])
    assert queries() == few


# --- pools: optimistic concurrency and quotas -----------------------------------------------------

def test_a_pool_s_etag_is_its_version_and_a_stale_write_gets_412_and_changes_nothing(world, api):
    url = f"/api/v1/pools/{world.pool_a.pk}/"
    read = api("member_a", "get", url)
    assert read["ETag"] == 'W/"1"'
    changed = api("member_a", "patch", url, {"quantity": 2}, HTTP_IF_MATCH='W/"1"')
    assert changed.status_code == 200 and changed["ETag"] == 'W/"2"' and changed.json()["version"] == 2
    before = snapshot()
    stale = api("member_a", "patch", url, {"quantity": 3}, HTTP_IF_MATCH='W/"1"')
    assert stale.status_code == 412 and "changed meanwhile" in stale.json()["detail"]
    stale = api("member_a", "patch", url, {"quantity": 3, "node_labels": {"x": "y"}, "version": 1})
    assert stale.status_code == 412
    assert snapshot() == before
    assert api("member_a", "patch", url, {"quantity": 3}, HTTP_IF_MATCH='"2"').status_code == 200
    assert api("member_a", "patch", url, {"quantity": 4}).status_code == 200  # If-Match is optional
    assert api("member_a", "patch", url, {"quantity": 4}, HTTP_IF_MATCH="*").status_code == 200
    pool = NodePool.objects.get(pk=world.pool_a.pk)
    assert (pool.quantity, pool.version) == (4, 4)
    changes = Event.objects.filter(object_type="pool", actor="user:alice-alpha", kind="change")
    assert [e.message for e in changes.order_by("pk")] == ["quantity: 1 → 2", "quantity: 2 → 3", "quantity: 3 → 4"]


def test_a_malformed_if_match_or_one_that_contradicts_the_body_is_a_400(world, api):
    url = f"/api/v1/pools/{world.pool_a.pk}/"
    assert api("member_a", "patch", url, {"quantity": 2}, HTTP_IF_MATCH="yesterday").status_code == 400
    clash = api("member_a", "patch", url, {"quantity": 2, "version": 1}, HTTP_IF_MATCH='W/"7"')
    assert clash.status_code == 400 and "version" in clash.json()
    assert NodePool.objects.get(pk=world.pool_a.pk).quantity == 1


def test_other_pool_fields_bump_the_version_too_and_a_stale_delete_is_refused(world, api):
    url = f"/api/v1/pools/{world.pool_a.pk}/"
    changed = api("member_a", "patch", url, {"node_labels": {"team": "ml"}, "version": 1})
    assert changed.status_code == 200 and changed.json()["version"] == 2
    assert api("member_a", "delete", url, HTTP_IF_MATCH='W/"1"').status_code == 412
    assert api("member_a", "delete", url, HTTP_IF_MATCH='W/"2"').status_code == 204
    assert not NodePool.objects.filter(pk=world.pool_a.pk).exists()
    assert NodeClaim.objects.get(pk=world.claim_a.pk).phase == "Releasing"  # its claim went back
    assert Event.objects.filter(object_type="pool", message="deleted", actor="user:alice-alpha").exists()


def test_quantities_past_the_tenant_s_quota_get_400_and_change_nothing(world, api):
    Tenant.objects.filter(pk=world.alpha.pk).update(quota_nodes=3)
    before = snapshot()
    too_many = api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 4})
    assert too_many.status_code == 400
    assert too_many.json() == {"quantity": ["tenant alpha may have at most 3 node(s); these pools ask for 4"]}
    second = dict(name="more", provider="metal3", quantity=3, tenant="alpha",
                  node_type_selector=[{"property": "vcluster.com/node-type", "value": "cpu-server"}])
    assert api("member_a", "post", "/api/v1/pools/", second).json()["quantity"][0].endswith("ask for 4")
    assert snapshot() == before
    assert api("member_a", "post", "/api/v1/pools/", {**second, "quantity": 2}).status_code == 201


def test_a_new_pool_is_reconciled_and_recorded_with_its_creator(world, api, django_capture_on_commit_callbacks):
    body = {"tenant": "alpha", "name": "cpus", "provider": "metal3", "quantity": 1,
            "node_type_selector": [{"property": "vcluster.com/node-type", "value": "cpu-server"}],
            "node_labels": {"team": "ml"}, "taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}
    with django_capture_on_commit_callbacks() as callbacks:
        made = api("member_a", "post", "/api/v1/pools/", body)
    assert made.status_code == 201 and made["ETag"] == 'W/"1"'
    assert made.json()["tenant"] == "alpha" and made.json()["version"] == 1
    assert callbacks, "the reconcile is asked for on commit"
    assert Event.objects.get(object_type="pool", object_name="alpha/cpus").actor == "user:alice-alpha"
    duplicate = api("member_a", "post", "/api/v1/pools/", body)
    assert duplicate.status_code == 400


# --- bad input: 400 with field errors, nothing changed --------------------------------------------

BAD = [
    ("wrong type: quantity", "patch", "pool", {"quantity": "many"}, "quantity"),
    ("wrong type: labels", "patch", "pool", {"node_labels": ["a", "b"]}, "node_labels"),
    ("wrong type: a list body", "patch", "pool", [1, 2], "non_field_errors"),
    ("unknown field", "patch", "pool", {"quantity": 2, "replicas": 3}, "replicas"),
    ("negative quantity", "patch", "pool", {"quantity": -1}, "quantity"),
    ("selector with an unknown operator", "patch", "pool",
     {"node_type_selector": [{"property": "vcluster.com/node-type", "operator": "Like", "value": "gpu"}]},
     "node_type_selector"),
    ("taint without a key", "patch", "pool", {"taints": [{"effect": "NoSchedule"}]}, "taints"),
    ("dynamic pool with a quantity", "patch", "pool", {"kind": "dynamic"}, "quantity"),
    ("BMC address with an unknown scheme", "post", "hosts",
     {"name": "gpu-09", "bmc_address": "telnet://10.1.1.9/", "boot_mac": "52:54:00:00:09:09",
      "bmc_username": "bmcuser-x1", "bmc_password": "bmcpass-x1"}, "bmc_address"),
    ("MAC address that is not one", "post", "hosts",
     {"name": "gpu-09", "bmc_address": "redfish://10.1.1.9/redfish/v1/Systems/1", "boot_mac": "52:54:00",
      "bmc_username": "bmcuser-x1", "bmc_password": "bmcpass-x1"}, "boot_mac"),
    ("host without credentials", "post", "hosts",
     {"name": "gpu-09", "bmc_address": "redfish://10.1.1.9/redfish/v1/Systems/1", "boot_mac": "52:54:00:00:09:09"},
     "bmc_password"),
    ("unknown host field", "patch", "host", {"labels": {"role": "gpu"}, "bmc_port": 623}, "bmc_port"),
    ("image without a checksum", "post", "osimages", {"name": "nochecksum", "url": "http://127.0.0.1/x.raw"},
     "checksum"),
    ("image with a blank checksum", "post", "osimages",
     {"name": "nochecksum", "url": "http://127.0.0.1/x.raw", "checksum": ""}, "checksum"),
    ("image checksum of the wrong length", "post", "osimages",
     {"name": "shortsum", "url": "http://127.0.0.1/x.raw", "checksum": "abc123", "checksum_type": "sha256"},
     "checksum"),
    ("image URL that is not one", "post", "osimages",
     {"name": "badurl", "url": "ftp://x/y.raw", "checksum": "ab" * 32}, "url"),
    ("node type selector with an unknown operator", "post", "nodetypes",
     {"name": "odd", "provider": "metal3", "host_selector": {"matchExpressions": [{"key": "role", "operator": "Like"}]}},
     "host_selector"),
    ("node type with an unknown provider", "post", "nodetypes", {"name": "odd", "provider": "nowhere"}, "provider"),
    ("network outside its CIDR", "post", "nodeenvironments",
     {"name": "net", "properties": {"metal3.vcluster.com/network-cidr": "10.0.0.1/24",
                                    "metal3.vcluster.com/network-ip-range": "10.9.0.1-10.9.0.9"}}, "properties"),
    ("tenant name that is not a DNS label", "post", "tenants", {"name": "Alpha Corp"}, "name"),
    ("tenant with a negative quota", "post", "tenants", {"name": "delta", "quota_nodes": -2}, "quota_nodes"),
    ("NUL in a JSON field", "patch", "pool", {"node_labels": {"a": "b\x00c"}}, "node_labels"),
]


@pytest.mark.parametrize("what, method, target, body, field", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_400_with_field_errors_and_changes_nothing(world, api, what, method, target, body, field):
    path = {"pool": f"/api/v1/pools/{world.pool_a.pk}/", "host": f"/api/v1/hosts/{world.host_a.pk}/"}.get(
        target, f"/api/v1/{target}/")
    before = snapshot()
    response = api("admin", method, path, body)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert snapshot() == before


MALFORMED = [
    ("pools", {"disruption": {"budgets": 5}}), ("pools", {"disruption": {"budgets": "ab"}}),
    ("pools", {"disruption": {"consolidationPolicy": ["x"]}}), ("pools", {"limits": {"cpu": [1]}}),
    ("pools", {"kind": "dynamic", "quantity": None, "limits": {"cpu": "1e400"}}),
    ("pools", {"node_type_selector": [{"property": "a", "values": 5}]}),
    ("pools", {"node_type_selector": [{"property": "a", "operator": ["In"], "value": "x"}]}),
    ("pools", {"node_type_selector": "gpu"}), ("pools", {"taints": [{"key": "a", "effect": ["x"]}]}),
    ("nodetypes", {"host_selector": {"matchExpressions": 5}}),
    ("nodetypes", {"host_selector": {"matchExpressions": [{"key": "a", "operator": "In", "values": 5}]}}),
    ("nodetypes", {"host_selector": {"matchLabels": {"a": "b"}, "matchExpressions": "xy"}}),
    ("nodetypes", {"resources": {"cpu": "1e999"}}), ("nodetypes", {"resources": {"cpu": "nan"}}),
    ("nodetypes", {"properties": {"a": 5}}), ("tenants", {"provider_properties": {"metal3": 5}}),
    ("hosts", {"root_device_hints": [1]}), ("hosts", {"labels": {"a": None}}),
    ("nodetypes", {"cleaning_policy": "shred"}), ("nodetypes", {"erase_verify_share": 5}),
    ("nodetypes", {"erase_verify_share": "lots"}), ("nodetypes", {"health_nccl_min_busbw_gbps": -1}),
    ("nodetypes", {"health_dcgm_level": 9}), ("nodetypes", {"erase_concurrency": 0}),
    ("nodetypes", {"cleaning_policy": "full", "cleaning_fallback": "full"}), ("hosts", {"cleaning_policy": "shred"}),
]


@pytest.mark.parametrize("resource, body", MALFORMED, ids=[str(b) for _, b in MALFORMED])
def test_values_of_the_wrong_shape_get_400_and_are_never_saved(world, api, resource, body):
    """Shapes Model.clean() does not expect: refused before they reach it (or the allocator)."""
    target = {"pools": world.pool_a, "nodetypes": world.spare_type, "tenants": world.alpha, "hosts": world.host_a}
    before = snapshot()
    response = api("admin", "patch", f"/api/v1/{resource}/{target[resource].pk}/", body)
    assert response.status_code == 400, response.content
    assert snapshot() == before


def test_a_body_that_is_not_json_is_a_400(world):
    client = world.client("admin")
    response = client.generic("PATCH", f"/api/v1/pools/{world.pool_a.pk}/", "{quantity: 2", "application/json")
    assert response.status_code == 400 and "JSON parse error" in response.json()["detail"]


def test_a_form_body_is_a_415_and_changes_nothing(world):
    """JSON only, as the schema says: a form cannot say null (`provider=` read as no provider) nor leave out what a
    PUT must have; so a form or multipart write is refused whole, and the schema offers JSON alone."""
    client = world.client("admin")
    before = snapshot()
    for method, path, body, content_type in [
        ("POST", "/api/v1/nodeenvironments/", "name=spare-2&provider=", "application/x-www-form-urlencoded"),
        ("PUT", f"/api/v1/tenants/{world.bravo.pk}/", '--b\r\nContent-Disposition: form-data; name="display_name"'
                                                       '\r\n\r\nZ\r\n--b--\r\n', "multipart/form-data; boundary=b"),
        ("PATCH", f"/api/v1/pools/{world.pool_a.pk}/", "quantity=2", "application/x-www-form-urlencoded"),
    ]:
        refused = client.generic(method, path, body, content_type, HTTP_IF_MATCH="*")
        assert refused.status_code == 415, (path, refused.content)
        assert refused.json() == {"detail": f'Unsupported media type "{content_type}" in request.'}
    assert snapshot() == before
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    bodies = {(path, method): set(operation["requestBody"]["content"]) for path, operations in schema["paths"].items()
              for method, operation in operations.items() if "requestBody" in operation}
    assert bodies.pop(("/api/v1/apply/", "post")) == {"application/json", "application/yaml", "text/yaml"}
    assert len(bodies) > 20 and set().union(*bodies.values()) == {"application/json"}
    made = client.post("/api/v1/nodeenvironments/", {"name": "spare-2", "provider": None}, format="json")
    assert made.status_code == 201 and made.json()["provider"] is None  # null said as JSON says it


# --- hosts ----------------------------------------------------------------------------------------

def test_an_admin_registers_a_host_whose_credentials_are_never_returned(world, api):
    body = {"name": "gpu-09", "bmc_address": "redfish+http://127.0.0.1:8009/redfish/v1/Systems/gpu-09",
            "boot_mac": "52:54:00:00:09:AB", "bmc_username": "bmcuser-gpu-09", "bmc_password": "s3cret-gpu-09!",
            "labels": {"role": "gpu", "rack": "r9"}}
    made = api("admin", "post", "/api/v1/hosts/", body)
    assert made.status_code == 201
    data = made.json()
    assert data["state"] == "registering" and data["has_bmc_credentials"] and data["boot_mac"] == "52:54:00:00:09:ab"
    host = BareMetalHost.objects.get(name="gpu-09")
    assert (host.bmc_username, host.bmc_password) == ("bmcuser-gpu-09", "s3cret-gpu-09!")
    with connection.cursor() as cursor:
        cursor.execute("SELECT bmc_password FROM hosts_baremetalhost WHERE name = 'gpu-09'")
        assert "s3cret" not in cursor.fetchone()[0]  # encrypted at rest
    event = Event.objects.get(object_type="host", object_name="gpu-09")
    assert event.actor == "user:ada-admin" and "s3cret" not in str(event.data) + event.message
    rotated = api("admin", "patch", f"/api/v1/hosts/{host.pk}/", {"bmc_password": "n3w-s3cret-gpu-09"})
    assert rotated.status_code == 200
    assert BareMetalHost.objects.get(pk=host.pk).bmc_password == "n3w-s3cret-gpu-09"
    change = Event.objects.filter(object_type="host", object_name="gpu-09").latest("pk")
    assert change.message == "bmc_password: (set) → (set)"
    fixed = api("admin", "patch", f"/api/v1/hosts/{host.pk}/", {"boot_mac": "52:54:00:00:09:ff"})
    assert fixed.status_code == 400 and "fixed once the host is registered" in str(fixed.json()["boot_mac"])
    assert BareMetalHost.objects.get(pk=host.pk).boot_mac == "52:54:00:00:09:ab"  # nothing changed
    same = api("admin", "patch", f"/api/v1/hosts/{host.pk}/", {"boot_mac": "52:54:00:00:09:ab"})
    assert same.status_code == 200  # sent again unchanged: fine


def test_maintenance_and_retry_go_through_the_host_services(world, api):
    free = BareMetalHost.objects.get(name="gpu-02")
    on = api("admin", "post", f"/api/v1/hosts/{free.pk}/maintenance/", {"on": True, "reason": "fan swap"})
    assert on.status_code == 200 and on.json()["state"] == "maintenance"
    assert Event.objects.filter(host=free, to_state="maintenance", actor="user:ada-admin", message="fan swap").exists()
    off = api("admin", "post", f"/api/v1/hosts/{free.pk}/maintenance/", {"on": False})
    assert off.status_code == 200 and off.json()["state"] == "registering"

    busy = api("admin", "post", f"/api/v1/hosts/{world.host_a.pk}/maintenance/", {"on": True})
    assert busy.status_code == 409
    assert busy.json()["detail"] == (f"{world.host_a.name} is provisioning (it is being installed for a claim), so "
                                     "it cannot go to maintenance: release its claim first")
    assert api("admin", "post", f"/api/v1/hosts/{free.pk}/retry/").status_code == 409

    broken = BareMetalHost.objects.get(name="gpu-03")
    host_transition(host=broken, to_state=HostState.MAINTENANCE, actor="test")
    host_transition(host=broken, to_state=HostState.REGISTERING, actor="test")
    host_transition(host=broken, to_state=HostState.ERROR, actor="test", reason="BMC did not answer")
    retried = api("admin", "post", f"/api/v1/hosts/{broken.pk}/retry/", {"reason": "cable fixed"})
    assert retried.status_code == 200 and retried.json()["state"] == "registering"
    assert api("admin", "post", f"/api/v1/hosts/{broken.pk}/maintenance/", {"on": "sometimes"}).status_code == 400


# --- claims ---------------------------------------------------------------------------------------

def test_a_member_releases_a_claim_of_its_tenant(world, api):
    url = f"/api/v1/claims/{world.claim_a.pk}/release/"
    assert api("member_b", "post", url).status_code == 404
    assert api("auditor", "post", url).status_code == 403
    released = api("member_a", "post", url, {"reason": "done training"})
    assert released.status_code == 200 and released.json()["phase"] == "Releasing"
    assert BareMetalHost.objects.get(pk=world.host_a.pk).state == "deprovisioning"
    event = Event.objects.get(claim=world.claim_a, to_state="Releasing")
    assert (event.actor, event.message) == ("user:alice-alpha", "done training")
    again = api("member_a", "post", url)
    assert again.status_code == 409 and "Releasing" in again.json()["detail"]


# --- tenants --------------------------------------------------------------------------------------

def test_tenants_kubeconfig_is_write_only_and_a_tenant_without_claims_can_go(world, api):
    made = api("admin", "post", "/api/v1/tenants/", {"name": "charlie", "quota_nodes": 2,
                                                      "kubeconfig": "apiVersion: v1\nusers:\n- user:\n    token: kc-charlie-5e3b1f\n"})
    assert made.status_code == 201 and made.json()["has_kubeconfig"] and "kubeconfig" not in made.json()
    charlie = Tenant.objects.get(name="charlie")
    assert "kc-charlie-5e3b1f" in charlie.kubeconfig
    pool = {"tenant": "charlie", "name": "gpu", "provider": "metal3", "quantity": 0}
    assert api("admin", "post", "/api/v1/pools/", pool).status_code == 201
    assert api("admin", "patch", f"/api/v1/tenants/{charlie.pk}/", {"name": "delta"}).json()["name"] == "charlie"
    assert api("admin", "delete", f"/api/v1/tenants/{charlie.pk}/").status_code == 204
    assert not Tenant.objects.filter(name="charlie").exists() and not NodePool.objects.filter(tenant_id=charlie.pk).exists()
    assert set(Event.objects.filter(message="deleted", actor="user:ada-admin").values_list("object_type", flat=True)) \
        == {"pool", "tenant"}


def test_a_tenant_holding_nodes_is_deleted_once_its_claims_are_released(world, api):
    alpha = world.alpha
    assert api("member_a", "delete", f"/api/v1/tenants/{alpha.pk}/").status_code == 403  # admins only
    asked = api("admin", "delete", f"/api/v1/tenants/{alpha.pk}/")
    assert asked.status_code == 202 and "being deleted: 1 claim(s) still release" in asked.json()["detail"]
    world.claim_a.refresh_from_db()
    world.host_a.refresh_from_db()
    assert world.claim_a.phase == "Releasing" and world.host_a.state == HostState.DEPROVISIONING  # drain, clean
    assert not NodePool.objects.filter(tenant=alpha).exists()
    assert api("admin", "get", f"/api/v1/tenants/{alpha.pk}/").json()["deleting_since"]
    refused = api("member_a", "post", "/api/v1/pools/", {"tenant": "alpha", "name": "again", "provider": "metal3",
                                                         "quantity": 1})
    assert refused.status_code == 400 and "tenant alpha is being deleted" in str(refused.json())
    assert not NodePool.objects.filter(tenant=alpha).exists()
    assert api("admin", "delete", f"/api/v1/tenants/{alpha.pk}/").status_code == 202  # asking again: same answer
    assert Event.objects.filter(object_type="tenant", object_name="alpha", message__startswith="deletion requested",
                                actor="user:ada-admin").count() == 1
    out = io.StringIO()
    call_command("reconcile", stdout=out)
    assert "tenant alpha deleted" not in out.getvalue() and Tenant.objects.filter(pk=alpha.pk).exists()

    # The deprovision flow ends the release as it does on its last step; the next reconcile finishes the deletion.
    claims_transition(claims=[world.claim_a], to_phase="Released", actor="system:flow", reason="Released",
                      fields={"host": None})
    call_command("reconcile", stdout=out)
    assert "tenant alpha deleted: every claim released" in out.getvalue()
    assert not Tenant.objects.filter(pk=alpha.pk).exists() and not NodeClaim.objects.filter(tenant_id=alpha.pk).exists()
    assert Event.objects.filter(claim_id=world.claim_a.pk).exists()  # the Event log keeps the claim's story
    assert Tenant.objects.filter(name="bravo").exists() and NodeClaim.objects.filter(tenant=world.bravo).exists()


def test_config_objects_are_written_through_object_update(world, api):
    made = api("admin", "post", "/api/v1/osimages/", {"name": "rocky9", "url": "https://img/rocky9.qcow2",
                                                      "checksum": "AB" * 32, "format": "qcow2"})
    assert made.status_code == 201
    assert made.json()["checksum_type"] == "sha256" and made.json()["checksum"] == "ab" * 32  # clean() normalised
    event = Event.objects.get(object_type="osimage", object_name="rocky9")
    assert (event.actor, event.message) == ("user:ada-admin", "created")
    unchanged = api("admin", "patch", f"/api/v1/osimages/{made.json()['id']}/", {"format": "qcow2"})
    assert unchanged.status_code == 200
    assert Event.objects.filter(object_type="osimage", object_name="rocky9").count() == 1  # nothing changed
    in_use = api("admin", "delete", f"/api/v1/nodeproviders/{world.provider.pk}/")
    assert in_use.status_code == 409


# --- apply ----------------------------------------------------------------------------------------

SITE = """apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata:
  name: edge
spec:
  metal3:
    nodeTypes:
      - name: edge-small
        resources: {cpu: "8"}
        bareMetalHosts:
          selector:
            matchLabels: {role: edge}
---
apiVersion: management.loft.sh/v1
kind: OSImage
metadata:
  name: edge-image
spec:
  properties:
    metal3.vcluster.com/image-url: http://127.0.0.1/edge.raw
    metal3.vcluster.com/image-checksum: %s
    metal3.vcluster.com/image-checksum-type: sha256
""" % ("ef" * 32)
BROKEN = SITE + """---
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: edge-large
spec:
  providerRef: edge
  resources: {cpu: many}
"""


def test_apply_answers_what_manage_py_apply_prints(world, api, apply):
    dry = api("admin", "post", "/api/v1/apply/", {"files": [{"name": "site.yaml", "text": SITE}], "dry_run": True})
    assert dry.status_code == 200
    assert dry.json() == {"dry_run": True, "changed": 3, "lines": [
        "nodeprovider/edge created (dry run)", "nodetype/edge-small created (dry run)",
        "osimage/edge-image created (dry run)"]}
    assert not NodeProvider.objects.filter(name="edge").exists()
    done = api("admin", "post", "/api/v1/apply/", {"files": [{"name": "site.yaml", "text": SITE}]})
    assert done.json()["lines"] == [line.removesuffix(" (dry run)") for line in dry.json()["lines"]]
    assert NodeProvider.objects.filter(name="edge").exists()
    assert set(Event.objects.filter(actor="user:ada-admin").values_list("object_type", flat=True)) == {
        "nodeprovider", "nodetype", "osimage"}
    assert api("admin", "post", "/api/v1/apply", {"files": [{"text": SITE}]}).json()["lines"] == apply(SITE)
    as_yaml = world.client("admin").generic("POST", "/api/v1/apply/?dry_run=true", SITE, "application/yaml")
    assert as_yaml.status_code == 200, as_yaml.json()
    assert as_yaml.json()["changed"] == 0, as_yaml.json()


def test_apply_errors_name_the_document_and_line_and_apply_nothing(world, api, apply):
    before = snapshot()
    failed = api("admin", "post", "/api/v1/apply/", {"files": [{"name": "site.yaml", "text": BROKEN}]})
    assert failed.status_code == 400
    error = failed.json()
    line = BROKEN.splitlines().index("  resources: {cpu: many}") + 1
    assert (error["file"], error["document"], error["line"]) == ("site.yaml", 3, line)
    assert error["message"] == "spec.resources: cpu: 'many' is not a quantity"
    with pytest.raises(Exception) as cli:
        apply(BROKEN, names=["site.yaml"])
    assert str(cli.value).endswith("/" + error["detail"])  # word for word what manage.py apply says
    assert snapshot() == before

    not_yaml = api("admin", "post", "/api/v1/apply/", {"files": [{"name": "x.yaml", "text": "a: [1,"}]})
    assert not_yaml.status_code == 400 and not_yaml.json()["line"] is not None
    for body, field in (({"files": []}, "files"), ({"files": "site.yaml"}, "files"),
                        ({"files": [{"text": SITE}], "force": True}, "force"), ({"dry_run": True}, "files")):
        response = api("admin", "post", "/api/v1/apply/", body)
        assert response.status_code == 400 and field in response.json()
    assert snapshot() == before


def test_members_apply_only_their_own_tenant_s_vcluster_yaml(world, api, seed_block):
    theirs = api("member_a", "post", "/api/v1/apply/", {"files": [{"text": seed_block}], "tenant": "alpha"})
    assert theirs.status_code == 200
    assert set(NodePool.objects.filter(tenant=world.alpha).values_list("name", flat=True)) == {"gpu", "cpu"}
    assert Event.objects.filter(object_type="pool", object_name="alpha/cpu", actor="user:alice-alpha").exists()
    before = snapshot()
    for role, body in (("member_a", {"files": [{"text": seed_block}], "tenant": "bravo"}),
                       ("member_a", {"files": [{"text": seed_block}], "tenant": "newcorp"}),
                       ("member_a", {"files": [{"text": seed_block}]}),
                       ("member_a", {"files": [{"text": SITE}], "tenant": "alpha"}),
                       ("auditor", {"files": [{"text": seed_block}], "tenant": "alpha"})):
        assert api(role, "post", "/api/v1/apply/", body).status_code == 403, (role, body)
    assert api("anonymous", "post", "/api/v1/apply/", {"files": [{"text": SITE}]}).status_code == 401
    Tenant.objects.filter(pk=world.alpha.pk).update(quota_nodes=1)
    # Above the quota already (2 of 1): growing is refused (shrinking toward it is not: test_quota_lowered).
    grown = seed_block.replace("quantity: 1", "quantity: 2")
    over = api("member_a", "post", "/api/v1/apply/", {"files": [{"text": grown}], "tenant": "alpha"})
    assert over.status_code == 400 and "at most 1 node" in over.json()["message"]
    assert snapshot()[1] == before[1]


def test_apply_refuses_values_of_a_shape_the_models_do_not_expect(world, api):
    odd = ("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n          quantity: 1\n"
           "          nodeTypeSelector:\n            - property: vcluster.com/node-type\n              values: 5\n")
    before = snapshot()
    response = api("admin", "post", "/api/v1/apply/", {"files": [{"text": odd}], "tenant": "alpha"})
    # NodePool.clean() checks shapes too, so the answer names the line (not only "nothing was applied").
    assert response.status_code == 400 and response.json()["line"] == 7, response.json()
    assert "nodeTypeSelector: [0].values: must be a list of strings" in response.json()["message"]
    assert snapshot() == before


def test_apply_keeps_secrets_out_of_its_answer(world, api):
    secret = yaml.safe_dump({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpu-09-bmc"},
                             "stringData": {"username": "bmcuser-gpu-09", "password": "pw-never-shown-9"}})
    host = yaml.safe_dump({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                           "metadata": {"name": "gpu-09", "labels": {"role": "gpu"}},
                           "spec": {"bmc": {"address": "redfish://10.1.1.9/redfish/v1/Systems/9",
                                            "credentialsName": "gpu-09-bmc"}, "bootMACAddress": "52:54:00:00:09:09"}})
    done = api("admin", "post", "/api/v1/apply/", {"files": [{"text": secret + "---\n" + host}]})
    assert done.status_code == 200 and "pw-never-shown-9" not in done.content.decode()
    broken = host.replace("redfish://", "gopher://")
    failed = api("admin", "post", "/api/v1/apply/", {"files": [{"text": secret.replace("gpu-09", "gpu-10") + "---\n"
                                                                 + broken.replace("gpu-09", "gpu-10")}]})
    assert failed.status_code == 400 and "gopher" in failed.json()["message"]


def test_the_reconciler_still_reads_pools_made_through_the_api(world, api):
    api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2})
    call_command("reconcile", stdout=io.StringIO())
    assert NodeClaim.objects.filter(pool=world.pool_a).exclude(phase="Released").count() == 2


# --- the release gate: NodeType cleaning and health fields, a host's effective method and its evidence --------

def test_an_admin_reads_and_sets_a_node_types_cleaning_and_health_check(world, api):
    url = f"/api/v1/nodetypes/{world.spare_type.pk}/"
    shown = api("auditor", "get", url).json()
    assert {k: shown[k] for k in ("cleaning_policy", "cleaning_fallback", "erase_concurrency", "erase_verify_share",
                                  "erase_verify_full", "health_dcgm_level", "health_nccl_min_busbw_gbps")} == \
        {"cleaning_policy": "full", "cleaning_fallback": "", "erase_concurrency": 4, "erase_verify_share": 0.01,
         "erase_verify_full": False, "health_dcgm_level": 2, "health_nccl_min_busbw_gbps": None}
    changed = api("admin", "patch", url, {"cleaning_policy": "secure", "cleaning_fallback": "full",
                                          "health_nccl_min_busbw_gbps": 400})
    assert changed.status_code == 200, changed.content
    spare = NodeType.objects.get(pk=world.spare_type.pk)
    assert (spare.cleaning_policy, spare.cleaning_fallback, spare.health_nccl_min_busbw_gbps) == ("secure", "full", 400)
    assert Event.objects.filter(object_type="nodetype", object_name="spare-type", actor=world.actor("admin")).exists()
    for role in ("member_a", "auditor"):
        assert api(role, "patch", url, {"cleaning_policy": "metadata"}).status_code == 403
    refused = api("admin", "patch", url, {"cleaning_fallback": "secure"})
    assert refused.status_code == 400 and refused.json() == {"cleaning_fallback": ["a fallback must differ from the method"]}
    assert NodeType.objects.get(pk=world.spare_type.pk).cleaning_policy == "secure"


def _evidence(host, n: int) -> None:
    from hosts.models import EraseCertificate, HealthCheckRun

    for i in range(n):
        EraseCertificate.objects.create(host=host, host_name=host.name, flow_id=f"{host.name}-{i}", disk="nvme0n1",
                                        method="full",
                                        method_type="Clear", result="pass", previous_tenant="alpha",
                                        document={"certificate_id": f"cert-{host.name}-{i}"}, signature="0" * 64,
                                        key_id="k1")
        HealthCheckRun.objects.create(host=host, host_name=host.name, flow_id=f"{host.name}-{i}", suite="dcgmi",
                                      verdict="fail" if i == n - 1 else "pass", reasons=["Detected XID 48 for GPU 3"]
                                      if i == n - 1 else [], raw_output="raw dcgmi output " * 50)


def test_a_host_shows_its_effective_cleaning_method_and_links_to_its_evidence(world, api):
    from hosts.models import EraseCertificate

    host = world.host_a
    _evidence(host, 3)
    shown = api("auditor", "get", f"/api/v1/hosts/{host.pk}/").json()
    node_type = world.claim_a.node_type.name
    assert shown["cleaning_policy"] == ""
    assert shown["effective_cleaning"] == {"method": "full", "fallback": "", "source": f"NodeType {node_type}",
                                           "node_type": node_type}
    newest = EraseCertificate.objects.filter(host=host).order_by("-pk").first()
    assert [c["certificate_id"] for c in shown["erase_certificates"]] == [f"cert-{host.name}-{i}" for i in (2, 1, 0)]
    assert shown["erase_certificates"][0]["url"] == f"/certificates/{newest.pk}.json"
    assert shown["erase_certificates"][0]["page"] == f"/certificates/{newest.pk}/"
    assert [(r["suite"], r["verdict"]) for r in shown["health_runs"]] == [("dcgmi", "fail"), ("dcgmi", "pass"),
                                                                          ("dcgmi", "pass")]
    assert shown["health_runs"][0]["reasons"] == ["Detected XID 48 for GPU 3"]
    assert "raw dcgmi output" not in str(shown) and "signature" not in shown["erase_certificates"][0]
    assert world.client("admin").get(shown["erase_certificates"][0]["url"]).status_code in (200, 302)

    overridden = api("admin", "patch", f"/api/v1/hosts/{host.pk}/", {"cleaning_policy": "secure"})
    assert overridden.status_code == 200, overridden.content
    assert overridden.json()["effective_cleaning"]["method"] == "secure"
    assert overridden.json()["effective_cleaning"]["source"] == "host override"
    # A tenant member sees its node, not the evidence of earlier tenants' erases.
    mine = api("member_a", "get", f"/api/v1/hosts/{host.pk}/").json()
    assert "erase_certificates" not in mine and "health_runs" not in mine


def test_erase_certificates_and_health_runs_are_read_with_their_filters(world, evidence, api):
    from hosts.gate import certificates

    def ids(role: str, path: str) -> set[int]:
        response = api(role, "get", path)
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    row = api("member_a", "get", f"/api/v1/erase-certificates/{world.cert_a.pk}/").json()
    assert (row["host"], row["host_name"], row["previous_tenant"], row["claim_name"], row["result"]) == (
        world.host_b.pk, world.host_b.name, "alpha", "alpha-old", "pass")
    # The body and signature are those of the signed file its link serves (to a token, as the console's download
    # does to a session), which verify-certificate says is valid.
    assert (row["url"], row["page"]) == (f"/certificates/{world.cert_a.pk}.json", f"/certificates/{world.cert_a.pk}/")
    signed = world.client("member_a").get(row["signed_file"])
    assert signed.status_code == 200 and signed["Content-Disposition"].startswith('attachment; filename="erase-')
    assert signed.content.decode() == certificates.render_certificate(world.cert_a)
    assert certificates.verify_text(signed.content.decode())[0]
    file = json.loads(signed.content)
    assert (row["document"], row["signature"], row["key_id"]) == (file["certificate"], file["signature"]["value"],
                                                                  file["signature"]["key_id"])
    assert api("member_b", "get", row["signed_file"]).status_code == 404
    assert api("anonymous", "get", row["signed_file"]).status_code == 401
    certs = "/api/v1/erase-certificates/"
    assert ids("auditor", certs) == {world.cert_a.pk, world.cert_b.pk, world.cert_none.pk}
    assert ids("admin", certs + "?tenant=alpha") == {world.cert_a.pk}
    assert ids("admin", f"{certs}?host={world.host_a.pk}") == {world.cert_b.pk, world.cert_none.pk}
    assert ids("admin", f"{certs}?result=pass&tenant=bravo") == {world.cert_b.pk}
    assert ids("admin", certs + "?result=fail") == set()

    runs = "/api/v1/health-runs/"
    assert ids("admin", runs + "?verdict=fail") == {world.run_none.pk}
    assert ids("admin", runs + "?verdict=pass") == {world.run_a.pk, world.run_b.pk}
    assert ids("admin", runs + "?tenant=bravo") == {world.run_b.pk}
    assert ids("admin", f"{runs}?host={world.host_b.pk}&suite=dcgmi") == {world.run_a.pk}
    listed = api("member_a", "get", runs).json()["results"]
    assert [(r["id"], r["suite"], r["verdict"], r["flow_id"]) for r in listed] == [
        (world.run_a.pk, "dcgmi", "pass", "release-alpha")]
    assert "raw_output" not in listed[0]  # the tool's output on the run itself, not in lists
    one = api("member_a", "get", f"{runs}{world.run_a.pk}/").json()
    assert (one["command"], one["raw_output"], one["thresholds"]) == ("dcgmi diag -r 2 -j", "{}", {"dcgm_level": 2})
    for bad in (certs + "?result=maybe", runs + "?verdict=maybe", runs + "?host=gpu-01"):
        response = api("admin", "get", bad)
        assert response.status_code == 400 and set(response.json()) & {"result", "verdict", "host"}, bad


def test_the_host_list_fetches_evidence_in_a_constant_number_of_queries(world, api):
    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert api("admin", "get", "/api/v1/hosts/").status_code == 200
        return len(ctx.captured_queries)

    api("admin", "get", "/api/v1/hosts/")  # the token's first use is recorded (then at most once a minute)
    few = queries()
    for host in BareMetalHost.objects.all():
        _evidence(host, 25)
    hosts = api("admin", "get", "/api/v1/hosts/").json()["results"]
    assert all(len(h["erase_certificates"]) == 20 and len(h["health_runs"]) == 20 for h in hosts)
    assert queries() == few
