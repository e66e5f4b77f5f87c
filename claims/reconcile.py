"""The pool reconciler: a static pool's quantity against its live claims; the claims and groups it makes, which
dynamic pools' decisions ask for too."""
import secrets
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from core.rows import rows_insert
from core.tasks import task_send, task_send_on_commit
from core.transactions import retry_on_deadlock
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record
from hosts.lifecycle import ConcurrentTransition
from pools.choices import GroupFailurePolicy, PoolKind
from pools.models import NODE_TYPE_PROPERTY, NodePool, NodeType
from pools.services import pools_changed

from . import task_names
from .allocation import claims_allocate
from .choices import ClaimPhase as P
from .lifecycle import LIVE, RELEASE_ORDER
from .models import ClaimGroup, NodeClaim
from .phases import claims_release, claims_transition, tenants_finalize
from .selectors import LaunchDeadline, launch_deadline_unknown_type, launch_deadlines
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # as Kubernetes' generateName


@dataclass
class ReconcileResult:
    created: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    allocated: dict[str, str] = field(default_factory=dict)  # claim → host
    pending: dict[str, str] = field(default_factory=dict)  # claim → why
    tenants_deleted: list[str] = field(default_factory=list)  # tenants whose deletion finished


@retry_on_deadlock(also=(ConcurrentTransition,))  # claims that moved meanwhile (the allocation): look again
def pools_reconcile(*, pool_ids: list[int] | None = None, actor: str = "system:reconciler") -> ReconcileResult:
    """For each static pool, desired quantity vs live claims: create or release the difference,
    then allocate hosts to pending claims. Safe to run at any time, from any number of workers.

    A pass does at most RECONCILE_BATCH claims of each pool (whole groups: at least one), each pool in its own
    short transaction, so what it holds in memory and how long it holds a pool's lock do not grow with the
    quantity asked for; a pool with more to do is reconciled again as soon as this pass commits."""
    result = ReconcileResult()
    unfinished = []
    for pool_id in _pools_off_quantity(pool_ids):  # read without locks; each one is looked at again under its lock
        created, released, more = _pool_reconcile(pool_id=pool_id, actor=actor)
        result.created += created
        result.released += released
        if more:
            unfinished.append(pool_id)
    if unfinished:
        task_send_on_commit(task_names.RECONCILE_POOLS, pool_ids=unfinished)
    allocation = claims_allocate(pool_ids=pool_ids, actor=actor)
    result.allocated, result.pending = allocation.allocated, allocation.pending
    if pool_ids is None:  # the periodic full pass also finishes tenant deletions (a release usually does)
        result.tenants_deleted = tenants_finalize(actor=actor)
    return result


# A pool's live claims, a replacement made first and the live claim it replaces counted once (a drift roll's
# pair is one node of the quantity until the old one goes).
_LIVE_COUNT = (Count("claims", filter=Q(claims__phase__in=list(LIVE)))
               - Count("claims", filter=Q(claims__phase__in=list(LIVE), claims__replacement_of__phase__in=list(LIVE))))


def _pools_off_quantity(pool_ids: list[int] | None) -> list[int]:
    """The static pools (of `pool_ids`, else all) whose live claims differ from their quantity, by id: two
    queries whatever the number of pools, so a pass with nothing to do stays cheap."""
    pools = NodePool.objects.filter(kind=PoolKind.STATIC)
    if pool_ids is not None:
        pools = pools.filter(pk__in=pool_ids)
    rows = list(pools.order_by("pk").annotate(live=_LIVE_COUNT).values_list("pk", "quantity", "group", "live"))
    grouped = _live_groups([pk for pk, _, group, _ in rows if isinstance(group, dict) and group.get("size")])
    off = []
    for pk, quantity, group, live_claims in rows:
        size = group.get("size") if isinstance(group, dict) else None
        if isinstance(size, int) and size > 0:
            ungrouped, groups = grouped.get(pk, (0, 0))
            need = (quantity or 0) - ungrouped - groups * size
            if need >= size or need < 0:
                off.append(pk)
        elif (quantity or 0) != live_claims:
            off.append(pk)
    return off


