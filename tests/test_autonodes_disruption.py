"""Dynamic pools give nodes back (issue 12.3 and 7b): empty nodes after consolidateAfter, underutilized ones whose
pods fit elsewhere, expired and drifted ones replaced first; budgets, do-not-disrupt and the minimum lifetime keep
them. Claims of a dynamic pool are made Available in PostgreSQL; each tenant's pods live in a lab tenant API
(lab.kube.TenantAPIServer), read by the disruption pass through the kubernetes client as in production."""
import datetime

import pytest
import yaml
from django.core.management import CommandError
from django.utils import timezone
from kubernetes import client, config

from autonodes import disruption
from autonodes.models import NodeUsage
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from lab.kube import TenantAPIServer
from pools.models import NodePool, NodeProvider, NodeType, Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

GPU = {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8"}
CPU = {"cpu": "64", "memory": "512Gi"}
IMAGE = "vcluster.com/os-image"
LONG_AGO = datetime.timedelta(hours=2)


def later(seconds: float) -> datetime.datetime:
    """The pass's clock that many seconds from now (injected: the test does not wait for it)."""
    return timezone.now() + datetime.timedelta(seconds=seconds)


class Tenants:
    """Tenants with their own lab Kubernetes API, and what a test needs to fill them."""

    def __init__(self):
        self.servers: dict[str, TenantAPIServer] = {}
        self.apis: list = []
        self.provider = NodeProvider.objects.create(name="metal3")
        self.types = {"gpu-server": NodeType.objects.create(name="gpu-server", provider=self.provider, resources=GPU),
                      "cpu-server": NodeType.objects.create(name="cpu-server", provider=self.provider, resources=CPU)}
        self.hosts = 0

    def tenant(self, name: str) -> Tenant:
        server = self.servers[name] = TenantAPIServer(name).start()
        return Tenant.objects.create(name=name, kubeconfig=server.kubeconfig(),
                                     provider_properties={"metal3": {IMAGE: "ubuntu-2404"}})

    def kubectl(self, tenant: str) -> client.CoreV1Api:
        api = config.new_client_from_config_dict(yaml.safe_load(self.servers[tenant].kubeconfig()),
                                                 persist_config=False)
        self.apis.append(api)
        return client.CoreV1Api(api)

    def pool(self, tenant: Tenant, name: str = "burst", **fields) -> NodePool:
        fields.setdefault("disruption", {})
        pool = NodePool(tenant=tenant, name=name, provider=self.provider, kind="dynamic", **fields)
        pool.full_clean()
        pool.save()
        return pool

    def node(self, pool: NodePool, node_type: str = "gpu-server", *, age: datetime.timedelta = LONG_AGO,
             ready_for: datetime.timedelta | None = None) -> NodeClaim:
        """An Available claim of the pool with its host and node, created `age` ago and Ready for `ready_for`."""
        self.hosts += 1
        n = self.hosts
        host = BareMetalHost.objects.create(name=f"{node_type[:3]}-{n:02d}", state="provisioned",
                                            boot_mac=f"52:54:00:00:d1:{n:02x}",
                                            bmc_address=f"redfish+http://127.0.0.1:1/redfish/v1/Systems/{n}")
        now = timezone.now()
        claim = NodeClaim.objects.create(
            name=f"{pool.tenant.name}-n{n:02d}", tenant=pool.tenant, pool=pool, pool_name=pool.name,
            provider=self.provider, node_type=self.types[node_type], host=host, host_name=host.name,
            node_name=host.name, phase=ClaimPhase.AVAILABLE, properties=pool.properties,
            node_labels=pool.node_labels, taints=pool.taints)
        ready = now - (ready_for if ready_for is not None else age)
        NodeClaim.objects.filter(pk=claim.pk).update(created_at=now - age, available_at=ready, joined_at=ready,
                                                     phase_changed_at=ready)
        claim.refresh_from_db()
        return claim

    def pod(self, tenant: str, node: NodeClaim | None, name: str, gpus: int = 0, *, cpu: str = "1",
            annotations: dict | None = None, owner: str | None = "Job", namespace: str = "ml") -> dict:
        kubectl = self.kubectl(tenant)
        if namespace not in {ns.metadata.name for ns in kubectl.list_namespace().items}:
            kubectl.create_namespace({"metadata": {"name": namespace}})
        requests = {"cpu": cpu, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        meta = {"name": name, "namespace": namespace, "annotations": annotations or {}}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": owner, "name": f"{name}-owner", "uid": name,
                                        "controller": True}]
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node.node_name if node else None,
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "main", "image": "trainer", "resources": {"requests": requests}}]},
                "status": {"phase": "Running" if node else "Pending"}}
        return kubectl.create_namespaced_pod(namespace, body)

    def delete_pod(self, tenant: str, name: str, namespace: str = "ml") -> None:
        self.kubectl(tenant).delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    def close(self):
        for api in self.apis:
            api.close()
        for server in self.servers.values():
            server.stop()


