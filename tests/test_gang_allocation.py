"""All-or-nothing groups and pools kept on one rail group or rack (issue 14, points 4 and 5): a group takes N
hosts of one rail group in one transaction or none, the smallest rail group that fits, and waits with a reason;
a member's failure is handled by the group's policy; a pool with `topology` keeps its nodes together."""
import re
import threading
from collections import Counter
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import close_old_connections, connection

from claims import tasks
from claims.allocation import AllocationResult, claims_allocate
from claims.choices import ClaimPhase
from claims.models import ClaimGroup, NodeClaim
from claims.reconcile import pools_reconcile
from events.models import Event
from hosts.models import BareMetalHost
from hosts.services import hosts_transition_batch
from hosts.topology import RAIL_GROUP_LABEL, host_topology
from pools.models import NodeEnvironment, NodePool, NodeProvider, Tenant

from .factories import make_rails

IMAGE = "ubuntu2404-20260926"


@pytest.fixture
def site(apply):
    apply(Path("demo/site.yaml").read_text())


def make_pool(quantity: int, *, group: dict | None = None, topology: dict | None = None, name: str = "gpu"):
    tenant, _ = Tenant.objects.get_or_create(
        name="one", defaults={"provider_properties": {"metal3": {"vcluster.com/os-image": IMAGE}}})
    return NodePool.objects.create(tenant=tenant, name=name, provider=NodeProvider.objects.get(name="metal3"),
                                   quantity=quantity, group=group or {}, topology=topology or {},
                                   node_type_selector=[{"property": "vcluster.com/node-type", "value": "gpu-server"}])


def rails_of(claims) -> set[str]:
    return {host_topology(c.host.labels).rail_group for c in claims}


def fail_host(claim: NodeClaim, reason: str = "power_on_pxe: BMC refused the boot override") -> None:
    """The provision flow gives up on the member's host: the host goes to error (the claim's reaction runs)."""
    host = BareMetalHost.objects.get(pk=claim.host_id)
    hosts_transition_batch(hosts=[host], to_state="error", actor="system:engine", reason=reason)


@pytest.mark.django_db
def test_a_group_of_4_over_rail_groups_with_3_4_and_5_free_hosts_goes_whole_on_the_4_host_rail(site):
    make_rails({"r1": 3, "r2": 5, "r3": 4})
    make_pool(4, group={"size": 4})
    call_command("reconcile")
    group = ClaimGroup.objects.get()
    members = list(group.members.select_related("host"))
    assert len(members) == 4 and all(c.phase == ClaimPhase.PROVISIONING for c in members)
    assert rails_of(members) == {"r3"}  # best fit: the smallest rail group with room, never split
    assert (group.rail_group, group.placements, group.placed_at is not None) == ("r3", 1, True)
    free = Counter(host_topology(h.labels).rail_group for h in BareMetalHost.objects.filter(state="available"))
    assert free == {"r1": 3, "r2": 5}


@pytest.mark.django_db
def test_a_group_that_cannot_be_placed_holds_no_host_and_waits_with_the_reason(site):
    make_rails({"r1": 3, "r2": 2, "r3": 3})
    make_pool(8, group={"size": 4})
    call_command("reconcile")
    assert ClaimGroup.objects.count() == 2
    assert not BareMetalHost.objects.exclude(state="available").exists()  # no partial hold
    why = "needs 4 on one rail group; largest free group has 3 (rail r3)"
    assert set(NodeClaim.objects.values_list("phase", "reason", "message")) == {("Pending", "NoGroupPlacement", why)}
    assert set(ClaimGroup.objects.values_list("message", flat=True)) == {why}
    # A fourth host joins rail r1: exactly one group goes there, whole; the other still waits.
    make_rails({"r1": 1}, start=100)
    call_command("reconcile")
    placed = ClaimGroup.objects.filter(placed_at__isnull=False)
    assert [g.rail_group for g in placed] == ["r1"]
    assert rails_of(placed[0].members.select_related("host")) == {"r1"}
    waiting = ClaimGroup.objects.get(placed_at__isnull=True)
    assert waiting.message == "needs 4 on one rail group; largest free group has 3 (rail r3)"
    assert not waiting.members.filter(host__isnull=False).exists()


@pytest.mark.django_db
def test_hosts_without_a_rail_group_label_are_never_taken_for_a_group_and_the_reason_says_so(site):
    make_rails({"r1": 2})
    BareMetalHost.objects.update(labels={"role": "gpu"})
    make_pool(2, group={"size": 2})
    call_command("reconcile")
    assert set(NodeClaim.objects.values_list("message", flat=True)) == {
        "needs 2 on one rail group; no free host of type gpu-server has a rail group label"}



