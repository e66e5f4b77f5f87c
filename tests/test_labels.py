"""Labels and taints as Kubernetes takes them (issue 16.9): keys are qualified names (an optional DNS-subdomain
prefix of at most 253 characters, a name of at most 63), values at most 63 characters of the label alphabet,
taint effects NoSchedule, PreferNoSchedule or NoExecute; on hosts, pools, node types and claims, refused alike by
apply, the API and the admin, every error of a document reported with its line, and nothing applied."""
import pytest
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodePool, NodeType
from tests.factories import bmh, form_data

pytestmark = pytest.mark.django_db

BAD_KEY = "'bad key!!' is not a valid label key: name part must consist of alphanumeric characters"
BAD_VALUE = "'va lue$$' is not a valid label value: must be empty or consist of alphanumeric characters"

POOL = """\
privateNodes:
  autoNodes:
    - provider: metal3
      static:
        - name: gpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          nodeLabels:
            team: ml
            "bad key!!": "va lue$$"
          taints:
            - key: gpu
              effect: NoSchedul
"""


def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_host_with_a_bad_label_key_and_value_is_refused_by_apply_with_both_errors(demo_site, apply):
    manifest = bmh("gpu-51", "52:54:00:00:51:01").replace("role: gpu", "'bad key!!': va lue$$")
    events = Event.objects.count()
    with pytest.raises(CommandError) as info:
        apply(manifest)
    message = str(info.value)
    at = f"document 2 (line {line_of(manifest, 'bad key!!')}): metadata.labels.bad key!!: "
    assert at + BAD_KEY in message, message
    assert at + BAD_VALUE in message, message
    assert not BareMetalHost.objects.filter(name="gpu-51").exists()
    assert Event.objects.count() == events


def test_a_pool_with_bad_labels_and_a_bad_taint_is_refused_by_apply_with_every_error_at_its_line(world, apply):
    before = list(NodePool.objects.values_list("name", "node_labels", "taints", "quantity").order_by("pk"))
    with pytest.raises(CommandError) as info:
        apply(POOL, tenant="alpha")
    message = str(info.value)
    labels_line, effect_line = line_of(POOL, "bad key!!"), line_of(POOL, "effect: NoSchedul")
    pool = "privateNodes.autoNodes[0].static[0]"
    assert f"(line {labels_line}): {pool}.nodeLabels.bad key!!: {BAD_KEY}" in message, message
    assert f"(line {labels_line}): {pool}.nodeLabels.bad key!!: {BAD_VALUE}" in message, message
    assert (f"(line {effect_line}): {pool}.taints[0].effect: effect must be one of NoSchedule, PreferNoSchedule, "
            "NoExecute, not 'NoSchedul'") in message, message
    assert list(NodePool.objects.values_list("name", "node_labels", "taints", "quantity").order_by("pk")) == before


def test_the_apply_api_lists_every_error_with_its_line(world):
    response = world.client("member_a").post("/api/v1/apply/?tenant=alpha", POOL, content_type="application/yaml")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert [e["line"] for e in errors] == [line_of(POOL, "bad key!!")] * 2 + [line_of(POOL, "NoSchedul")]
    assert BAD_KEY in errors[0]["message"] and BAD_VALUE in errors[1]["message"]
    assert response.json()["line"] == errors[0]["line"]
    assert NodePool.objects.get(tenant=world.alpha).node_labels == {}


def test_the_api_refuses_bad_labels_on_a_host_and_a_pool_with_every_error_and_changes_nothing(world, api):
    host = api("admin", "patch", f"/api/v1/hosts/{world.host_a.pk}/", {"labels": {"bad key!!": "va lue$$"}})
    assert host.status_code == 400, host.content
    assert list(host.json()) == ["labels"] and len(host.json()["labels"]) == 2
    assert host.json()["labels"][0].startswith(f"bad key!!: {BAD_KEY}")
    assert host.json()["labels"][1].startswith(f"bad key!!: {BAD_VALUE}")
    world.host_a.refresh_from_db()
    assert "bad key!!" not in world.host_a.labels
    pool = api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/",
               {"node_labels": {"bad key!!": "va lue$$"}, "taints": [{"key": "a/b/c", "effect": "NoSchedule"}]})
    assert pool.status_code == 400, pool.content
    assert [m.split(":")[0] for m in pool.json()["node_labels"]] == ["bad key!!", "bad key!!"]
    assert pool.json()["taints"][0].startswith("[0].key: 'a/b/c' is not a valid taint key")
    world.pool_a.refresh_from_db()
    assert (world.pool_a.node_labels, world.pool_a.taints, world.pool_a.version) == ({}, [], 1)