@pytest.fixture
def site():
    tenants = Tenants()
    yield tenants
    tenants.close()


def phase(claim: NodeClaim) -> str:
    return NodeClaim.objects.get(pk=claim.pk).phase


def usage(claim: NodeClaim) -> NodeUsage:
    return NodeUsage.objects.get(claim=claim)


def decisions(reason: str | None = None):
    events = Event.objects.filter(kind="decision", object_type="pool").order_by("pk")
    return events.filter(data__reason=reason) if reason else events


def make_released(claim: NodeClaim) -> None:
    """The release finished (drain, delete, erase and gate done by the host's flow elsewhere)."""
    NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.RELEASED, host=None)


def make_available(claim: NodeClaim, site: Tenants) -> None:
    """A replacement claim got its host and its node joined."""
    site.hosts += 1
    host = BareMetalHost.objects.create(name=f"new-{site.hosts:02d}", state="provisioned",
                                        boot_mac=f"52:54:00:00:d2:{site.hosts:02x}",
                                        bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/new")
    NodeClaim.objects.filter(pk=claim.pk).update(phase=ClaimPhase.AVAILABLE, host=host, host_name=host.name,
                                                 node_name=host.name, available_at=timezone.now())


# -- empty nodes


def test_an_empty_node_is_released_after_consolidate_after_and_not_before(site):
    one = site.tenant("one")
    pool = site.pool(one, disruption={"consolidateAfter": "2s", "minNodeLifetime": "0s"})
    empty, busy = site.node(pool), site.node(pool)
    site.pod("one", busy, "train-0", gpus=8)
    # A DaemonSet's pod does not keep a node busy (as Karpenter counts).
    site.pod("one", empty, "kube-proxy-x", owner="DaemonSet", namespace="kube-system")

    first = disruption.pools_disrupt()

    assert first.released == {} and first.tenants == ["one"]
    assert phase(empty) == phase(busy) == "Available"
    seen = usage(empty)
    assert seen.pods == 0 and seen.empty_since is not None
    assert seen.next_action.startswith("empty since ") and "unless a pod arrives" in seen.next_action
    assert seen.next_action_at == seen.empty_since + datetime.timedelta(seconds=2)
    assert usage(busy).pods == 1 and usage(busy).empty_since is None
    assert usage(busy).requested == {"cpu": "1", "nvidia.com/gpu": "8"}

    second = disruption.pools_disrupt(now=later(2.2))

    assert second.released == {empty.name: "Empty"}
    assert phase(empty) == "Releasing" and phase(busy) == "Available"
    assert BareMetalHost.objects.get(pk=empty.host_id).state == "deprovisioning"  # drain → delete → erase → gate
    event = decisions("Empty").get()
    assert (event.object_name, event.tenant_id, event.claim_id) == ("burst", one.pk, empty.pk)
    assert event.data["claims"] == [empty.name] and event.data["nodes"] == [empty.node_name]
    assert event.data["pool"] == "burst" and "consolidateAfter 2s" in event.message
    assert NodeClaim.objects.get(pk=empty.pk).message == event.message


def test_a_pod_arriving_on_an_empty_node_starts_its_clock_again(site):
    one = site.tenant("one")
    pool = site.pool(one, disruption={"consolidateAfter": "2s", "minNodeLifetime": "0s"})
    node = site.node(pool)
    disruption.pools_disrupt()
    assert usage(node).empty_since is not None

    site.pod("one", node, "late", gpus=1)
    disruption.pools_disrupt(now=later(2.2))
    assert phase(node) == "Available" and usage(node).empty_since is None
    assert usage(node).next_action == "in use: 1 pod(s)"

    site.delete_pod("one", "late")
    disruption.pools_disrupt()
    assert phase(node) == "Available"  # empty again, but only just
    disruption.pools_disrupt(now=later(2.2))
    assert phase(node) == "Releasing"


def test_consolidate_after_never_keeps_empty_nodes(site):
    pool = site.pool(site.tenant("one"), disruption={"consolidateAfter": "Never", "minNodeLifetime": "0s"})
    node = site.node(pool)

    disruption.pools_disrupt()
    disruption.pools_disrupt()

    assert phase(node) == "Available"
    assert usage(node).next_action == "kept: consolidateAfter Never"
    assert not decisions().exists()


# -- budgets


def test_a_budget_of_zero_keeps_empty_nodes_and_says_so_once(site):
    pool = site.pool(site.tenant("one"), disruption={"consolidateAfter": "0s", "minNodeLifetime": "0s",
                                                     "budgets": [{"nodes": "0"}]})
    nodes = [site.node(pool), site.node(pool)]

    for _ in range(3):
        result = disruption.pools_disrupt()
        assert result.released == {}

    assert [phase(n) for n in nodes] == ["Available", "Available"]
    assert usage(nodes[0]).next_action == "kept: budget 0 (Empty)"
    blocked = decisions("Blocked").get()  # when the block starts, not on every pass
    assert blocked.data["claims"] == [n.name for n in nodes] and "budget 0" in blocked.message


def test_a_budget_of_one_releases_one_empty_node_at_a_time(site):
    pool = site.pool(site.tenant("one"), disruption={"consolidateAfter": "0s", "minNodeLifetime": "0s",
                                                     "budgets": [{"nodes": "1"}]})
    nodes = [site.node(pool) for _ in range(3)]

    def releasing():
        return sorted(n.name for n in nodes if phase(n) == "Releasing")

    disruption.pools_disrupt()
    first = releasing()
    assert len(first) == 1
    disruption.pools_disrupt()  # the first is still being released: it counts against the budget
    assert releasing() == first
    blocked = decisions("Blocked").get()
    assert "budget 1 allows 1 at once, 1 being disrupted" in blocked.message

    make_released(NodeClaim.objects.get(name=first[0]))
    disruption.pools_disrupt()
    second = releasing()
    assert len(second) == 1 and second != first
    assert decisions("Empty").count() == 2


def test_a_percentage_budget_is_rounded_up_and_the_default_is_ten_percent(site):
    one = site.tenant("one")
    half = site.pool(one, "half", disruption={"consolidateAfter": "0s", "minNodeLifetime": "0s",
                                              "budgets": [{"nodes": "50%"}]})
    default = site.pool(one, "default", disruption={"consolidateAfter": "0s", "minNodeLifetime": "0s"})
    halves = [site.node(half) for _ in range(3)]
    defaults = [site.node(default) for _ in range(3)]

    disruption.pools_disrupt()

    assert sum(phase(n) == "Releasing" for n in halves) == 2  # 50% of 3 = 1.5 → 2
    assert sum(phase(n) == "Releasing" for n in defaults) == 1  # 10% of 3 = 0.3 → 1
    kept = next(n for n in defaults if phase(n) == "Available")
    assert usage(kept).next_action.startswith("kept: the default budget 10% allows 1 at once")


def test_a_scheduled_budget_is_in_force_only_inside_its_window(site):
    at = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)  # a Tuesday
    office = {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"}
    assert disruption.budget_window(office, at) == (True, at.replace(hour=17))
    assert disruption.budget_window(office, at.replace(hour=17, minute=1)) == (False, None)
    assert disruption.budget_window(office, at.replace(hour=8, minute=59)) == (False, None)
    assert disruption.budget_window(office, at + datetime.timedelta(days=4)) == (False, None)  # Saturday
    assert disruption.budget_window({"nodes": "0", "schedule": "@daily", "duration": "1h"},
                                    at.replace(hour=0, minute=30)) == (True, at.replace(hour=1))
    assert disruption.budget_window({"nodes": "1"}, at) == (True, None)

    # Windows that overlap without end (every minute, for an hour): in force, no end to tell.
    assert disruption.budget_window({"nodes": "0", "schedule": "* * * * *", "duration": "1h"}, at) == (True, None)

    # In force now (it fired a minute ago, for 30 minutes): it keeps the node and says until when.
    fired = (timezone.now() - datetime.timedelta(minutes=1)).replace(second=0, microsecond=0)
    pool = site.pool(site.tenant("one"), disruption={
        "consolidateAfter": "0s", "minNodeLifetime": "0s",
        "budgets": [{"nodes": "0", "schedule": f"{fired.minute} * * * *", "duration": "30m", "reasons": ["Empty"]},
                    {"nodes": "0", "schedule": "0 0 1 1 *", "duration": "1m"}]})  # not in force
    node = site.node(pool)
    disruption.pools_disrupt()
    assert phase(node) == "Available"
    kept = usage(node)
    until = fired + datetime.timedelta(minutes=30)
    assert kept.next_action == f"kept: budget 0 in force until {until:%H:%M} (Empty)"
    assert kept.next_action_at == until


def test_a_budget_for_other_reasons_does_not_hold_empty_nodes(site):
    pool = site.pool(site.tenant("one"), disruption={"consolidateAfter": "0s", "minNodeLifetime": "0s",
                                                     "budgets": [{"nodes": "0", "reasons": ["Drifted"]}]})
    node = site.node(pool)
    disruption.pools_disrupt()
    assert phase(node) == "Releasing"


# -- do-not-disrupt and the minimum lifetime


def test_a_do_not_disrupt_pod_keeps_its_node(site):
    pool = site.pool(site.tenant("one"), expire_after="1h", disruption={
        "consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s", "minNodeLifetime": "0s"})
    guarded = site.node(pool)
    other = site.node(pool, age=datetime.timedelta(minutes=5))
    site.pod("one", guarded, "precious", gpus=2, annotations={"karpenter.sh/do-not-disrupt": "true"})
    site.pod("one", other, "small", gpus=2)

    disruption.pools_disrupt()
    disruption.pools_disrupt()

    # Expired and underutilized (its pod fits on the other node), yet kept, and no replacement made.
    assert phase(guarded) == "Available" and usage(guarded).do_not_disrupt
    assert usage(guarded).next_action == "kept: pod ml/precious has do-not-disrupt"
    assert NodeClaim.objects.count() == 2
    blocked = decisions("Blocked").get()
    assert blocked.data["claims"] == [guarded.name] and "do-not-disrupt" in blocked.message
    # The other one is not: its pod fits on the guarded node, so it goes.
    assert phase(other) == "Releasing"
    assert decisions("Underutilized").get().data["claims"] == [other.name]


def test_a_node_younger_than_the_minimum_lifetime_is_kept_until_then(site):
    pool = site.pool(site.tenant("one"), disruption={"consolidateAfter": "0s", "minNodeLifetime": "1h"})
    young = site.node(pool, age=datetime.timedelta(minutes=20), ready_for=datetime.timedelta(minutes=10))
    old = site.node(pool, ready_for=datetime.timedelta(minutes=61))

    disruption.pools_disrupt()
    disruption.pools_disrupt()

    assert phase(young) == "Available" and phase(old) == "Releasing"
    kept = usage(young)
    assert kept.next_action.startswith("kept: younger than the minimum lifetime (until ")
    assert kept.next_action_at == NodeClaim.objects.get(pk=young.pk).available_at + datetime.timedelta(hours=1)
    assert decisions("Blocked").get().data["claims"] == [young.name]


def test_defaults_for_bare_metal_gpu_servers_wait_longer_than_cpu_servers(site):
    pool = site.pool(site.tenant("one"))  # nothing written: WhenEmpty, 30m for GPU types, 10m for CPU ones
    gpu, cpu = site.node(pool, "gpu-server"), site.node(pool, "cpu-server")
    young = site.node(pool, "cpu-server", age=datetime.timedelta(minutes=5))

    disruption.pools_disrupt()

    for node, after in ((gpu, 30), (cpu, 10)):
        seen = usage(node)
        assert seen.next_action_at == seen.empty_since + datetime.timedelta(minutes=after)
    # A node that became Ready 5 minutes ago waits for the default minimum lifetime (30m) instead.
    assert usage(young).next_action_at == NodeClaim.objects.get(pk=young.pk).available_at + datetime.timedelta(minutes=30)
    assert usage(young).next_action.endswith("unless a pod arrives (minimum lifetime)")
    assert disruption.consolidation_policy(pool) == "WhenEmpty"


# -- underutilized


def test_two_half_used_nodes_whose_pods_fit_on_one_give_one_back(site):
    pool = site.pool(site.tenant("one"), disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                                     "consolidateAfter": "0s", "minNodeLifetime": "0s"})
    a, b = site.node(pool), site.node(pool)
    for i in range(2):
        site.pod("one", a, f"a-{i}", gpus=2)
    site.pod("one", b, "b-0", gpus=4)

    result = disruption.pools_disrupt()

    assert sorted(result.released.values()) == ["Underutilized"]
    gone = a if phase(a) == "Releasing" else b
    kept = b if gone is a else a
    assert phase(kept) == "Available"  # the one that takes the pods stays, in the same pass
    event = decisions("Underutilized").get()
    assert event.data["claims"] == [gone.name]
    assert event.data["moves"] and set(event.data["moves"].values()) == {kept.node_name}
    assert event.data["pods"] == sorted(event.data["moves"])
    disruption.pools_disrupt()
    assert phase(kept) == "Available"


