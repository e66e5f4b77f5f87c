"""All-or-nothing in dynamic pools (issue 14, point 5): a pool with `group.size` N gets new nodes only as whole
groups of N on one rail group (claim_group_create, one decision Event naming the group), a group that would pass a
limit or finds no rail group with room is not asked for and its pods say why; pods of one gang (a coscheduling
PodGroup) get room all together or not at all."""
import uuid

import pytest

from autonodes.choices import DecisionReason, DemandStatus
from autonodes.demand import pod_fields, pod_gang
from autonodes.models import PendingPod
from autonodes.selectors import pending_pods_shown, pod_state
from autonodes.services import tenant_decide
from claims.models import ClaimGroup, NodeClaim
from claims.reconcile import pools_reconcile
from events.choices import EventKind
from events.models import Event
from hosts.models import BareMetalHost
from hosts.topology import RAIL_GROUP_LABEL, host_topology
from pools.models import NodePool, Tenant

pytestmark = pytest.mark.postgres

GROUPS = """\
privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      dynamic:
        - name: burst
          nodeTypeSelector:
            - property: vcluster.com/node-type
              operator: In
              values: [gpu-server, cpu-server]
          nodeLabels:
            pool: burst
          limits:
            nodes: "{nodes}"
{extra}"""


@pytest.fixture
def rails(demo_site):
    """The demo's GPU hosts on rail groups: r1 has 3 free (gpu-01..03), r2 has 2 (gpu-04 and gpu-05)."""
    gpu = list(BareMetalHost.objects.filter(labels__role="gpu").order_by("name"))
    assert len(gpu) == 4
    extra = BareMetalHost(name="gpu-05", labels={**gpu[3].labels}, state="available",
                          bmc_address="redfish://10.9.0.5/redfish/v1/Systems/1", boot_mac="52:54:09:00:00:05")
    extra.save()
    for host, rail in zip([*gpu, extra], ["r1", "r1", "r1", "r2", "r2"]):
        BareMetalHost.objects.filter(pk=host.pk).update(labels={**host.labels, RAIL_GROUP_LABEL: rail})


def pool_yaml(nodes: int = 8, group: str = "", gang: bool = False) -> str:
    extra = ""
    if group:
        extra = f"          group: {group}\n"
    return GROUPS.format(nodes=nodes, extra=extra)


@pytest.fixture
def two(apply, rails):
    def make(nodes: int = 8, group: str = "{size: 2}") -> Tenant:
        apply(pool_yaml(nodes, group), tenant="two")
        return Tenant.objects.get(name="two")
    return make


def pending(tenant, name, *, gang: str = "", min_member: int | None = None, gpus: str = "8", namespace="ml"):
    return PendingPod.objects.create(tenant=tenant, namespace=namespace, name=name, uid=str(uuid.uuid4()),
                                     owner="Job/train-7", gang=gang, gang_min_member=min_member,
                                     requests={"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": gpus})


def decisions(tenant, **data):
    events = Event.objects.filter(kind=EventKind.DECISION, tenant_id=tenant.pk).order_by("pk")
    return [e for e in events if all(e.data.get(k) == v for k, v in data.items())]