KEYS = [
    ("a plain name", "role", "gpu", True),
    ("a prefixed name", "example.com/role", "gpu", True),
    ("an empty value", "role", "", True),
    ("a value of 63 characters", "role", "v" * 63, True),
    ("a name of 63 characters", "n" * 63, "x", True),
    ("a prefix of 253 characters", ".".join(["p" * 63] * 4)[:253] + "/role", "x", True),
    ("a value of 64 characters", "role", "v" * 64, False),
    ("a name of 64 characters", "n" * 64, "x", False),
    ("a prefix of 254 characters", ".".join(["p" * 63] * 4)[:251] + ".pp/role", "x", False),
    ("an upper-case prefix", "Example.com/role", "x", False),
    ("an empty prefix", "/role", "x", False),
    ("two slashes", "a/b/c", "x", False),
    ("a name starting with a dash", "-role", "x", False),
    ("a value ending with a dot", "role", "gpu.", False),
    ("a space in the value", "role", "g pu", False),
]


@pytest.mark.parametrize("what, key, value, ok", KEYS, ids=[k[0] for k in KEYS])
def test_label_keys_and_values_follow_kubernetes_rules(world, api, what, key, value, ok):
    response = api("admin", "patch", f"/api/v1/hosts/{world.host_a.pk}/", {"labels": {key: value}})
    assert response.status_code == (200 if ok else 400), response.content
    world.host_a.refresh_from_db()
    assert (world.host_a.labels == {key: value}) == ok


def test_a_node_type_selector_is_checked_as_kubernetes_label_selectors_are(world, api):
    response = api("admin", "post", "/api/v1/nodetypes/", {
        "name": "odd", "provider": "metal3",
        "host_selector": {"matchLabels": {"bad key!!": "gpu"},
                          "matchExpressions": [{"key": "rack", "operator": "In", "values": ["r 1"]}]}})
    assert response.status_code == 400, response.content
    messages = response.json()["host_selector"]
    assert messages[0].startswith("matchLabels.bad key!!: 'bad key!!' is not a valid label key")
    assert messages[1].startswith("matchExpressions[0].values[0]: 'r 1' is not a valid label value")
    assert not NodeType.objects.filter(name="odd").exists()


def test_a_pool_property_name_must_be_a_qualified_name(world, api):
    response = api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/",
                   {"node_type_selector": [{"property": "node type", "value": "gpu-server"}]})
    assert response.status_code == 400
    assert response.json()["node_type_selector"][0].startswith("[0].property: 'node type' is not a valid property")


def test_the_admin_refuses_bad_labels_on_a_host_and_a_claim(world):
    admin = Client()
    admin.force_login(world.users["admin"])
    change = reverse("admin:hosts_baremetalhost_change", args=[world.host_a.pk])
    response = admin.post(change, {**form_data(admin.get(change)), "labels": '{"bad key!!": "va lue$$"}'})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["labels"]
    assert errors[0].startswith(f"bad key!!: {BAD_KEY}") and errors[1].startswith(f"bad key!!: {BAD_VALUE}")
    claim = world.claim_a
    change = reverse("admin:claims_nodeclaim_change", args=[claim.pk])
    response = admin.post(change, {**form_data(admin.get(change)),
                                   "taints": '[{"key": "gpu", "effect": "Sometimes"}]'})
    assert response.status_code == 200
    assert "effect must be one of NoSchedule, PreferNoSchedule, NoExecute" in \
        response.context["adminform"].form.errors["taints"][0]
    assert NodeClaim.objects.get(pk=claim.pk).taints == claim.taints


def test_the_console_apply_page_lists_every_error_of_the_document(world):
    admin = Client()
    admin.force_login(world.users["admin"])
    response = admin.post(reverse("apply"), {"text": POOL, "tenant": "alpha", "action": "preview"})
    assert response.status_code == 400
    errors = response.context["form"].errors["text"]
    assert len(errors) == 3, errors
    assert f"(line {line_of(POOL, 'bad key!!')})" in errors[0] and BAD_KEY in errors[0]
    assert f"(line {line_of(POOL, 'NoSchedul')})" in errors[2] and "taints[0].effect" in errors[2]
    assert NodePool.objects.get(tenant=world.alpha).node_labels == {}