@pytest.mark.django_db
def test_a_group_takes_hosts_under_their_idle_check_with_available_ones_and_the_checks_are_abandoned(site):
    make_rails({"r1": 4, "r2": 3})
    # Three of r1's hosts are under their idle health check: r1 has 4 free hosts, 1 of them available.
    checking = list(BareMetalHost.objects.filter(**{f"labels__{RAIL_GROUP_LABEL}": "r1"}).order_by("pk")[:3])
    hosts_transition_batch(hosts=checking, to_state="checking", actor="system:idle-check", reason="idle check")
    make_pool(4, group={"size": 4})
    call_command("reconcile")
    group = ClaimGroup.objects.get()
    members = list(group.members.select_related("host"))
    assert group.placed_at is not None and rails_of(members) == {"r1"}
    assert all(c.phase == ClaimPhase.PROVISIONING for c in members)
    assert {c.host.state for c in members} == {"provisioning"}
    moved = Event.objects.filter(host__in=checking, from_state="checking", to_state="provisioning")
    assert moved.count() == 3 and all(e.message.endswith("its idle health check is abandoned") for e in moved)
    assert set(BareMetalHost.objects.filter(state="available").values_list("labels__" + RAIL_GROUP_LABEL,
                                                                            flat=True)) == {"r2"}

@pytest.mark.django_db
def test_a_group_may_share_a_rack_instead_and_the_smallest_rack_that_fits_wins(site):
    make_rails({"r1": 2, "r2": 2, "r3": 3}, rack={"r1": "a", "r2": "a", "r3": "b"})
    make_pool(3, group={"size": 3}, topology={"sameRack": True})
    call_command("reconcile")
    group = ClaimGroup.objects.get()
    assert (group.rack, group.rail_group, group.shares) == ("b", "", ["rack"])  # rack b: 3 free; a: 4
    assert {host_topology(c.host.labels).rack for c in group.members.select_related("host")} == {"b"}


@pytest.mark.django_db
def test_a_plain_pool_with_same_rail_group_keeps_every_node_on_the_rail_group_it_started_on(site):
    make_rails({"r1": 2, "r2": 6, "r3": 3})
    pool = make_pool(3, topology={"sameRailGroup": True})
    call_command("reconcile")
    claims = list(NodeClaim.objects.select_related("host"))
    assert rails_of(claims) == {"r3"}  # best fit for 3
    # Grown past what r3 has: the new nodes go to r3 only; the one that does not fit waits there.
    pool.quantity = 5
    pool.save()
    call_command("reconcile")
    serving = NodeClaim.objects.filter(host__isnull=False).select_related("host")
    assert serving.count() == 3 and rails_of(serving) == {"r3"}
    assert set(NodeClaim.objects.filter(host__isnull=True).values_list("message", flat=True)) == {
        "pool gpu keeps its nodes on one rail group (rail r3); no free host of type gpu-server there"}
    make_rails({"r3": 1}, start=100)
    call_command("reconcile")
    serving = NodeClaim.objects.filter(host__isnull=False).select_related("host")
    assert serving.count() == 4 and rails_of(serving) == {"r3"}


@pytest.mark.django_db
def test_replace_gives_a_failed_member_a_host_of_the_same_rail_group_or_the_group_waits(
        site, django_capture_on_commit_callbacks):
    make_rails({"r1": 5, "r2": 8})
    make_pool(4, group={"size": 4, "onMemberFailure": "Replace"})
    call_command("reconcile")
    group = ClaimGroup.objects.get()
    assert group.rail_group == "r1"
    first = group.members.order_by("pk").first()
    lost_host = first.host_name
    with django_capture_on_commit_callbacks(execute=True):
        fail_host(first)
    first.refresh_from_db()
    assert (first.phase, first.reason, first.failed_hosts) == ("Pending", "HostFailed", [lost_host])
    group.refresh_from_db()
    assert group.message.startswith(f"member {first.name} failed (")
    assert group.message.endswith("replacing it from rail r1")
    pools_reconcile()
    first.refresh_from_db()
    assert first.phase == ClaimPhase.PROVISIONING and host_topology(first.host.labels).rail_group == "r1"
    assert first.host_name != lost_host
    # No free host is left on r1: the next lost member waits for one there, though r2 has 8 free.
    second = group.members.exclude(pk=first.pk).order_by("pk").first()
    fail_host(second)
    pools_reconcile()
    second.refresh_from_db()
    assert second.host is None and second.phase == ClaimPhase.PENDING
    assert second.message == (f"group {group.name} needs 1 more on rail r1 (Replace); "
                              "no free host of type gpu-server there")
    assert group.members.filter(host__isnull=False).count() == 3
    assert BareMetalHost.objects.filter(state="available", **{f"labels__{RAIL_GROUP_LABEL}": "r2"}).count() == 8


