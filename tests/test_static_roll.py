"""Static pools follow what their nodes are made from: a changed OS image (or OSImage, NodeType, labels, taints)
makes their serving claims Drifted, with what changed, and the roll replaces them within the pool's budgets:
a new node first where a host is free, else re-imaged in place; do-not-disrupt, closed windows, an image that
cannot be written and a failed replacement hold it, saying why. Claims are made Available in the database; the
tenant's pods and Nodes live in a lab tenant API (lab.kube.TenantAPIServer), read as in production."""
import datetime

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from autonodes import roll
from autonodes.models import PoolRoll
from claims.choices import ClaimPhase
from claims.drift import claim_drift
from claims.models import NodeClaim
from claims.reconcile import pools_reconcile
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodePool, NodeProvider, NodeType, OSImage, Tenant

from .test_autonodes_disruption import Tenants, make_available

pytestmark = pytest.mark.django_db

IMAGE = "vcluster.com/os-image"
SUM_A, SUM_B = "a" * 64, "b" * 64


class Site(Tenants):
    def image(self, name: str, checksum: str = SUM_A) -> OSImage:
        return OSImage.objects.create(name=name, url=f"http://images/{name}.raw", checksum=checksum,
                                      checksum_type="sha256")

    def static(self, tenant: Tenant, quantity: int = 3, budgets: list | None = None, **fields) -> NodePool:
        pool = NodePool(tenant=tenant, name="gpu", provider=self.provider, kind="static", quantity=quantity,
                        node_type_selector=[{"property": "vcluster.com/node-type", "value": "gpu-server"}],
                        disruption={"budgets": budgets} if budgets is not None else {}, **fields)
        pool.full_clean()
        pool.save()
        return pool

    def serving(self, pool: NodePool, count: int) -> list[NodeClaim]:
        """`count` Available claims of the pool, each written with the pool's image as it is now."""
        claims = []
        for _ in range(count):
            claim = self.node(pool)
            image = OSImage.objects.get(name=pool.properties[IMAGE])
            NodeClaim.objects.filter(pk=claim.pk).update(
                image={"name": image.name, "url": image.url, "checksum": image.checksum},
                node_type_properties=claim.node_type.effective_properties())
            claims.append(NodeClaim.objects.get(pk=claim.pk))
        return claims

    def free_host(self) -> BareMetalHost:
        self.hosts += 1
        return BareMetalHost.objects.create(name=f"free-{self.hosts:02d}", state="available",
                                            boot_mac=f"52:54:00:00:d3:{self.hosts:02x}",
                                            bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/free")


@pytest.fixture
def site():
    tenants = Site()
    tenants.image("ubuntu-2404")
    tenants.image("ubuntu-2604", SUM_B)
    yield tenants
    tenants.close()


def point_at(tenant: Tenant, image: str) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(provider_properties={"metal3": {IMAGE: image}})


def status(pool: NodePool) -> str:
    return PoolRoll.objects.get(pool=pool).status


def serving(pool: NodePool) -> int:
    return NodeClaim.objects.filter(pool=pool, phase=ClaimPhase.AVAILABLE).count()


def live(pool: NodePool) -> list[NodeClaim]:
    return list(NodeClaim.objects.filter(pool=pool).exclude(phase__in=["Released", "Releasing"]).order_by("pk"))


# -- what changed


def test_drift_says_what_changed_since_the_claim_was_made():
    provider = NodeProvider(name="metal3")
    gpu = NodeType(name="gpu-server", provider=provider, properties={"rdma": "yes"})
    tenant = Tenant(name="one", provider_properties={"metal3": {IMAGE: "ubuntu-b", "tier": "gold"}})
    pool = NodePool(tenant=tenant, provider=provider, name="gpu", kind="static", quantity=1,
                    node_type_selector=[{"property": "vcluster.com/node-type", "value": "gpu-server"}],
                    node_labels={"team": "ml", "workload": "train"}, taints=[{"key": "gpu", "effect": "NoSchedule"}])
    made = dict(properties={IMAGE: "ubuntu-a"}, node_labels={"workload": "serve", "old": "x"}, taints=[],
                node_type=gpu, node_type_properties={**gpu.effective_properties(), "rdma": "no"},
                image={"name": "ubuntu-b", "url": "http://i/b.raw", "checksum": SUM_A})
    images = {"ubuntu-b": OSImage(name="ubuntu-b", url="http://i/b.raw", checksum=SUM_B)}

    assert claim_drift(NodeClaim(**made), pool, images=images) == [
        "OS image ubuntu-a → ubuntu-b", "property tier=gold added", "OSImage ubuntu-b checksum changed",
        "labels: old removed", "labels: team=ml added", "labels: workload=serve → train",
        "taints: gpu:NoSchedule added", "NodeType gpu-server: rdma=no → yes"]
    # Made from what the pool makes now: nothing.
    same = NodeClaim(properties=pool.properties, node_labels=pool.node_labels, taints=pool.taints, node_type=gpu,
                     node_type_properties=gpu.effective_properties(),
                     image={"name": "ubuntu-b", "url": "http://i/b.raw", "checksum": SUM_B})
    assert claim_drift(same, pool, images=images) == []
    # A NodeType the selector no longer takes; an OSImage whose url moved.
    pool.node_type_selector = [{"property": "vcluster.com/node-type", "value": "cpu-server"}]
    images["ubuntu-b"].url = "http://i/b2.raw"
    assert claim_drift(same, pool, images=images) == [
        "OSImage ubuntu-b url changed", "the pool's nodeTypeSelector no longer matches gpu-server"]


# -- the roll


def test_a_pool_of_3_whose_image_changes_is_rolled_one_node_at_a_time_never_below_2(site, client, django_user_model):
    tenant = site.tenant("one")
    pool = site.static(tenant, budgets=[{"nodes": "1"}])
    old = site.serving(pool, 3)
    site.free_host()
    assert roll.pools_roll().tenants == []  # nothing drifted: its tenant API is not even read

    point_at(tenant, "ubuntu-2604")
    result = roll.pools_roll()

    # All three Drifted, with what changed; one replaced first (a host is free), the others wait for the budget.
    assert {c.drift for c in NodeClaim.objects.filter(pk__in=[c.pk for c in old])} == {
        "OS image ubuntu-2404 → ubuntu-2604"}
    (first, new), = result.replacing.items()
    new = NodeClaim.objects.get(name=new)
    assert first == old[0].name and new.replacement_of_id == old[0].pk and new.properties[IMAGE] == "ubuntu-2604"
    assert status(pool) == f"0 of 3 replaced, replacing {old[0].name}; next once one is Ready (budget 1 at once)"
    # One pass later nothing more, and the reconcile counts the pair once: nothing created, nothing released.
    assert not roll.pools_roll().replacing
    assert pools_reconcile(pool_ids=[pool.pk]).created == [] and len(live(pool)) == 4

    make_available(new, site)
    roll.pools_roll()
    # The old node goes once its replacement serves; no host is free now, so the next one is re-imaged in place.
    assert NodeClaim.objects.get(pk=old[0].pk).phase == "Releasing"
    second = NodeClaim.objects.get(pk=old[1].pk)
    assert (second.phase, second.release_purpose) == ("Releasing", "reimage")
    assert serving(pool) == 2  # quantity − 1, the budget
    assert pools_reconcile(pool_ids=[pool.pk]).created  # the pool makes its new node at once
    assert NodeClaim.objects.get(pk=old[2].pk).phase == "Available"
    roll.pools_roll()
    assert NodeClaim.objects.get(pk=old[2].pk).phase == "Available" and serving(pool) == 2  # one at a time
    assert status(pool) == "2 of 3 replaced, 1 node(s) not serving yet; next once one is Ready (budget 1 at once)"

    # The tenant page and the claims API show it.
    user = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(user)
    page = client.get(reverse("tenant", args=["one"])).content.decode()
    assert "Drift roll: 2 of 3 replaced" in page and 'data-drifted="OS image ubuntu-2404 → ubuntu-2604"' in page
    shown = client.get(f"/api/v1/claims/?tenant=one").json()
    rows = {c["name"]: c for c in shown.get("results", shown)}
    assert rows[old[2].name]["drift"] == "OS image ubuntu-2404 → ubuntu-2604" and rows[old[2].name]["drifted_since"]
    assert {"type": "Drifted", "status": "True"}.items() <= next(
        c for c in rows[old[2].name]["conditions"] if c["type"] == "Drifted").items()
    assert rows[new.name]["replacement_of"] == old[0].name and rows[new.name]["drift"] == ""


def test_a_closed_window_holds_the_roll_and_says_until_when(site):
    tenant = site.tenant("one")
    # No node of it is disrupted from 22:00 for 4 hours (a budget of 0 in force then), one at a time otherwise.
    pool = site.static(tenant, quantity=2, budgets=[{"nodes": "0", "schedule": "0 22 * * *", "duration": "4h"},
                                                    {"nodes": "1"}])
    old = site.serving(pool, 2)
    point_at(tenant, "ubuntu-2604")
    night = timezone.now().replace(hour=23, minute=0, second=0, microsecond=0)

    roll.pools_roll(now=night)
    assert status(pool) == "0 of 2 replaced; held: the budget's window is closed until 02:00"
    assert PoolRoll.objects.get(pool=pool).next_at == night.replace(hour=2) + datetime.timedelta(days=1)
    assert all(c.phase == "Available" for c in NodeClaim.objects.filter(pool=pool))
    held = Event.objects.filter(kind="decision", data__reason="Blocked").get()
    assert "window is closed until 02:00" in held.message
    roll.pools_roll(now=night)
    assert Event.objects.filter(kind="decision", data__reason="Blocked").count() == 1  # said once

    roll.pools_roll(now=night + datetime.timedelta(hours=4))  # 03:00: the window is over
    assert NodeClaim.objects.get(pk=old[0].pk).release_purpose == "reimage" and serving(pool) == 1


def test_do_not_disrupt_on_a_pod_or_on_the_node_holds_that_node(site):
    tenant = site.tenant("one")
    pool = site.static(tenant, quantity=2, budgets=[{"nodes": "100%"}])
    pinned, guarded = site.serving(pool, 2)
    site.pod("one", pinned, "precious", annotations={"karpenter.sh/do-not-disrupt": "true"})
    site.kubectl("one").create_node({"metadata": {"name": guarded.node_name,
                                                  "annotations": {"karpenter.sh/do-not-disrupt": "true"}}})
    point_at(tenant, "ubuntu-2604")

    roll.pools_roll()

    assert serving(pool) == 2 and NodeClaim.objects.filter(pool=pool).count() == 2
    assert status(pool) == (f"0 of 2 replaced; held: node {pinned.node_name} has karpenter.sh/do-not-disrupt "
                            f"(pod ml/precious)")
    site.delete_pod("one", "precious")
    roll.pools_roll()
    assert NodeClaim.objects.get(pk=pinned.pk).phase == "Releasing"
    assert NodeClaim.objects.get(pk=guarded.pk).phase == "Available"  # its Node still says no
    assert status(pool) == (f"1 of 2 replaced, re-imaging {pinned.name}; held: node {guarded.node_name} has "
                            "karpenter.sh/do-not-disrupt")


def test_a_failed_replacement_leaves_the_old_node_serving_and_says_why(site):
    tenant = site.tenant("one")
    pool = site.static(tenant, quantity=1, budgets=[{"nodes": "1"}])
    (old,) = site.serving(pool, 1)
    site.free_host()
    point_at(tenant, "ubuntu-2604")
    roll.pools_roll()
    new = NodeClaim.objects.get(replacement_of=old)
    NodeClaim.objects.filter(pk=new.pk).update(phase=ClaimPhase.FAILED, message="image write failed: 404")

    roll.pools_roll()
    roll.pools_roll()

    assert NodeClaim.objects.get(pk=old.pk).phase == "Available"
    assert NodeClaim.objects.get(pk=new.pk).phase in ("Released", "Releasing")  # given back, not kept Failed
    assert NodeClaim.objects.exclude(phase__in=["Released", "Releasing"]).count() == 1  # not made again yet
    assert status(pool).startswith(f"0 of 1 replaced; held: replacement {new.name} of {old.name} failed (image "
                                   f"write failed: 404); {old.name} keeps serving; tried again from ")


def test_a_node_that_did_not_come_back_from_its_re_image_holds_the_rest(site):
    tenant = site.tenant("one")
    pool = site.static(tenant, quantity=3, budgets=[{"nodes": "2"}])
    first, *rest = site.serving(pool, 3)
    point_at(tenant, "ubuntu-2604")
    NodeClaim.objects.filter(pk=first.pk).update(phase=ClaimPhase.FAILED, message="image write failed: 404")

    roll.pools_roll()

    assert all(NodeClaim.objects.get(pk=c.pk).phase == "Available" for c in rest)
    assert status(pool) == f"0 of 2 replaced; held: claim {first.name} is Failed (image write failed: 404)"


def test_an_image_that_cannot_be_written_replaces_nothing(site):
    tenant = site.tenant("one")
    pool = site.static(tenant, quantity=2, budgets=[{"nodes": "1"}])
    site.serving(pool, 2)
    point_at(tenant, "ubuntu-9999")

    roll.pools_roll()

    assert serving(pool) == 2 and NodeClaim.objects.filter(pool=pool).count() == 2
    assert status(pool) == ("0 of 2 replaced; held: OS image ubuntu-9999 not found: no node is replaced with an "
                            "image that cannot be written")


def test_a_changed_osimage_checksum_or_labels_drift_the_pools_nodes(site):
    tenant = site.tenant("one")
    pool = site.static(tenant, quantity=1, budgets=[{"nodes": "0"}])
    (claim,) = site.serving(pool, 1)
    OSImage.objects.filter(name="ubuntu-2404").update(checksum=SUM_B)
    NodePool.objects.filter(pk=pool.pk).update(node_labels={"team": "ml"})

    roll.pools_roll()

    claim.refresh_from_db()
    assert claim.drift == "OSImage ubuntu-2404 checksum changed; labels: team=ml added" and claim.drifted_since
    assert status(pool) == "0 of 1 replaced; held: budget 0 (Drifted)"
    NodeClaim.objects.filter(pk=claim.pk).update(node_labels={"team": "ml"},
                                                 image={**claim.image, "checksum": SUM_B})
    roll.pools_roll()  # made from what the pool makes now again: no longer Drifted, the roll is over
    claim.refresh_from_db()
    assert (claim.drift, claim.drifted_since) == ("", None) and status(pool) == "0 of 0 replaced"


# -- apply


def test_apply_says_a_pool_is_configured_when_its_image_property_changes(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    lines = apply(seed_block.replace("ubuntu2404-20260926", "ubuntu2604-20270101"), tenant="one")
    assert ('nodepool/one/gpu configured (properties: {"vcluster.com/os-image": "ubuntu2404-20260926"} → '
            '{"vcluster.com/os-image": "ubuntu2604-20270101"})') in lines
    assert any(line.startswith("nodepool/one/cpu configured") for line in lines)
    assert NodePool.objects.get(tenant__name="one", name="gpu").version == 2
    assert apply(seed_block.replace("ubuntu2404-20260926", "ubuntu2604-20270101"), tenant="one")[-2:] == [
        "nodepool/one/gpu unchanged", "nodepool/one/cpu unchanged"]


def test_apply_says_the_pools_whose_nodes_were_made_from_a_changed_osimage_or_node_type_are_configured(
        apply, demo_site, seed_block):
    from conftest import DEMO

    apply(seed_block, tenant="one")
    pools_reconcile()
    for claim in NodeClaim.objects.filter(pool__tenant__name="one", pool__name="gpu"):
        NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.AVAILABLE, available_at=timezone.now())
    site = (DEMO / "site.yaml").read_text()
    lines = apply(site.replace("3f1c0c3a2f1e", "4f1c0c3a2f1e"))
    assert "nodepool/one/gpu configured (its nodes were made from osimage/ubuntu2404-20260926, changed: they " \
           "drift)" in lines
    assert not [line for line in lines if line.startswith("nodepool/one/cpu")]  # no node of it serves yet
    # Applied with the pool's own document, unchanged: said once, as the change.
    lines = apply(site.replace("3f1c0c3a2f1e", "5f1c0c3a2f1e"), seed_block, tenant="one")
    assert [line for line in lines if line.startswith("nodepool/one/gpu")] == [
        "nodepool/one/gpu configured (its nodes were made from osimage/ubuntu2404-20260926, changed: they drift)"]
    assert "nodepool/one/cpu unchanged" in lines
    lines = apply(site.replace("3f1c0c3a2f1e", "5f1c0c3a2f1e"))  # nothing changed: no pool said
    assert "osimage/ubuntu2404-20260926 unchanged" in lines and not [line for line in lines if "nodepool" in line]


def test_a_static_pool_takes_disruption_budgets_only(apply, demo_site, seed_block):
    budgets = seed_block.replace("          quantity: 1\n", "          quantity: 1\n          disruption:\n"
                                 "            budgets:\n              - nodes: \"1\"\n", 1)
    apply(budgets, tenant="one")
    assert NodePool.objects.get(tenant__name="one", name="gpu").disruption == {"budgets": [{"nodes": "1"}]}
    with pytest.raises(Exception, match="consolidationPolicy"):
        call_command("apply", "-f", _write(budgets.replace("            budgets:", "            consolidationPolicy: "
                                                                                      "WhenEmpty\n            budgets:")),
                     "--tenant", "one")
    assert NodePool.objects.get(tenant__name="one", name="gpu").disruption == {"budgets": [{"nodes": "1"}]}


def _write(text: str) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    return f.name