def test_pods_that_do_not_fit_elsewhere_keep_their_nodes_and_when_empty_ignores_underutilized(site):
    one = site.tenant("one")
    pool = site.pool(one, disruption={"consolidationPolicy": "WhenEmptyOrUnderutilized",
                                      "consolidateAfter": "0s", "minNodeLifetime": "0s"})
    a, b = site.node(pool), site.node(pool)
    site.pod("one", a, "big-a", gpus=6)
    site.pod("one", b, "big-b", gpus=6)
    when_empty = site.pool(one, "steady", disruption={"consolidateAfter": "0s", "minNodeLifetime": "0s"})
    c, d = site.node(when_empty), site.node(when_empty)
    site.pod("one", c, "small-c", gpus=1)
    site.pod("one", d, "small-d", gpus=1)

    disruption.pools_disrupt()

    assert {phase(n) for n in (a, b, c, d)} == {"Available"}
    assert usage(a).next_action == "in use: 1 pod(s); they do not fit on the pool's other nodes"
    assert usage(c).next_action == "in use: 1 pod(s)"
    assert not decisions().exists()


# -- expiry and drift: a replacement first


def test_an_expired_node_is_replaced_first_and_released_once_the_replacement_is_available(site):
    pool = site.pool(site.tenant("one"), expire_after="1h", disruption={"consolidateAfter": "Never"})
    old = site.node(pool, age=datetime.timedelta(hours=2))
    site.pod("one", old, "train-0", gpus=8)

    result = disruption.pools_disrupt()

    new = NodeClaim.objects.exclude(pk=old.pk).get()
    assert result.replacing == {old.name: new.name}
    assert (new.phase, new.pool_id, new.node_type.name) == ("Pending", pool.pk, "gpu-server")
    assert {"property": "vcluster.com/node-type", "operator": "In", "values": ["gpu-server"]} in new.requirements
    assert phase(old) == "Available" and usage(old).replacement_id == new.pk
    started = decisions("Expired").get()
    assert started.data["replacement"] == new.name and started.data["pods"] == ["ml/train-0"]
    assert "older than expireAfter 1h" in started.message

    NodeClaim.objects.filter(pk=new.pk).update(phase=ClaimPhase.PROVISIONING)
    disruption.pools_disrupt()
    assert phase(old) == "Available" and NodeClaim.objects.count() == 2  # one replacement, not one per pass
    assert "released once it is Ready" in usage(old).next_action

    make_available(new, site)
    disruption.pools_disrupt()
    assert phase(old) == "Releasing" and phase(new) == "Available"
    done = decisions("Expired").last()
    assert done.pk != started.pk and f"its replacement {new.name} is Ready" in done.message