@pytest.mark.django_db
def test_release_group_releases_every_member_and_places_the_group_again_whole(
        site, django_capture_on_commit_callbacks):
    make_rails({"r1": 4, "r2": 6})
    make_pool(4, group={"size": 4, "onMemberFailure": "ReleaseGroup"})
    call_command("reconcile")
    group = ClaimGroup.objects.get()
    old = list(group.members.order_by("pk"))
    assert group.rail_group == "r1"
    with django_capture_on_commit_callbacks(execute=True):  # no worker here: the task is run below, as it would
        fail_host(old[0])
    group.refresh_from_db()
    assert group.reason == "MemberFailed" and "the group is released and placed again" in group.message
    # The lost member does not take a host on its own while the group is being released.
    pools_reconcile()
    assert NodeClaim.objects.get(pk=old[0].pk).host is None
    assert NodeClaim.objects.get(pk=old[0].pk).reason == "GroupReleasing"
    # What the worker runs on commit: every member goes, new members are placed whole.
    new = tasks.place_group_again(group_id=group.pk, placements=group.placements)
    assert len(new) == 4
    assert tasks.place_group_again(group_id=group.pk, placements=group.placements) == []  # idempotent
    phases = dict(NodeClaim.objects.filter(pk__in=[c.pk for c in old]).values_list("name", "phase"))
    assert phases == {old[0].name: "Released", **{c.name: "Releasing" for c in old[1:]}}
    assert BareMetalHost.objects.filter(name__in=[c.host_name for c in old[1:]], state="deprovisioning").count() == 3
    pools_reconcile()
    group.refresh_from_db()
    members = list(group.members.filter(name__in=new).select_related("host"))
    assert all(c.phase == ClaimPhase.PROVISIONING for c in members)
    assert (group.rail_group, group.placements) == ("r2", 2) and rails_of(members) == {"r2"}
    assert all(c.failed_hosts == [old[0].host_name] for c in members)
    live = NodeClaim.objects.filter(pool__name="gpu", phase__in=["Pending", "Provisioning"]).count()
    assert live == 4  # the pool still asks for one group of 4: nothing more was created


@pytest.mark.django_db
def test_a_shrinking_pool_gives_back_whole_groups_only(site):
    make_rails({"r1": 4, "r2": 4})
    pool = make_pool(8, group={"size": 4})
    call_command("reconcile")
    assert ClaimGroup.objects.filter(placed_at__isnull=False).count() == 2
    pool.quantity = 4
    pool.save()
    call_command("reconcile")
    by_group = Counter((c.group_id, c.phase) for c in NodeClaim.objects.all())
    assert sorted(by_group.values()) == [4, 4] and {phase for _, phase in by_group} == {"Provisioning", "Releasing"}


@pytest.mark.django_db
@pytest.mark.parametrize("pool, expect", [
    ({"quantity": 6, "group": {"size": 4}}, ("quantity: a pool of groups of 4 asks for whole groups: 6 is "
                                             "not a multiple of 4")),
    ({"quantity": 4, "group": {"size": 1}}, "group.size must be a whole number from 2 to 1000, not 1"),
    ({"quantity": 4, "group": {"onMemberFailure": "Replace"}}, "group.size is required"),
    ({"quantity": 4, "group": {"size": 4, "onMemberFailure": "Retry"}},
     "group.onMemberFailure must be Replace or ReleaseGroup, not 'Retry'"),
    ({"quantity": 4, "group": {"size": 4, "spread": True}}, "group: unknown field(s) spread"),
    ({"quantity": 4, "topology": {"sameRail": True}}, ("topology: unknown field(s) sameRail; expected sameRack "
                                                       "or sameRailGroup")),
    ({"quantity": 4, "topology": {"sameRailGroup": "yes"}}, "topology.sameRailGroup must be true or false"),
    ({"quantity": 4, "topology": ["sameRack"]}, "topology must be a mapping"),
])
def test_bad_topology_or_group_is_refused_by_apply_with_a_clear_error_and_nothing_changes(site, apply, pool, expect):
    import yaml

    body = {"name": "gpu", **pool}
    doc = yaml.safe_dump({"privateNodes": {"autoNodes": [{"provider": "metal3", "static": [body]}]}})
    with pytest.raises(CommandError) as exc:
        apply(doc, tenant="one")
    assert expect in str(exc.value)
    assert not NodePool.objects.exists()


