"""A quota lowered below what a tenant uses (issue 16.8): the admin who lowers it is told (admin, API with a
Warning header, apply) and it is saved, nothing released; the tenant's members may then shrink their pools toward
it, through the API and the console, but not grow them."""
import pytest
from django.test import Client
from django.urls import reverse

from pools.models import NodePool, Tenant
from tests.factories import form_data, messages_of

pytestmark = pytest.mark.django_db

WARNING = ("tenant alpha's pools ask for 3 node(s), more than its new quota of {quota}: nothing is released; its "
           "pools may shrink, but not grow, until they fit")
REFUSED = "tenant alpha may have at most 1 node(s); these pools ask for {total}"


@pytest.fixture
def alpha_uses_3(world, api):
    """Tenant alpha's pools ask for 3 nodes: gpu 1 and cpu 2 (as in the issue); no quota yet."""
    cpu = api("admin", "post", "/api/v1/pools/", {"tenant": "alpha", "name": "cpu", "provider": "metal3",
                                                  "quantity": 2, "node_type_selector": [
                                                      {"property": "vcluster.com/node-type", "value": "cpu-server"}]})
    assert cpu.status_code == 201, cpu.content
    return NodePool.objects.get(tenant=world.alpha, name="cpu")


def test_the_admin_lowering_a_quota_below_use_is_warned_and_it_is_saved(world, alpha_uses_3):
    admin = Client()
    admin.force_login(world.users["admin"])
    change = reverse("admin:pools_tenant_change", args=[world.alpha.pk])
    response = admin.post(change, {**form_data(admin.get(change)), "quota_nodes": "1"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert ("warning", WARNING.format(quota=1)) in messages_of(response)
    assert Tenant.objects.get(name="alpha").quota_nodes == 1
    assert NodePool.objects.get(pk=alpha_uses_3.pk).quantity == 2  # nothing released


def test_the_api_saves_a_quota_below_use_with_a_warning_and_a_warning_header(world, api, alpha_uses_3):
    response = api("admin", "patch", f"/api/v1/tenants/{world.alpha.pk}/", {"quota_nodes": 2})
    assert response.status_code == 200, response.content
    assert response.json()["warnings"] == [WARNING.format(quota=2)]
    assert response["Warning"] == f'299 - "{WARNING.format(quota=2)}"'
    fits = api("admin", "patch", f"/api/v1/tenants/{world.alpha.pk}/", {"quota_nodes": 3})
    assert fits.json()["warnings"] == [] and not fits.has_header("Warning")
    assert Tenant.objects.get(name="alpha").quota_nodes == 3


def test_apply_prints_a_warning_for_a_quota_below_use(world, apply, alpha_uses_3):
    vci = ("apiVersion: management.loft.sh/v1\nkind: VirtualClusterInstance\nmetadata:\n  name: alpha\n"
           "  namespace: p-default\n  annotations:\n    vmetal.dev/quota-nodes: \"1\"\nspec: {}\n")
    lines = apply(vci)
    assert f"Warning: {WARNING.format(quota=1)}" in lines, lines
    assert Tenant.objects.get(name="alpha").quota_nodes == 1
    assert not any(line.startswith("Warning") for line in apply(vci))  # said when the quota changes


def test_a_member_may_shrink_toward_a_lowered_quota_but_not_grow(world, api, alpha_uses_3):
    Tenant.objects.filter(name="alpha").update(quota_nodes=1)  # lowered from 3 while 3 are used
    cpu = f"/api/v1/pools/{alpha_uses_3.pk}/"
    grow = api("member_a", "patch", cpu, {"quantity": 3})
    assert grow.status_code == 400 and grow.json() == {"quantity": [REFUSED.format(total=4)]}
    # cpu 2 → 1 through the API: 2 in all, still above the quota, but closer to it.
    assert api("member_a", "patch", cpu, {"quantity": 1}).status_code == 200
    # gpu 1 → 0 through the console: 1 in all, within the quota.
    member = Client()
    member.force_login(world.users["member_a"])
    response = member.post(reverse("pool-quantity", args=["alpha", "gpu"]), {"quantity": 0})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert sorted(NodePool.objects.filter(tenant=world.alpha).values_list("name", "quantity")) == [
        ("cpu", 1), ("gpu", 0)]
    # Now within the quota, growing past it is refused as before.
    response = member.post(reverse("pool-quantity", args=["alpha", "gpu"]), {"quantity": 1})
    assert response.status_code == 400
    assert REFUSED.format(total=2) in response.content.decode()
    assert NodePool.objects.get(tenant=world.alpha, name="gpu").quantity == 0


def test_a_member_shrinks_through_the_console_from_above_the_quota(world, alpha_uses_3):
    Tenant.objects.filter(name="alpha").update(quota_nodes=1)
    member = Client()
    member.force_login(world.users["member_a"])
    response = member.post(reverse("pool-quantity", args=["alpha", "cpu"]), {"quantity": 1})
    assert response.status_code == 302, response.content.decode()[:2000]
    assert NodePool.objects.get(pk=alpha_uses_3.pk).quantity == 1