def test_a_failed_replacement_keeps_the_node_and_is_not_made_again_on_every_pass(site):
    pool = site.pool(site.tenant("one"), expire_after="1h", disruption={"consolidateAfter": "Never"})
    old = site.node(pool)
    site.pod("one", old, "train-0", gpus=8)
    disruption.pools_disrupt()
    first = NodeClaim.objects.exclude(pk=old.pk).get()
    NodeClaim.objects.filter(pk=first.pk).update(phase=ClaimPhase.FAILED)

    disruption.pools_disrupt()
    disruption.pools_disrupt()

    assert phase(old) == "Available" and NodeClaim.objects.count() == 2  # no second replacement yet
    kept = usage(old)
    assert kept.replacement is None and kept.next_action.startswith("kept: its last replacement failed; replaced again")
    assert datetime.timedelta(minutes=29) < kept.next_action_at - timezone.now() <= datetime.timedelta(minutes=30)
    assert "is Failed" in decisions("Expired").last().message
    assert not decisions("Blocked").exists()


def test_a_drifted_node_is_replaced_and_an_empty_expired_one_just_released(site):
    one = site.tenant("one")
    pool = site.pool(one, expire_after="1h", disruption={"consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]})
    busy = site.node(pool, age=datetime.timedelta(minutes=30))
    site.pod("one", busy, "train-0", gpus=8)
    idle = site.node(pool, age=datetime.timedelta(hours=3))
    one.provider_properties = {"metal3": {IMAGE: "ubuntu-2604"}}  # a new OS image for the pool
    one.save()

    disruption.pools_disrupt()

    assert phase(idle) == "Releasing"  # expired and empty: nothing to move, no replacement
    assert "no replacement" in decisions("Expired").get().message
    new = NodeClaim.objects.exclude(pk__in=[busy.pk, idle.pk]).get()
    assert new.properties == {IMAGE: "ubuntu-2604"} and phase(busy) == "Available"
    drifted = decisions("Drifted").get()
    assert "OS image ubuntu-2404 → ubuntu-2604" in drifted.message and drifted.data["replacement"] == new.name

    make_available(new, site)
    disruption.pools_disrupt()
    assert phase(busy) == "Releasing"


# -- a replacement within the pool's limits and the tenant's quota


def live_claims(pool: NodePool) -> int:
    return NodeClaim.objects.filter(pool=pool).exclude(phase__in=["Released", "Failed"]).count()


def test_an_expired_node_at_the_node_limit_is_released_without_a_replacement_first(site):
    pool = site.pool(site.tenant("one"), expire_after="1h", limits={"nodes": "2"},
                     disruption={"consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]})
    old = site.node(pool, age=datetime.timedelta(hours=2))
    young = site.node(pool, age=datetime.timedelta(minutes=30))
    site.pod("one", old, "train-0", gpus=8)
    site.pod("one", young, "train-1", gpus=8)

    result = disruption.pools_disrupt()

    assert result.released == {old.name: "Expired"} and result.replacing == {}
    assert phase(old) == "Releasing" and NodeClaim.objects.count() == 2  # no replacement: 3 would pass the limit
    expired = decisions("Expired").get()
    assert expired.message == (f"released {old.name}: expired: older than expireAfter 1h; no replacement first: "
                               "a replacement would pass limit nodes 2 (2 of 2)")
    assert expired.data["pods"] == ["ml/train-0"]

    for _ in range(2):  # the releasing node still counts until it is gone: nothing is added meanwhile
        disruption.pools_disrupt()
        assert live_claims(pool) <= 2
    assert NodeClaim.objects.count() == 2 and phase(young) == "Available"


def test_a_drifted_node_at_the_node_limit_is_kept_saying_why_and_replaced_once_there_is_room(site):
    one = site.tenant("one")
    pool = site.pool(one, limits={"nodes": "1"}, disruption={"consolidateAfter": "Never"})
    busy = site.node(pool)
    site.pod("one", busy, "train-0", gpus=8)
    one.provider_properties = {"metal3": {IMAGE: "ubuntu-2604"}}
    one.save()

    result = disruption.pools_disrupt()
    disruption.pools_disrupt()  # the next pass looks again, and says nothing new

    kept = ("kept: drifted (OS image ubuntu-2404 → ubuntu-2604), but a replacement would pass limit nodes 1 "
            "(1 of 1)")
    assert result.blocked == {busy.name: kept} and result.replacing == {}
    assert NodeClaim.objects.count() == 1 and phase(busy) == "Available"
    assert usage(busy).next_action == kept and usage(busy).replacement is None
    assert decisions("Blocked").get().message == f"{busy.name} {kept}"
    assert not decisions("Drifted").exists()

    pool.limits = {"nodes": "2"}
    pool.save()
    result = disruption.pools_disrupt()

    new = NodeClaim.objects.exclude(pk=busy.pk).get()
    assert result.replacing == {busy.name: new.name} and usage(busy).replacement_id == new.pk
    assert decisions("Drifted").get().data["replacement"] == new.name


def test_a_drifted_node_is_kept_when_a_replacement_would_pass_a_resource_limit(site):
    one = site.tenant("one")
    pool = site.pool(one, limits={"nvidia.com/gpu": "8"}, disruption={"consolidateAfter": "Never"})
    busy = site.node(pool)
    site.pod("one", busy, "train-0", gpus=8)
    one.provider_properties = {"metal3": {IMAGE: "ubuntu-2604"}}
    one.save()

    disruption.pools_disrupt()

    assert NodeClaim.objects.count() == 1
    assert usage(busy).next_action.endswith("but a replacement would pass limit nvidia.com/gpu 8 (8 of 8)")


def test_a_drifted_node_at_the_tenant_quota_is_kept_and_no_claim_is_added(site):
    one = site.tenant("one")
    pool = site.pool(one, disruption={"consolidateAfter": "Never"})
    busy = site.node(pool)
    site.pod("one", busy, "train-0", gpus=8)
    Tenant.objects.filter(pk=one.pk).update(quota_nodes=1, provider_properties={"metal3": {IMAGE: "ubuntu-2604"}})

    result = disruption.pools_disrupt()

    assert result.replacing == {} and NodeClaim.objects.count() == 1 and phase(busy) == "Available"
    assert usage(busy).next_action == ("kept: drifted (OS image ubuntu-2404 → ubuntu-2604), but a replacement would "
                                       "pass the tenant's node quota 1 (1 of 1)")


def test_with_room_an_expired_node_is_still_replaced_first_and_replacements_count_against_the_limit(site):
    pool = site.pool(site.tenant("one"), expire_after="1h", limits={"nodes": "3"},
                     disruption={"consolidateAfter": "Never", "budgets": [{"nodes": "100%"}]})
    first = site.node(pool, age=datetime.timedelta(hours=3))
    second = site.node(pool, age=datetime.timedelta(hours=2))
    site.pod("one", first, "train-0", gpus=8)
    site.pod("one", second, "train-1", gpus=8)

    result = disruption.pools_disrupt()

    new = NodeClaim.objects.exclude(pk__in=[first.pk, second.pk]).get()
    assert result.replacing == {first.name: new.name} and phase(first) == "Available"  # room for one: replaced
    assert result.released == {second.name: "Expired"}  # the replacement took the last seat: released
    assert "would pass limit nodes 3 (3 of 3)" in decisions("Expired").get(claim=second).message
    assert live_claims(pool) == 3


# -- faults


def test_a_tenant_whose_api_is_down_is_skipped_and_another_tenants_node_still_released(site):
    one, two = site.tenant("one"), site.tenant("two")
    settings = {"consolidateAfter": "0s", "minNodeLifetime": "0s"}
    down = site.node(site.pool(one, disruption=settings))
    up = site.node(site.pool(two, disruption=settings))
    site.servers["one"].stop()

    result = disruption.pools_disrupt()

    assert "tenant API unreachable" in result.skipped["one"]
    assert result.released == {up.name: "Empty"}
    assert phase(down) == "Available" and phase(up) == "Releasing"
    assert not NodeUsage.objects.filter(claim=down).exists()  # nothing is known of its pods


# -- Celery beat runs the pass


@pytest.fixture
def worker_settings() -> dict:
    return {"WITH_BEAT": "1", "AUTONODES_DISRUPT_EVERY_S": "1"}


@pytest.mark.django_db(transaction=True)
def test_celery_beat_runs_the_pass_and_the_worker_releases_the_empty_node(site, celery_worker_process):
    from conftest import wait_for

    pool = site.pool(site.tenant("one"), disruption={"consolidateAfter": "1s", "minNodeLifetime": "0s"})
    empty, busy = site.node(pool), site.node(pool)
    site.pod("one", busy, "train-0", gpus=8)

    wait_for(lambda: phase(empty) == "Releasing", timeout=30)

    event = decisions("Empty").get()
    assert event.actor == "system:disruption" and event.data["claims"] == [empty.name]
    assert phase(busy) == "Available" and usage(busy).pods == 1
    assert "autonodes.tasks.disrupt" in celery_worker_process.log.read_text()


# -- validation: apply refuses what the pass could not read


POOL = """\
privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      dynamic:
        - name: burst
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          limits:
            nodes: "4"
          disruption:
{disruption}
"""


def indent(text: str) -> str:
    return "\n".join("            " + line for line in text.splitlines())


def test_apply_takes_min_node_lifetime_and_budgets_and_exports_them_back(apply, demo_site):
    from django.core.management import call_command

    apply("apiVersion: management.loft.sh/v1\nkind: VirtualClusterInstance\nmetadata:\n  name: one\nspec: {}\n")
    written = ("consolidationPolicy: WhenEmptyOrUnderutilized\nconsolidateAfter: 30m\nminNodeLifetime: 1h\n"
               "budgets:\n  - nodes: \"20%\"\n  - nodes: \"0\"\n    schedule: \"0 9 * * mon-fri\"\n    duration: 8h\n"
               "    reasons: [Underutilized, Drifted]\n")
    apply(POOL.format(disruption=indent(written)), tenant="one")
    pool = NodePool.objects.get(tenant__name="one", name="burst")
    assert pool.disruption["minNodeLifetime"] == "1h"
    assert disruption.min_node_lifetime(pool) == datetime.timedelta(hours=1)

    import io
    out = io.StringIO()
    call_command("export", stdout=out)
    assert "minNodeLifetime: 1h" in out.getvalue() and "schedule: 0 9 * * mon-fri" in out.getvalue()


@pytest.mark.parametrize(("written", "error"), [
    ('budgets:\n  - nodes: "0"\n    schedule: "0 25 * * *"\n    duration: 8h\n',
     "disruption.budgets[0].schedule: '0 25 * * *' is not a cron schedule"),
    ('budgets:\n  - nodes: "0"\n    schedule: "every day"\n    duration: 8h\n', "is not a cron schedule: five fields"),
    ('budgets:\n  - nodes: "0"\n    schedule: "@daily"\n', "schedule and duration go together"),
    ('budgets:\n  - nodes: "0"\n    reasons: [Emptied]\n', "reasons: each one of Empty, Underutilized, Drifted, Expired"),
    ('budgets:\n  - nodes: "120%"\n', "must be a count or a percentage"),
    ("minNodeLifetime: soon\n", "is not a duration"),
])
def test_apply_refuses_a_budget_or_lifetime_it_cannot_read(apply, demo_site, written, error):
    apply("apiVersion: management.loft.sh/v1\nkind: VirtualClusterInstance\nmetadata:\n  name: one\nspec: {}\n")
    with pytest.raises(CommandError) as refused:
        apply(POOL.format(disruption=indent(written)), tenant="one")
    assert error in str(refused.value)
    assert not NodePool.objects.filter(name="burst").exists()


def test_an_all_or_nothing_group_is_released_whole_once_every_member_is_empty_and_never_one_member_alone(site):
    from claims.models import ClaimGroup

    one = site.tenant("one")
    pool = site.pool(one, group={"size": 2}, disruption={"consolidateAfter": "1s", "minNodeLifetime": "0s",
                                                         "consolidationPolicy": "WhenEmptyOrUnderutilized"})
    group = ClaimGroup.objects.create(name="one-gabcde", tenant=one, pool=pool, pool_name=pool.name, size=2,
                                      shares=["rail_group"], on_member_failure="Replace", rail_group="r1",
                                      placed_at=timezone.now())
    empty, busy = site.node(pool), site.node(pool)
    alone = site.node(pool)  # an empty node of no group, for comparison
    NodeClaim.objects.filter(pk__in=[empty.pk, busy.pk]).update(group=group)
    site.pod("one", busy, "train-0", gpus=1)  # underutilized: would fit on `empty`

    disruption.pools_disrupt()
    result = disruption.pools_disrupt(now=later(1.2))

    assert result.released == {alone.name: "Empty"}  # the group's empty member is kept with its group
    assert phase(empty) == phase(busy) == "Available"
    assert usage(empty).next_action == ("member of group one-gabcde: released only with the whole group, once "
                                        "every member is empty (1 of 2 empty)")
    assert usage(busy).next_action == usage(empty).next_action  # not consolidated onto its peer either

    site.delete_pod("one", "train-0")
    disruption.pools_disrupt()  # busy is empty from now
    assert phase(busy) == "Available" and "released whole at" in usage(busy).next_action
    result = disruption.pools_disrupt(now=later(1.2))
    # The default budget (10%: 1 node of 3 at once) cannot take a group of 2: kept whole, and it says so.
    assert result.released == {} and phase(empty) == phase(busy) == "Available"
    assert usage(busy).next_action == ("kept: group one-gabcde needs 2 disruptions at once; the budget allows 0 "
                                       "now (Empty)")
    NodePool.objects.filter(pk=pool.pk).update(disruption={**pool.disruption, "budgets": [{"nodes": "100%"}]})
    result = disruption.pools_disrupt(now=later(1.2))
    assert result.released == {empty.name: "Empty", busy.name: "Empty"}
    assert phase(empty) == phase(busy) == "Releasing"
    [event] = [e for e in decisions("Empty") if e.data.get("group") == "one-gabcde"]
    assert sorted(event.data["claims"]) == sorted([empty.name, busy.name])
    assert event.message.startswith("released group one-gabcde whole (2 nodes: ")