@pytest.mark.django_db
def test_topology_and_group_round_trip_through_apply_and_export(site, apply, capsys):
    apply("""\
privateNodes:
  autoNodes:
  - provider: metal3
    static:
    - name: train
      quantity: 8
      topology: {sameRailGroup: true}
      group: {size: 4, onMemberFailure: ReleaseGroup}
""", tenant="one")
    pool = NodePool.objects.get(name="train")
    assert (pool.topology, pool.group) == ({"sameRailGroup": True}, {"size": 4, "onMemberFailure": "ReleaseGroup"})
    capsys.readouterr()
    call_command("export")
    out = capsys.readouterr().out
    assert re.search(r"- name: train\n( +)quantity: 8\n\1topology:\n\1  sameRailGroup: true\n\1group:\n"
                     r"\1  onMemberFailure: ReleaseGroup\n\1  size: 4\n", out), out
    again = apply(out, tenant=None)
    assert NodePool.objects.get(name="train").version == pool.version  # the export applies back unchanged
    assert not any("nodepool/one/train" in line and "unchanged" not in line for line in again)


@pytest.mark.django_db
def test_the_claims_list_and_pool_page_show_a_group_as_one_unit(site, admin_client):
    make_rails({"r1": 4, "r2": 3})
    make_pool(8, group={"size": 4})
    call_command("reconcile")
    placed = ClaimGroup.objects.get(placed_at__isnull=False)
    waiting = ClaimGroup.objects.get(placed_at__isnull=True)
    for url in ("/claims/", "/tenants/one/pools/gpu/"):
        html = admin_client.get(url).content.decode()
        assert f'data-group="{placed.name}"' in html and f'data-group="{waiting.name}"' in html
        row = html.split(f'data-group="{placed.name}"', 1)[1].split("</tr>", 1)[0]
        assert "rail r1" in row and "Provisioning" in row
        assert all(c.name in row for c in placed.members.all())
        row = html.split(f'data-group="{waiting.name}"', 1)[1].split("</tr>", 1)[0]
        assert "Waiting" in row and "largest free group has 3 (rail r2)" in row
    admin_page = admin_client.get("/admin/claims/claimgroup/").content.decode()
    assert placed.name in admin_page and waiting.name in admin_page


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_200_concurrent_group_requests_hold_nothing_partial_and_never_take_a_host_twice(site):
    assert connection.vendor == "postgresql"
    sizes = {"r0": 3, "r1": 4, "r2": 5, "r3": 7, "r4": 8, "r5": 9, "r6": 12, "r7": 15, "r8": 17, "r9": 20}
    make_rails(sizes)
    NodeEnvironment.objects.update(properties={NodeEnvironment.CIDR: "10.0.0.1/16",
                                               NodeEnvironment.IP_RANGE: "10.0.1.0-10.0.3.255"})  # addresses enough
    make_pool(800, group={"size": 4})
    from claims import reconcile

    original = reconcile.claims_allocate
    reconcile.claims_allocate = lambda **kw: AllocationResult()
    try:
        for _ in range(10):  # 200 groups of 4, none placed yet: a batch of them a pass
            if not pools_reconcile().created:
                break
    finally:
        reconcile.claims_allocate = original
    groups = list(ClaimGroup.objects.values_list("pk", flat=True))
    assert len(groups) == 200
    members = {g: list(NodeClaim.objects.filter(group_id=g).values_list("pk", flat=True)) for g in groups}
    errors, barrier = [], threading.Barrier(20)

    def worker(chunk):
        try:
            barrier.wait()
            for group_id in chunk:
                claims_allocate(claim_ids=members[group_id])  # as the worker's reconcile does, one group
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=worker, args=(groups[i::20],)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    hosts = list(NodeClaim.objects.filter(host__isnull=False).values_list("host_id", flat=True))
    assert len(hosts) == len(set(hosts))  # never one host twice
    expected = sum(n // 4 for n in sizes.values())  # 22 groups fit; best fit wastes no room
    placed = ClaimGroup.objects.filter(placed_at__isnull=False)
    assert placed.count() == expected
    for group in placed:
        taken = list(group.members.select_related("host"))
        assert len(taken) == 4 and all(c.host for c in taken)
        assert rails_of(taken) == {group.rail_group}  # within one rail group
    for group in ClaimGroup.objects.filter(placed_at__isnull=True):
        assert not group.members.filter(host__isnull=False).exists()  # no partial hold
    assert BareMetalHost.objects.filter(state="provisioning").count() == 4 * expected
    free = Counter(host_topology(h.labels).rail_group for h in BareMetalHost.objects.filter(state="available"))
    assert max(free.values()) < 4


@pytest.mark.django_db
def test_a_dynamic_pools_decision_can_ask_for_a_group_which_is_placed_whole(site):
    from django.db import transaction

    from claims.reconcile import claim_group_create
    from pools.models import NodeType

    make_rails({"r1": 2, "r2": 3})
    tenant = Tenant.objects.create(name="one", provider_properties={"metal3": {"vcluster.com/os-image": IMAGE}})
    pool = NodePool.objects.create(tenant=tenant, name="burst", kind="dynamic", provider=NodeProvider.objects.get(
        name="metal3"), limits={"nodes": "10"}, group={"size": 3, "onMemberFailure": "ReleaseGroup"})
    with transaction.atomic():
        claims = claim_group_create(pool=pool, size=3, actor="system:autonodes",
                                    node_type=NodeType.objects.get(name="gpu-server"))
    assert len(claims) == 3 and len({c.group_id for c in claims}) == 1
    pools_reconcile(pool_ids=[pool.pk])  # a dynamic pool's claims are allocated by the same pass
    group = ClaimGroup.objects.get()
    assert (group.size, group.on_member_failure, group.rail_group) == (3, "ReleaseGroup", "r2")
    assert rails_of(group.members.select_related("host")) == {"r2"}
    with pytest.raises(ValueError):
        claim_group_create(pool=pool, size=1, actor="system:autonodes")


@pytest.mark.django_db(transaction=True)
def test_a_worker_releases_a_release_group_whose_member_failed_and_places_it_again(site, celery_worker_process):
    from conftest import wait_for

    # BMCs that refuse at once (nothing listens on 127.0.0.1:9): the flows the worker starts go nowhere.
    make_rails({"r1": 4, "r2": 5}, bmc="redfish://127.0.0.1:9/redfish/v1/Systems/{i}")
    make_pool(4, group={"size": 4, "onMemberFailure": "ReleaseGroup"})
    pools_reconcile()
    group = ClaimGroup.objects.get()
    assert group.rail_group == "r1"
    first = group.members.order_by("pk").first()
    fail_host(first)  # on commit the worker is asked to release the group and place it again
    wait_for(lambda: ClaimGroup.objects.get(pk=group.pk).placements == 2, timeout=30)
    group.refresh_from_db()
    live = list(group.members.exclude(phase__in=["Released", "Releasing"]).select_related("host"))
    assert group.rail_group == "r2" and len(live) == 4 and rails_of(live) == {"r2"}
    assert "place_group_again" in celery_worker_process.log.read_text()


@pytest.mark.django_db
def test_a_group_whose_environment_has_too_few_addresses_left_waits_whole_for_them(site):
    make_rails({"r1": 12, "r2": 12})  # the demo environment has 22 addresses: 5 groups of 4 and 2 to spare
    make_pool(24, group={"size": 4})
    call_command("reconcile")
    assert ClaimGroup.objects.filter(placed_at__isnull=False).count() == 5
    waiting = ClaimGroup.objects.get(placed_at__isnull=True)
    assert waiting.reason == "NoAddress" and waiting.message.startswith("no free address in environment")
    assert not waiting.members.filter(host__isnull=False).exists()
    assert BareMetalHost.objects.filter(state="provisioning").count() == 20
    assert len(set(NodeClaim.objects.filter(host__isnull=False).values_list("ip_address", flat=True))) == 20


@pytest.mark.django_db
def test_a_host_whose_preflight_is_red_is_never_counted_or_taken_for_a_group(site):
    make_rails({"r1": 4, "r2": 6})
    BareMetalHost.objects.filter(name="gpu-00000").update(preflight_ok=False)  # on r1
    make_pool(4, group={"size": 4})
    call_command("reconcile")
    group = ClaimGroup.objects.get()
    assert group.rail_group == "r2" and rails_of(group.members.select_related("host")) == {"r2"}
    assert BareMetalHost.objects.get(name="gpu-00000").state == "available"