@pytest.mark.django_db
def test_a_pool_of_groups_of_2_gets_3_pods_as_two_whole_groups_each_named_by_one_decision(two, admin_client):
    tenant = two(nodes=8, group="{size: 2}")
    pods = [pending(tenant, f"train-7-{i}") for i in range(3)]
    result = tenant_decide(tenant_id=tenant.pk)
    groups = list(ClaimGroup.objects.order_by("pk"))
    assert len(groups) == 2 and [g.size for g in groups] == [2, 2]
    claims = list(NodeClaim.objects.all())
    assert len(claims) == 4 and all(c.group_id for c in claims)  # never a single claim: a member without pods too
    assert {c.node_type.name for c in claims} == {"gpu-server"}
    assert sorted(result.groups) == sorted(g.name for g in groups)
    launches = decisions(tenant, reason=DecisionReason.LAUNCHED)
    assert [e.data["group"] for e in launches] == [g.name for g in groups]
    assert [e.data["size"] for e in launches] == [2, 2]
    # Best fit, as the allocator: the first group on the 2-host rail, the next on the 3-host one.
    assert [e.data["domain"] for e in launches] == ["rail r2", "rail r1"]
    assert launches[0].message == (f"added a group of 2 gpu-server for Job/train-7: 2 pods × 8 nvidia.com/gpu "
                                   f"(all or nothing on rail r2): group {groups[0].name}")
    assert sorted(p for e in launches for p in e.data["pods"]) == sorted(f"ml/{p.name}" for p in pods)
    assert {p.status for p in PendingPod.objects.all()} == {DemandStatus.LAUNCHED}
    assert {p.claim.group_id for p in PendingPod.objects.select_related("claim")} == {g.pk for g in groups}
    api = admin_client.get("/api/v1/decisions/").json()["results"]
    assert sorted(d["group"] for d in api if d["reason"] == DecisionReason.LAUNCHED) == sorted(g.name for g in groups)
    # The allocator places each group whole on its rail group.
    pools_reconcile(pool_ids=[NodePool.objects.get(name="burst").pk])
    for group in ClaimGroup.objects.all():
        hosts = [c.host for c in group.members.select_related("host")]
        assert all(hosts) and len({host_topology(h.labels).rail_group for h in hosts}) == 1
    # The same demand again: nothing more is asked for.
    tenant_decide(tenant_id=tenant.pk)
    assert ClaimGroup.objects.count() == 2 and NodeClaim.objects.count() == 4


@pytest.mark.django_db
def test_a_group_that_would_pass_the_pools_limit_is_not_asked_for_and_its_pods_say_so(two):
    tenant = two(nodes=3, group="{size: 2}")
    for i in range(3):
        pending(tenant, f"train-7-{i}")
    tenant_decide(tenant_id=tenant.pk)
    assert ClaimGroup.objects.count() == 1 and NodeClaim.objects.count() == 2  # 1 + a group of 2 would be 4 > 3
    [waiting] = PendingPod.objects.filter(status=DemandStatus.WAITING)
    assert waiting.reason == "not added: a group of 2 would pass limit nodes 3 (1 left)"
    assert decisions(tenant, reason=DecisionReason.LIMIT)


@pytest.mark.django_db
def test_a_group_no_rail_group_can_hold_waits_with_the_reason_shown_to_the_pods_instead_of_no_capacity(
        two, admin_client):
    tenant = two(nodes=8, group="{size: 4}")
    for i in range(2):
        pending(tenant, f"train-7-{i}")
    tenant_decide(tenant_id=tenant.pk)
    assert not NodeClaim.objects.exists() and not ClaimGroup.objects.exists()  # nothing asked, nothing held
    why = "not added: needs 4 on one rail group; largest free group has 3 (rail r1)"
    assert set(PendingPod.objects.values_list("status", "reason")) == {(DemandStatus.WAITING, why)}
    [event] = decisions(tenant, reason=DecisionReason.NO_CAPACITY)
    assert event.message.startswith(why) and len(event.data["pods"]) == 2
    pool = NodePool.objects.get(name="burst")
    body = admin_client.get(f"/api/v1/pools/{pool.pk}/status/").json()
    assert {(p["state"], p["reason"]) for p in body["demand"]} == {("waiting", why)}
    assert why in admin_client.get(f"/tenants/two/pools/{pool.name}/").content.decode()