@retry_on_deadlock(also=(ConcurrentTransition,))  # claims that moved meanwhile: look again
@transaction.atomic
def _pool_reconcile(*, pool_id: int, actor: str) -> tuple[list[str], list[str], bool]:
    """One static pool's pass: (claims created, claims released, whether more is left for the next pass)."""
    batch = settings.RECONCILE_BATCH
    # Lock the pool so that two reconciles of it cannot both create its missing claims. FOR NO KEY UPDATE: an
    # allocation moving one of its claims checks the claim's pool key (FOR KEY SHARE) and must not wait for us
    # while we wait for that claim.
    if not NodePool.objects.filter(pk=pool_id, kind=PoolKind.STATIC).select_for_update(no_key=True).exists():
        return [], [], False  # gone, or made dynamic, meanwhile
    p = (NodePool.objects.filter(pk=pool_id).select_related("tenant", "provider")
         .annotate(live=_LIVE_COUNT).get())
    quantity = p.quantity or 0
    if p.group_size:  # whole groups only: claims from before the pool had groups count one by one
        ungrouped, groups = _live_groups([p.pk]).get(p.pk, (0, 0))
        need = quantity - ungrouped - groups * p.group_size
        surplus = -need if need < 0 else 0
        if need >= p.group_size:
            wanted = need // p.group_size
            count = min(wanted, max(1, batch // p.group_size))
            created = []
            for _ in range(count):
                created += [c.name for c in _group_create(pool=p, actor=actor)]
            return created, [], count < wanted
    else:
        need, surplus = quantity - p.live, p.live - quantity
        if need > 0:
            created = _claims_create([(p, min(need, batch))], actor)
            return [c.name for c in created], [], need > batch
    if surplus <= 0:
        return [], [], False
    # The least advanced first: claims that exist, so as many as were made, whatever the quantity asks for.
    ordered = sorted(NodeClaim.objects.filter(pool_id=p.pk, phase__in=list(LIVE)),
                     key=lambda c: (RELEASE_ORDER[c.phase], c.host_id is not None, -c.created_at.timestamp()))
    doomed = _whole_groups(ordered, min(surplus, batch))
    claims_release(claims=doomed, actor=actor, reason="pool shrank")
    return [], [c.name for c in doomed], surplus > len(doomed)


def _live_groups(pool_ids: list[int]) -> dict[int, tuple[int, int]]:
    """{pool id: (live claims in no group, groups with a live member)} of pools that come in groups."""
    if not pool_ids:
        return {}
    counts: dict[int, list] = defaultdict(lambda: [0, set()])
    for pool_id, group_id in (NodeClaim.objects.filter(pool_id__in=pool_ids, phase__in=list(LIVE)).order_by()
                              .values_list("pool_id", "group_id")):
        if group_id is None:
            counts[pool_id][0] += 1
        else:
            counts[pool_id][1].add(group_id)
    return {pool_id: (ungrouped, len(groups)) for pool_id, (ungrouped, groups) in counts.items()}


def _whole_groups(ordered: list[NodeClaim], surplus: int) -> list[NodeClaim]:
    """The claims a shrinking pool gives back, `ordered` least advanced first: claims in no group first, then
    whole groups (the least advanced first), never part of a group."""
    doomed = [c for c in ordered if c.group_id is None][:surplus]
    members, most_advanced = defaultdict(list), {}
    for position, claim in enumerate(ordered):
        if claim.group_id is not None:
            members[claim.group_id].append(claim)
            most_advanced[claim.group_id] = position  # the group goes as late as its most advanced member
    for group_id in sorted(members, key=most_advanced.__getitem__):
        if len(doomed) >= surplus:
            break
        doomed += members[group_id]
    return doomed


def claims_create(*, pool: NodePool, count: int, actor: str, node_type: NodeType | None = None,
                  message: str = "", launch_deadline: LaunchDeadline | None = None) -> list[NodeClaim]:
    """New Pending claims in a pool (a dynamic pool's decision, a replacement), optionally of one NodeType.
    The caller holds the tenant's lock (one decision at a time per tenant); hosts are allocated on commit.
    Each is expected Available within `launch_deadline` (default: its NodeType's measured launch p95, the cap
    without a type or a history); a caller creating several groups reads launch_deadlines once and passes it."""
    return claims_create_many(asks=[ClaimsAsk(pool=pool, count=count, node_type=node_type, message=message,
                                              launch_deadline=launch_deadline)], actor=actor)[0]


@dataclass(frozen=True)
class ClaimsAsk:
    """`count` new Pending claims in `pool`, optionally of one NodeType, as claims_create takes them."""

    pool: NodePool
    count: int
    node_type: NodeType | None = None
    message: str = ""
    launch_deadline: LaunchDeadline | None = None


def claims_create_many(*, asks: list[ClaimsAsk], actor: str, events: list[Event] | None = None,
                       reconcile: bool = True) -> list[list[NodeClaim]]:
    """claims_create for several pools and NodeTypes at once (a decision that launches several types): one read
    of the deadlines not given, one of the names, one insert of the claims and one of their Events, one
    allocation on commit, however many asks. `events`: a list of the caller's, which it records itself (one
    insert with its own), the claims' Events go to. `reconcile=False`: the caller asks for the allocation
    itself (reconcile_soon, once for several transactions of its own). Returns each ask's claims, in order."""
    if not asks:
        return []
    unknown = {a.node_type.pk: a.node_type for a in asks if a.launch_deadline is None and a.node_type}
    measured = launch_deadlines(unknown.values()) if unknown else {}
    now = timezone.now()

    def deadline_at(ask: ClaimsAsk):
        deadline = ask.launch_deadline or (measured[ask.node_type.pk] if ask.node_type
                                           else launch_deadline_unknown_type())
        return now + timedelta(seconds=deadline.seconds)

    claims = _claims_insert([(a.pool, a.count, a.node_type, a.message, deadline_at(a)) for a in asks], actor,
                            events=events)
    if reconcile:
        task_send_on_commit(task_names.RECONCILE_POOLS,  # allocates these pools' pending claims
                            pool_ids=list(dict.fromkeys(a.pool.pk for a in asks)))
    created, start = [], 0
    for ask in asks:
        created.append(claims[start:start + ask.count])
        start += ask.count
    return created


def claim_group_create(*, pool: NodePool, size: int, actor: str, node_type: NodeType | None = None,
                       message: str = "", launch_deadline: LaunchDeadline | None = None) -> list[NodeClaim]:
    """An all-or-nothing group of `size` Pending claims in a pool (a dynamic pool's decision that needs N
    servers of one rail group at once; the pool's `topology` and `group.onMemberFailure` apply). The caller
    holds the tenant's lock, as for claims_create; the group is placed on commit, whole or not at all."""
    if size < 2:
        raise ValueError("a group has 2 members or more")
    if launch_deadline is None:  # as claims_create: the NodeType's measured launch p95, else the cap
        launch_deadline = launch_deadlines([node_type])[node_type.pk] if node_type else launch_deadline_unknown_type()
    claims = _group_create(pool=pool, actor=actor, size=size, node_type=node_type, message=message,
                           launch_deadline_at=timezone.now() + timedelta(seconds=launch_deadline.seconds))
    task_send_on_commit(task_names.RECONCILE_POOLS, pool_ids=[pool.pk])
    return claims


@retry_on_deadlock(also=(ConcurrentTransition,))
def claim_group_place_again(*, group_id: int, placements: int, actor: str = "system:allocator") -> list[str]:
    """ReleaseGroup: every live member of the group is released (hosts drained and erased) and as many new
    Pending members take their place, so the group is placed again whole; hosts that failed it are tried last.
    Idempotent: a group placed again since (`placements` moved on) is left alone. After CLAIM_MAX_ATTEMPTS
    placements the group gives up: the members that lost their host are Failed, the others released.
    Returns the new members' names."""
    with transaction.atomic():
        group = ClaimGroup.objects.filter(pk=group_id).first()
        if group is None:
            return []
        # The lock order: the pool (a reconcile counting its groups waits), the group, hosts, claims.
        if group.pool_id:
            NodePool.objects.select_for_update(no_key=True).filter(pk=group.pool_id).exists()
        group = ClaimGroup.objects.select_for_update(of=("self",)).select_related("pool__tenant").get(pk=group_id)
        if group.placed_at is None or group.placements != placements:
            return []
        members = list(group.members.filter(phase__in=list(LIVE)).select_related("tenant").order_by("pk"))
        failed = sorted({name for member in members for name in member.failed_hosts})
        lost = [m for m in members if m.phase == P.PENDING and m.host_id is None]
        if group.placements >= settings.CLAIM_MAX_ATTEMPTS or group.pool is None:
            why = (f"gave up after {group.placements} placement(s); last lost: {', '.join(failed) or 'a member'}"
                   if group.pool else "its pool is gone")
            if lost:
                claims_transition(claims=lost, to_phase=P.FAILED, actor=actor, reason="RetriesExhausted",
                                  message=f"group {group.name} {why}")
            claims_release(claims=[m for m in members if m not in lost], actor=actor,
                           reason=f"group {group.name} {why}")
            ClaimGroup.objects.filter(pk=group.pk).update(reason="GaveUp", message=why)
            return []
        claims_release(claims=members, actor=actor,
                       reason=f"group {group.name} lost a member: released whole, to be placed again")
        ClaimGroup.objects.filter(pk=group.pk).update(placed_at=None, rack="", rail_group="", reason="Replacing",
                                                      message=f"placing it again (placement {placements + 1}); "
                                                              f"{', '.join(failed)} failed it")
        group.placed_at = None
        node_type = members[0].node_type if members and group.pool.kind == PoolKind.DYNAMIC else None
        new = _group_create(pool=group.pool, actor=actor, group=group, failed_hosts=failed, node_type=node_type,
                            message=f"group {group.name} placed again after a member failed")
        pools_changed(pool_ids=[group.pool_id])
        return [c.name for c in new]


def _claims_create(growing: list[tuple[NodePool, int]], actor: str, *, node_type: NodeType | None = None,
                   message: str = "", launch_deadline_at=None, group: ClaimGroup | None = None,
                   failed_hosts: list[str] | None = None) -> list[NodeClaim]:
    return _claims_insert([(pool, missing, node_type, message, launch_deadline_at) for pool, missing in growing],
                          actor, group=group, failed_hosts=failed_hosts)


def _claims_insert(growing: list[tuple[NodePool, int, NodeType | None, str, object]], actor: str, *,
                   group: ClaimGroup | None = None, failed_hosts: list[str] | None = None,
                   events: list[Event] | None = None) -> list[NodeClaim]:
    """(pool, count, NodeType or None, message, launch deadline) each: the claims in one insert, their Events in
    another, whatever the number of pools and types."""
    tenant_names = [pool.tenant.name for pool, missing, *_ in growing for _ in range(missing)]
    names = iter(_new_claim_names(tenant_names))

    def requirements(pool, node_type):
        if node_type is None:
            return pool.node_type_selector
        # A dynamic pool's decision chose the type: the allocator takes only that one.
        return [*pool.node_type_selector, {"property": NODE_TYPE_PROPERTY, "operator": "In", "values": [node_type.name]}]

    claims, messages = [], []
    for pool, missing, node_type, message, launch_deadline_at in growing:
        for _ in range(missing):
            claims.append(NodeClaim(
                name=next(names), namespace=pool.tenant.namespace, tenant=pool.tenant, pool=pool,
                pool_name=pool.name, provider=pool.provider, requirements=requirements(pool, node_type),
                properties=pool.properties, node_labels=pool.node_labels, taints=pool.taints,
                node_type=node_type, group=group, failed_hosts=list(failed_hosts or []), reason="Created",
                message="waiting for a host", launch_deadline_at=launch_deadline_at))
            messages.append(message or f"pool {pool.name} needs a node")
    rows_insert(claims)
    recorded = [Event(kind=EventKind.TRANSITION, object_type=ObjectType.CLAIM, object_name=c.name, claim_id=c.pk,
                      tenant_id=c.tenant_id, to_state=P.PENDING, message=message, actor=actor)
                for c, message in zip(claims, messages)]
    if events is None:
        events_record(recorded)
    else:
        events += recorded
    return claims


def _new_claim_names(tenant_names: list[str]) -> list[str]:
    seen: set[str] = set()

    def draw(tenant):
        # A clash within the batch is drawn again here: only a clash with an existing claim costs another query.
        while (name := f"{tenant}-{''.join(secrets.choice(NAME_ALPHABET) for _ in range(5))}") in seen:
            pass
        seen.add(name)
        return name

    names = [draw(t) for t in tenant_names]
    while names:
        with connection.cursor() as cursor:  # SQL: for a decision's few claims Django's compilation costs more
            cursor.execute(f"SELECT name FROM {NodeClaim._meta.db_table} WHERE name IN "
                           f"({', '.join(['%s'] * len(names))})", names)
            taken = {name for name, in cursor.fetchall()}
        if not taken:
            return names
        names = [draw(tenant_names[i]) if name in taken else name for i, name in enumerate(names)]
    return names


def _group_create(*, pool: NodePool, actor: str, size: int | None = None, node_type: NodeType | None = None,
                  message: str = "", failed_hosts: list[str] | None = None, group: ClaimGroup | None = None,
                  launch_deadline_at=None) -> list[NodeClaim]:
    """A new all-or-nothing group of the pool (or new members for `group`, placed again): its Pending claims."""
    if group is None:
        size = size or pool.group_size
        group = ClaimGroup.objects.create(
            name=_new_group_name(pool.tenant.name), tenant=pool.tenant, pool=pool, pool_name=pool.name, size=size,
            shares=list(pool.group_shares()),
            on_member_failure=(pool.group or {}).get("onMemberFailure") or GroupFailurePolicy.REPLACE,
            reason="Created", message="waiting to be placed")
    return _claims_create([(pool, group.size)], actor, node_type=node_type, group=group,
                          message=message or f"pool {pool.name} needs a group of {group.size} ({group.name})",
                          failed_hosts=failed_hosts, launch_deadline_at=launch_deadline_at)


def _new_group_name(tenant_name: str) -> str:
    while True:
        name = f"{tenant_name}-g{''.join(secrets.choice(NAME_ALPHABET) for _ in range(5))}"
        if not ClaimGroup.objects.filter(name=name).exists():
            return name


def reconcile_soon(*, pool_ids: list[int]) -> None:
    """Pools changed (pools.services.pools_changed, on commit): their reconcile goes out as one task."""
    task_send(task_names.RECONCILE_POOLS, pool_ids=pool_ids)