@pytest.mark.django_db
def test_a_group_the_allocator_cannot_place_after_all_holds_no_host_and_its_pods_show_the_groups_reason(two):
    tenant = two(nodes=8, group="{size: 2}")
    pending(tenant, "train-7-0")
    tenant_decide(tenant_id=tenant.pk)
    [group] = ClaimGroup.objects.all()
    # Meanwhile one host of rail r2 (where the decision expected the group) and two of r1 were taken.
    BareMetalHost.objects.filter(name__in=["gpu-01", "gpu-02", "gpu-04"]).update(state="maintenance")
    pools_reconcile(pool_ids=[group.pool_id])
    group.refresh_from_db()
    assert group.placed_at is None and not group.members.filter(host__isnull=False).exists()
    why = "needs 2 on one rail group; largest free group has 1 (rail r2)"
    assert group.message == why
    [pod] = pending_pods_shown(PendingPod.objects.all())
    state = pod_state(pod)
    assert state.key == "waiting" and why in state.detail and group.name in state.detail


@pytest.mark.django_db
def test_a_pool_kept_on_one_rail_group_launches_only_what_that_rail_group_has_free(apply, rails):
    apply(pool_yaml(8, "") + "          topology: {sameRailGroup: true}\n", tenant="two")
    tenant = Tenant.objects.get(name="two")
    for i in range(4):
        pending(tenant, f"train-7-{i}")
    tenant_decide(tenant_id=tenant.pk)
    assert NodeClaim.objects.count() == 3 and not ClaimGroup.objects.exists()  # rail r1 has 3 free
    [waiting] = PendingPod.objects.filter(status=DemandStatus.WAITING)
    assert waiting.reason == ("not added: no free host of type gpu-server; pool burst keeps its nodes on one rail "
                              "group (rail r1)")
    pools_reconcile(pool_ids=[NodePool.objects.get(name="burst").pk])
    assert {host_topology(c.host.labels).rail_group for c in NodeClaim.objects.select_related("host")} == {"r1"}


@pytest.mark.django_db
def test_a_gang_of_4_gets_room_for_all_4_or_for_none(two):
    tenant = two(nodes=3, group="{}")
    for i in range(4):
        pending(tenant, f"train-7-{i}", gang="ml/train-7", min_member=4)
    tenant_decide(tenant_id=tenant.pk)
    assert not NodeClaim.objects.exists()  # 3 nodes would be allowed: the gang needs 4, so none
    reasons = set(PendingPod.objects.values_list("status", "reason"))
    assert len(reasons) == 1
    status, reason = reasons.pop()
    assert status == DemandStatus.WAITING
    assert reason.startswith("gang ml/train-7: its 4 pods are added together or not at all; pod ml/train-7-")
    assert reason.endswith("finds no room: not added: limit nodes 3 reached")
    # The limit raised to 4: all four together.
    NodePool.objects.filter(name="burst").update(limits={"nodes": "4"})
    tenant_decide(tenant_id=tenant.pk)
    assert NodeClaim.objects.count() == 4
    assert set(PendingPod.objects.values_list("status", flat=True)) == {DemandStatus.LAUNCHED}


@pytest.mark.django_db
def test_pods_of_a_gang_beyond_its_min_member_are_placed_alone(two):
    tenant = two(nodes=2, group="{}")
    for i in range(3):
        pending(tenant, f"train-7-{i}", gang="ml/train-7", min_member=2)
    pending(tenant, "other-0", gpus="8")
    tenant_decide(tenant_id=tenant.pk)
    launched = set(PendingPod.objects.filter(status=DemandStatus.LAUNCHED).values_list("name", flat=True))
    assert launched == {"train-7-0", "train-7-1"}  # the gang's minMember first, together
    assert set(PendingPod.objects.filter(status=DemandStatus.WAITING).values_list("reason", flat=True)) == {
        "not added: limit nodes 2 reached"}


@pytest.mark.django_db
def test_a_gang_in_a_pool_of_groups_that_does_not_fit_plans_nothing_for_any_of_its_pods(two):
    tenant = two(nodes=8, group="{size: 2}")
    for i in range(3):  # 3 pods × 8 GPUs = 2 groups of 2; r2 and r1 hold one each, 5 hosts for 4: fits
        pending(tenant, f"a-{i}", gang="ml/a")
    for i in range(2):  # then 2 more: a third group finds 1 free host on r1: the whole gang b waits
        pending(tenant, f"b-{i}", gang="ml/b")
    tenant_decide(tenant_id=tenant.pk)
    assert ClaimGroup.objects.count() == 2 and NodeClaim.objects.count() == 4
    pods = {p.name: p for p in PendingPod.objects.select_related("claim")}
    assert {pods[f"a-{i}"].status for i in range(3)} == {DemandStatus.LAUNCHED}
    # b-0 could have taken the free seat of a's second group; b-1 had no room: neither is placed.
    assert {pods[f"b-{i}"].status for i in range(2)} == {DemandStatus.WAITING}
    assert pods["b-0"].reason.startswith("gang ml/b: its 2 pods are added together or not at all")
    assert pods["b-0"].reason.endswith("needs 2 on one rail group; largest free group has 1 (rail r1)")


@pytest.mark.parametrize("meta, expected", [
    ({"namespace": "ml", "labels": {"scheduling.x-k8s.io/pod-group": "train"}}, ("ml/train", None)),
    ({"namespace": "ml", "labels": {"pod-group.scheduling.sigs.k8s.io/name": "train",
                                    "pod-group.scheduling.sigs.k8s.io/min-available": "3"}}, ("ml/train", 3)),
    ({"namespace": "ml", "labels": {"kueue.x-k8s.io/pod-group-name": "train"},
      "annotations": {"kueue.x-k8s.io/pod-group-total-count": "4"}}, ("ml/train", 4)),
    ({"namespace": "ml", "annotations": {"scheduling.k8s.io/group-name": "train"}}, ("ml/train", None)),
    ({"namespace": "ml", "labels": {"pod-group.scheduling.sigs.k8s.io/name": "t",
                                    "pod-group.scheduling.sigs.k8s.io/min-available": "many"}}, ("ml/t", None)),
    ({"namespace": "ml", "labels": {"app": "web"}}, ("", None)),
])
def test_a_pods_gang_is_read_from_the_labels_the_gang_schedulers_use(meta, expected):
    assert pod_gang(meta) == expected


def test_the_watchers_row_of_a_pod_carries_its_gang():
    pod = {"metadata": {"namespace": "ml", "name": "w-0", "uid": "u",
                        "labels": {"pod-group.scheduling.sigs.k8s.io/name": "w",
                                   "pod-group.scheduling.sigs.k8s.io/min-available": "2"}},
           "spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]}}
    fields = pod_fields(pod)
    assert (fields["gang"], fields["gang_min_member"]) == ("ml/w", 2)


@pytest.mark.django_db
def test_a_group_is_decided_and_placed_on_hosts_under_their_idle_check_which_is_abandoned(two):
    from hosts.services import hosts_transition_batch

    # Rail r1's three hosts are under their idle health check (pools/health_tiers.py): free all the same.
    r1 = list(BareMetalHost.objects.filter(**{f"labels__{RAIL_GROUP_LABEL}": "r1"}).order_by("name"))
    hosts_transition_batch(hosts=r1, to_state="checking", actor="system:idle-check", reason="idle health check")
    tenant = two(nodes=8, group="{size: 3}")
    for i in range(3):
        pending(tenant, f"train-7-{i}")
    tenant_decide(tenant_id=tenant.pk)
    [launched] = decisions(tenant, reason=DecisionReason.LAUNCHED)
    assert launched.data["domain"] == "rail r1"  # the only rail group with 3 free hosts counts the checking ones
    pools_reconcile(pool_ids=[NodePool.objects.get(name="burst").pk])
    [group] = ClaimGroup.objects.all()
    assert group.placed_at is not None and group.rail_group == "r1"
    assert sorted(c.host_name for c in group.members.all()) == [h.name for h in r1]
    moves = Event.objects.filter(host__in=r1, from_state="checking", to_state="provisioning")
    assert moves.count() == 3 and all("its idle health check is abandoned" in e.message for e in moves)
