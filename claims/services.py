"""Every write to a claim: phase changes, the pool reconciler, the allocator and release."""
import copy
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Count, Exists, F, OuterRef, Q, When
from django.utils import timezone

from core import live
from core.tasks import task_send_on_commit
from core.transactions import retry_on_deadlock
from core.transitions import swap
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record, object_delete, seconds_since
from hosts.capacity import (
    NEVER_ALLOCATED,
    node_type_capacity,
    not_allocatable_q,
    preflight_held_back,
)
from hosts.choices import HostState
from hosts.lifecycle import FREE, ConcurrentTransition
from hosts.models import BareMetalHost
from hosts.services import hosts_transition_batch
from hosts.topology import host_topology
from pools.choices import GroupFailurePolicy, PoolKind
from pools.fabric import fabric_partition_waits, fabric_partitions_release
from pools.matching import label_selector_q, normalize_requirement, requirements_match
from pools.models import (
    NODE_TYPE_PROPERTY,
    OS_IMAGE_PROPERTY,
    SERVER_NAME_PROPERTY,
    NodePool,
    NodeType,
    Tenant,
)
from pools.services import RECONCILE_TASK, pools_changed

from .choices import ClaimPhase as P
from .ipam import (
    HOLDS_NO_HOST,
    NO_ADDRESS,
    addresses_free,
    addresses_take,
    environments_lock,
    environments_of,
)
from .lifecycle import LIVE, RELEASE_ORDER, check_phase_change
from .models import ClaimGroup, NodeClaim
from .selectors import (
    LaunchDeadline,
    launch_deadline_unknown_type,
    launch_deadlines,
    os_image,
)
from .tenant_check import WAIT_REASON as TENANT_API_WAIT
from .tenant_check import tenant_api_holds

log = logging.getLogger(__name__)

# Timestamps a phase sets (and, going back to Pending, clears).
PHASE_TIMESTAMPS = {P.PROVISIONING: ("scheduled_at",), P.JOINING: ("provisioned_at",),
                    P.AVAILABLE: ("joined_at", "available_at"), P.RELEASED: ("released_at",)}
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # as Kubernetes' generateName


# Who hears that claims ended (Failed or Released), inside the transaction that ends them: apps built on claims
# register at start (autonodes: the Pending pods a dynamic pool's claim was launched for go back to its demand);
# claims know nothing of them. fn(claims=[NodeClaim], to_phase=, actor=).
CLAIM_END_RECEIVERS: list = []
ENDED = frozenset({P.FAILED, P.RELEASED})


def on_claim_end(receiver) -> None:
    if receiver not in CLAIM_END_RECEIVERS:
        CLAIM_END_RECEIVERS.append(receiver)


@transaction.atomic
def claims_transition(*, claims: Iterable[NodeClaim], to_phase: str, actor: str, reason: str = "",
                      message: str | None = "", step: str = "", fields: dict | None = None,
                      event_messages: dict[int, str] | None = None) -> list[NodeClaim]:
    """Move claims that share one phase to `to_phase` (compare-and-swap), with one Event each.
    `message=None` keeps each claim's own message (set beforehand); `event_messages` words each Event."""
    claims = list(claims)
    if not claims:
        return claims
    from_phase = claims[0].phase
    if any(c.phase != from_phase for c in claims):
        raise ValueError("claims_transition moves claims that share one phase")
    for claim in claims:
        check_phase_change(from_phase, to_phase, claim.name)
    now = timezone.now()
    values = {"phase": to_phase, "phase_changed_at": now, "reason": reason, **(fields or {})}
    if message is not None:
        values["message"] = message
    for stamp in PHASE_TIMESTAMPS.get(to_phase, ()):
        values[stamp] = now
    if to_phase == P.PENDING:
        values.update(scheduled_at=None, provisioned_at=None, joined_at=None, available_at=None)
    ids = [c.pk for c in claims]
    swap(NodeClaim, ids=ids, field="phase", expected=from_phase, values=values, what="claim")
    if to_phase in HOLDS_NO_HOST:  # the binding ends: its address goes back, in this transaction (claims.ipam)
        addresses_free(claim_ids=ids)
    # Published on commit to "claims" and each claim's, tenant's and host's group: {"object": "claim",
    # "ids": [...], "from_state": ..., "to_state": ...}.
    events_record([
        Event(kind=EventKind.TRANSITION, object_type=ObjectType.CLAIM, object_name=c.name, claim_id=c.pk,
              tenant_id=c.tenant_id, host_id=c.host_id, from_state=from_phase, to_state=to_phase, step=step,
              message=(event_messages or {}).get(c.pk) or message or c.message or reason,
              duration_s=seconds_since(c.phase_changed_at, now), actor=actor)
        for c in claims
    ])
    for claim in claims:
        for key, value in values.items():
            if not hasattr(value, "resolve_expression"):  # F() expressions were applied in the database
                setattr(claim, key, value)
    if to_phase in ENDED:
        for receiver in CLAIM_END_RECEIVERS:
            receiver(claims=claims, to_phase=to_phase, actor=actor)
    tenants = sorted({c.tenant_id for c in claims})
    if to_phase == P.RELEASED:
        deleting = list(Tenant.objects.filter(pk__in=tenants, deleting_since__isnull=False).values_list("pk", flat=True))
        if deleting:  # a tenant being deleted goes once its last claim is released
            transaction.on_commit(lambda: tenants_finalize(tenant_ids=deleting, actor=actor))
    return claims


def _new_claim_names(tenant_names: list[str]) -> list[str]:
    def draw(tenant):
        return f"{tenant}-{''.join(secrets.choice(NAME_ALPHABET) for _ in range(5))}"

    names = [draw(t) for t in tenant_names]
    while True:
        taken = set(NodeClaim.objects.filter(name__in=names).values_list("name", flat=True))
        seen = set()
        clashes = []
        for i, name in enumerate(names):
            if name in taken or name in seen:
                clashes.append(i)
            seen.add(name)
        if not clashes:
            return names
        for i in clashes:
            names[i] = draw(tenant_names[i])


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
        task_send_on_commit(RECONCILE_TASK, pool_ids=unfinished)
    allocation = claims_allocate(pool_ids=pool_ids, actor=actor)
    result.allocated, result.pending = allocation.allocated, allocation.pending
    if pool_ids is None:  # the periodic full pass also finishes tenant deletions (a release usually does)
        result.tenants_deleted = tenants_finalize(actor=actor)
    return result


def _pools_off_quantity(pool_ids: list[int] | None) -> list[int]:
    """The static pools (of `pool_ids`, else all) whose live claims differ from their quantity, by id: two
    queries whatever the number of pools, so a pass with nothing to do stays cheap."""
    pools = NodePool.objects.filter(kind=PoolKind.STATIC)
    if pool_ids is not None:
        pools = pools.filter(pk__in=pool_ids)
    rows = list(pools.order_by("pk").annotate(live=Count("claims", filter=Q(claims__phase__in=list(LIVE))))
                .values_list("pk", "quantity", "group", "live"))
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
         .annotate(live=Count("claims", filter=Q(claims__phase__in=list(LIVE)))).get())
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


def _new_group_name(tenant_name: str) -> str:
    while True:
        name = f"{tenant_name}-g{''.join(secrets.choice(NAME_ALPHABET) for _ in range(5))}"
        if not ClaimGroup.objects.filter(name=name).exists():
            return name


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
    task_send_on_commit(RECONCILE_TASK, pool_ids=[pool.pk])
    return claims


def _claims_create(growing: list[tuple[NodePool, int]], actor: str, *, node_type: NodeType | None = None,
                   message: str = "", launch_deadline_at=None, group: ClaimGroup | None = None,
                   failed_hosts: list[str] | None = None) -> list[NodeClaim]:
    tenant_names = [pool.tenant.name for pool, missing in growing for _ in range(missing)]
    names = iter(_new_claim_names(tenant_names))

    def requirements(pool):
        if node_type is None:
            return pool.node_type_selector
        # A dynamic pool's decision chose the type: the allocator takes only that one.
        return [*pool.node_type_selector, {"property": NODE_TYPE_PROPERTY, "operator": "In", "values": [node_type.name]}]

    claims = [
        NodeClaim(name=next(names), namespace=pool.tenant.namespace, tenant=pool.tenant, pool=pool,
                  pool_name=pool.name, provider=pool.provider, requirements=requirements(pool),
                  properties=pool.properties, node_labels=pool.node_labels, taints=pool.taints,
                  node_type=node_type, group=group, failed_hosts=list(failed_hosts or []), reason="Created",
                  message="waiting for a host", launch_deadline_at=launch_deadline_at)
        for pool, missing in growing for _ in range(missing)
    ]
    NodeClaim.objects.bulk_create(claims)
    created = {c.name: c for c in claims}
    if not all(c.pk for c in claims):  # backends that do not return ids from bulk inserts
        for pk, name in NodeClaim.objects.filter(name__in=list(created)).values_list("pk", "name"):
            created[name].pk = pk
    events_record([
        Event(kind=EventKind.TRANSITION, object_type=ObjectType.CLAIM, object_name=c.name, claim_id=c.pk,
              tenant_id=c.tenant_id, to_state=P.PENDING, message=message or f"pool {c.pool_name} needs a node",
              actor=actor)
        for c in claims
    ])
    return claims


def claims_create(*, pool: NodePool, count: int, actor: str, node_type: NodeType | None = None,
                  message: str = "", launch_deadline: LaunchDeadline | None = None) -> list[NodeClaim]:
    """New Pending claims in a pool (a dynamic pool's decision, a replacement), optionally of one NodeType.
    The caller holds the tenant's lock (one decision at a time per tenant); hosts are allocated on commit.
    Each is expected Available within `launch_deadline` (default: its NodeType's measured launch p95, the cap
    without a type or a history); a caller creating several groups reads launch_deadlines once and passes it."""
    if launch_deadline is None:
        launch_deadline = launch_deadlines([node_type])[node_type.pk] if node_type else launch_deadline_unknown_type()
    claims = _claims_create([(pool, count)], actor, node_type=node_type, message=message,
                            launch_deadline_at=timezone.now() + timedelta(seconds=launch_deadline.seconds))
    task_send_on_commit(RECONCILE_TASK, pool_ids=[pool.pk])  # allocates this pool's pending claims
    return claims


@transaction.atomic
def claims_release(*, claims: list[NodeClaim], actor: str, reason: str) -> None:
    """Give claims back. A claim without a host is released at once; one with a host goes to
    Releasing and its host to deprovisioning (drain, clean and return to the pool)."""
    by_phase = defaultdict(list)
    for claim in claims:
        by_phase[(claim.phase, claim.host_id is not None)].append(claim)
    for (phase, has_host), group in by_phase.items():
        if not has_host:
            claims_transition(claims=group, to_phase=P.RELEASED, actor=actor, reason="Released", message=reason)
            continue
        # The lock order (vmetal_console/transactions.py): hosts, by id, before their claims.
        hosts = list(BareMetalHost.objects.filter(pk__in=[c.host_id for c in group]).order_by("pk")
                     .select_for_update(no_key=True))
        claims_transition(claims=group, to_phase=P.RELEASING, actor=actor, reason="Releasing", message=reason)
        hosts_by_state = defaultdict(list)
        for host in hosts:
            hosts_by_state[host.state].append(host)
        tenant_of = {c.host_id: c.tenant_id for c in group}
        for state, same in hosts_by_state.items():
            if state in (HostState.PROVISIONING, HostState.PROVISIONED):
                hosts_transition_batch(hosts=same, to_state=HostState.DEPROVISIONING, actor=actor,
                                 reason=f"released by its claim: {reason}", tenant_ids=tenant_of)


@transaction.atomic
def claim_host_lost(*, claim: NodeClaim, reason: str, actor: str, claim_reason: str = "",
                    counted: bool = True) -> NodeClaim:
    """The claim's host failed (error, deadline): free the claim and try another host, until CLAIM_MAX_ATTEMPTS
    distinct hosts failed it. `claim_reason`: the claim itself caused the failure (its image): it fails with
    that reason, and the host is not counted against it. Its join token, if any, is deleted by a task."""
    cap = settings.CLAIM_MAX_ATTEMPTS
    # Not counted: the host failed its handover health check before anything was written (it is in repair); the
    # claim takes another host at once, without spending one of its CLAIM_MAX_ATTEMPTS.
    blamed = claim.host_name and not claim_reason and counted
    failed = [*claim.failed_hosts, claim.host_name] if blamed else claim.failed_hosts
    fields = {"host": None, "ip_address": None, "node_name": "", "failed_hosts": failed, "bootstrap_token_id": ""}
    if claim.phase == P.RELEASING:
        claims_transition(claims=[claim], to_phase=P.RELEASED, actor=actor, reason="Released",
                          message=f"released; its host failed: {reason}", fields=fields)
    elif claim_reason == TENANT_API_WAIT:
        # The tenant's API VIP is not reachable from the server's network: no host is blamed and no try is
        # spent; the claim waits (claims_allocate holds it) until the tenant fixes its endpoint or CA.
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason=claim_reason, message=reason,
                          fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    elif claim_reason:
        claims_transition(claims=[claim], to_phase=P.FAILED, actor=actor, reason=claim_reason, message=reason,
                          fields=fields)
    elif not counted:
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason="HostUnhealthy",
                          message=f"{reason}; trying another host", fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    elif len(set(failed)) >= cap:
        claims_transition(claims=[claim], to_phase=P.FAILED, actor=actor, reason="RetriesExhausted",
                          message=f"gave up after {claim.attempts} attempt(s); last: {reason}", fields=fields)
    else:
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason="HostFailed",
                          message=f"{reason}; trying another host ({len(set(failed))} of {cap} failed it)",
                          fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    if claim.group_id and not claim_reason and claim.phase != P.RELEASED:
        _group_member_lost(claim, reason)
    token_id = claim.bootstrap_token_id
    if token_id:  # network I/O: after commit, in a worker
        task_send_on_commit("claims.tasks.revoke_join_token", claim_id=claim.pk, token_id=token_id)
    claim.host = None
    return claim


def _group_member_lost(claim: NodeClaim, reason: str) -> None:
    """A member of a placed group lost its host: its group's policy decides. Replace: the member waits for a
    host of the group's rail group (the allocator). ReleaseGroup: a task releases every member and places the
    group again (after this commit: it locks the group, then its hosts; this transaction holds one of them)."""
    group = ClaimGroup.objects.filter(pk=claim.group_id, placed_at__isnull=False).first()
    if group is None:
        return
    where = _domain_name(tuple(group.shares), group.domain())
    if claim.phase == P.FAILED:  # too many hosts failed it: nothing replaces it (delete it to try again)
        message = f"member {claim.name} failed for good ({reason}); the rest of the group stays"
    elif group.on_member_failure == GroupFailurePolicy.RELEASE_GROUP:
        message = f"member {claim.name} failed ({reason}): the group is released and placed again"
        task_send_on_commit("claims.tasks.place_group_again", group_id=group.pk, placements=group.placements)
    else:
        message = f"member {claim.name} failed ({reason}): replacing it from {where}"
    # After commit: this runs under the failing host's lock, and whoever releases the group (ReleaseGroup)
    # locks the group before its hosts.
    transaction.on_commit(lambda: ClaimGroup.objects.filter(pk=group.pk).update(reason="MemberFailed",
                                                                                message=message))


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


@dataclass
class AllocationResult:
    allocated: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)


def claims_allocate(*, pool_ids: list[int] | None = None, claim_ids: list[int] | None = None,
                    actor: str = "system:allocator") -> AllocationResult:
    """Give each pending claim one available host of the cheapest matching NodeType that has one free.

    Hosts are taken with SELECT … FOR UPDATE SKIP LOCKED (PostgreSQL) and a compare-and-swap on their
    state (every backend), so two claims never get one host; the unique claim→host link guards too."""
    result = AllocationResult()
    pending = NodeClaim.objects.filter(phase=P.PENDING, host__isnull=True).order_by("created_at", "pk")
    if pool_ids is not None:
        pending = pending.filter(pool_id__in=pool_ids)
    if claim_ids is not None:
        pending = pending.filter(pk__in=claim_ids)
    pending = list(pending)
    if not pending:
        return result
    waiting = {}  # claim → (reason, message)
    # What a claim needs before any host is touched: an OS image that can be written.
    images = {name: os_image(name)[1] for name in {c.properties.get(OS_IMAGE_PROPERTY) or "" for c in pending}}
    # … and a tenant API that the last server-side check reached (claims.tenant_check).
    holds = tenant_api_holds(tenant_ids={c.tenant_id for c in pending})
    for claim in pending:
        problem = images[claim.properties.get(OS_IMAGE_PROPERTY) or ""] or holds.get(claim.tenant_id)
        if problem:
            waiting[claim] = problem
    # ...and, where its environment configures a fabric range, a partition for its tenant (pools.fabric).
    for claim, message in fabric_partition_waits(c for c in pending if c not in waiting).items():
        waiting[claim] = ("NoFabricPartition", message)
    node_types = sorted(NodeType.objects.select_related("provider"), key=lambda t: (t.effective_cost(), t.name))
    # Where a claim's host must sit (hosts.topology): with the rest of its all-or-nothing group, or of its pool.
    claim_groups = ClaimGroup.objects.in_bulk({c.group_id for c in pending if c.group_id})
    topology_pools = {p.pk: p for p in NodePool.objects.filter(pk__in={c.pool_id for c in pending if c.pool_id
                                                                        and not c.group_id})
                      if p.shared_topology()}
    groups = defaultdict(list)
    environments = environments_of(pending)  # a group shares one NodeEnvironment: its addresses (claims.ipam)
    no_address = {}  # claim id → why it waits for an address (filled by _allocate_group)
    for claim in pending:
        if claim in waiting:
            continue
        pinned = claim.properties.get(SERVER_NAME_PROPERTY, "")
        tried = tuple(sorted(set(claim.failed_hosts)))
        where = None
        group = claim_groups.get(claim.group_id)
        if group is not None and group.placed_at is None:
            where, pinned, tried = ("group", group), "", ()  # placed whole: one host per member, in one go
        elif group is not None and group.on_member_failure == GroupFailurePolicy.RELEASE_GROUP:
            waiting[claim] = ("GroupReleasing", f"group {group.name} lost a member: it is released and placed again")
            continue
        elif group is not None:
            where = ("member", group)  # Replace: a new host from the group's rail group
        elif claim.pool_id in topology_pools:
            where = ("pool", topology_pools[claim.pool_id])
        env = environments[claim.pk]
        key = (claim.provider_id, _requirements_key(claim.requirements), pinned, tried, where, env.pk if env else None)
        groups[key].append(claim)
    for (provider_id, _, pinned, tried, where, _env), claims in groups.items():
        candidates = [t for t in node_types if t.provider_id == provider_id
                      and requirements_match(claims[0].requirements, t.effective_properties())]
        if not candidates:
            msg = f"no NodeType matches {_describe(claims[0].requirements)}"
            waiting.update({c: ("NoNodeType", msg) for c in claims})
            continue
        if where is not None:
            if where[0] == "group":
                allocated, why = _place_group(where[1], claims, candidates, actor)
            else:
                allocated, why = _allocate_in_place(where, claims, candidates, tried, actor)
            result.allocated.update(allocated)
            if why:
                waiting.update({c: why for c in claims if c.name not in allocated})
            continue
        # Hosts that failed these claims wait while another matching host is free or on its way back.
        excluded = tried if tried and _another_host_may_free_up(candidates, pinned, tried) else ()
        for round_ in range(3):
            for node_type in candidates:
                if not claims or no_address.keys() & {c.pk for c in claims}:
                    break
                taken = _allocate_group(claims, node_type, pinned, actor, excluded=excluded, no_address=no_address)
                for claim in claims[:taken]:
                    result.allocated[claim.name] = claim.host_name
                claims = claims[taken:]
            if not claims or no_address.keys() & {c.pk for c in claims}:
                break
            capacity = node_type_capacity(candidates)
            if excluded or not any(capacity[t.pk]["available"] for t in candidates):
                break
            # Hosts that look free but were skipped: other allocations hold them locked. Look again
            # once they commit, so the reason we give is true.
            time.sleep(0.05 * (round_ + 1))
        if claims and any(c.pk in no_address for c in claims):
            waiting.update({c: (NO_ADDRESS, no_address.get(c.pk) or next(iter(no_address.values()))) for c in claims})
        elif claims:
            msg = _no_capacity_message(candidates, capacity, pinned)
            if excluded:
                msg += f"; not {', '.join(excluded)} again while another host may free up (it failed this claim)"
            waiting.update({c: ("NoCapacity", msg) for c in claims})
    by_message = defaultdict(list)
    told: list[NodeClaim] = []  # claims whose reason changed: the live lists must hear of it
    for claim, (reason, msg) in waiting.items():
        result.pending[claim.name] = msg
        if (claim.reason, claim.message) != (reason, msg):
            by_message[(reason, msg)].append(claim.pk)
            told.append(claim)
    for (reason, msg), ids in by_message.items():
        NodeClaim.objects.filter(pk__in=ids, phase=P.PENDING).update(reason=reason, message=msg)
    for group in claim_groups.values():  # a group waiting to be placed says why, as its members do
        why = next((waiting[c] for c in pending if c.group_id == group.pk and c in waiting), None)
        if why and group.placed_at is None and (group.reason, group.message) != why:
            ClaimGroup.objects.filter(pk=group.pk, placed_at__isnull=True).update(reason=why[0], message=why[1])
            told += [c for c in pending if c.group_id == group.pk]
    if told:  # no Event for a reason that changed: the live lists hear of it from the claims' ids
        groups = ["claims", *sorted({f"tenant-{c.tenant_id}" for c in told})]
        message = {"object": "claim", "ids": [c.pk for c in told]}
        transaction.on_commit(lambda: live.publish(groups, message))
    return result


# --- where hosts sit: all-or-nothing groups, pools on one rack or rail group (hosts.topology) ----------------

SHARES_WORDS = {("rail_group",): ("on one rail group", "group"), ("rack",): ("in one rack", "rack"),
                ("rack", "rail_group"): ("in one rack and rail group", "group")}


def _domain_name(shares: tuple[str, ...], domain: tuple[str, ...]) -> str:
    """("rail_group",) ("r2",) → "rail r2"; ("rack", "rail_group") ("a1", "r2") → "rack a1, rail r2"."""
    return ", ".join(f"{'rail' if key == 'rail_group' else key} {value}" for key, value in zip(shares, domain))


def _free_by_domain(node_type: NodeType, shares: tuple[str, ...], excluded: tuple[str, ...] = (),
                    tried_last: list[str] | tuple = ()) -> dict[tuple[str, ...], list[int]]:
    """The free hosts of a type, by what they share ({("r2",): [host ids]}), each list in the order the
    allocator takes them (as _allocate_group: hosts held back, then hosts that failed these claims, last).
    A host that does not say where it sits (no such label) is in no domain."""
    free = free_hosts(node_type, excluded=excluded)
    order = _host_order(list(tried_last))
    by_domain = defaultdict(list)
    for pk, labels in free.order_by(*order).values_list("pk", "labels"):
        topology = host_topology(labels)
        domain = tuple(getattr(topology, key) for key in shares)
        if all(domain):
            by_domain[domain].append(pk)
    return by_domain


def group_free_domains(node_type: NodeType, shares: tuple[str, ...]) -> dict[str, int]:
    """Free hosts of a type per rail group (or what `shares` names), by name: {"rail r2": 3}. What a dynamic
    pool's decision reads before it asks for a group (the allocator decides where the group goes)."""
    return {_domain_name(shares, domain): len(pks) for domain, pks in _free_by_domain(node_type, shares).items()}


def pool_free_domain(pool: NodePool, node_type: NodeType) -> tuple[str, int] | None:
    """A pool with `topology` (no group): where its next nodes of the type go and how many free hosts are there
    (the domain its serving nodes are in, else the one with the most free: at most what the allocator finds).
    None for a pool without topology; ("", 0) when no free host of the type says where it sits."""
    shares = pool.shared_topology()
    if not shares:
        return None
    by_domain = _free_by_domain(node_type, shares)
    domain = _pool_domain(pool, shares)
    if domain is None:
        if not by_domain:
            return "", 0
        domain = max((len(pks), d) for d, pks in by_domain.items())[1]
    return _domain_name(shares, domain), len(by_domain.get(domain, []))


def group_where(shares: tuple[str, ...]) -> str:
    """("rail_group",) → "on one rail group": what a group's hosts share, as the messages say it."""
    return SHARES_WORDS.get(tuple(shares), ("together", "group"))[0]


class _FellShort(Exception):
    """A domain that looked big enough lost hosts to another allocation meanwhile: its locks are let go."""


class _NoAddress(Exception):
    """The group's environment has fewer free addresses than it has members: nothing is placed."""


def _place_group(group: ClaimGroup, claims: list[NodeClaim], candidates: list[NodeType],
                 actor: str) -> tuple[dict[str, str], tuple[str, str] | None]:
    """Place a group whole: one host per member, all from one rail group (or what the group shares), taken in
    one transaction, or none. Best fit: the smallest domain with room, then its name (deterministic); the
    cheapest NodeType first. No host is held while the rest is looked for: a domain that falls short rolls back
    to its savepoint, which lets its row locks go. Returns {claim: host} and, unplaced, (reason, message)."""
    shares = tuple(group.shares)
    need = len(claims)
    tried = sorted({name for claim in claims for name in claim.failed_hosts})
    best: tuple[int, tuple[str, ...], str] | None = None  # the largest free domain seen: (hosts, domain, type)
    for round_ in range(3):
        busy = False
        for node_type in candidates:
            outcome, counts = _place_group_once(group, claims, node_type, shares, tried, actor)
            if outcome == "placed":
                return {c.name: c.host_name for c in claims}, None
            if outcome == "gone":  # another worker holds it, placed it, or moved a member: theirs to say
                return {}, None
            if outcome.startswith(f"{NO_ADDRESS}:"):
                return {}, (NO_ADDRESS, outcome.split(":", 1)[1])
            for domain, n in counts.items():
                if best is None or (n, domain) > best[:2]:
                    best = (n, domain, node_type.name)
            busy = busy or outcome == "busy"
        if not busy:
            break
        time.sleep(0.05 * (round_ + 1))  # hosts others hold locked: look again once they commit
    where, noun = SHARES_WORDS.get(shares, ("together", "group"))
    msg = f"needs {need} {where}; "
    if best is None:
        kinds = "a rail group" if "rail_group" in shares else "a rack"
        msg += f"no free host of {_types(candidates)} has {kinds} label"
    else:
        kind = f", {best[2]}" if len(candidates) > 1 else ""
        msg += f"largest free {noun} has {best[0]} ({_domain_name(shares, best[1])}{kind})"
    return {}, ("NoGroupPlacement", msg)


def _types(candidates: list[NodeType]) -> str:
    return ("type " if len(candidates) == 1 else "types ") + ", ".join(t.name for t in candidates)


def _place_group_once(group: ClaimGroup, claims: list[NodeClaim], node_type: NodeType, shares: tuple[str, ...],
                      tried: list[str], actor: str) -> tuple[str, dict]:
    """One try with one NodeType: "placed", "none" (no domain has room), "busy" (some had, on paper, but
    others hold their hosts) or "gone"; with the free hosts per domain it saw."""
    need = len(claims)
    try:
        with transaction.atomic():
            # The lock order (core/transactions.py): pools, claim groups, hosts, claims. SKIP LOCKED: a group
            # another worker is placing is theirs.
            if not ClaimGroup.objects.select_for_update(skip_locked=True).filter(
                    pk=group.pk, placed_at__isnull=True).exists():
                return "gone", {}
            environments_lock(claims)  # before the hosts, as _allocate_group (claims.ipam)
            by_domain = _free_by_domain(node_type, shares, tried_last=tried)
            counts = {domain: len(pks) for domain, pks in by_domain.items()}
            fitting = sorted((n, domain) for domain, n in counts.items() if n >= need)
            for _, domain in fitting:
                try:
                    with transaction.atomic():
                        hosts = list(BareMetalHost.objects.filter(pk__in=by_domain[domain], state__in=FREE_STATES)
                                     .select_for_update(skip_locked=True, of=("self",))
                                     .order_by(*_host_order(tried))[:need])
                        if len(hosts) < need:
                            raise _FellShort
                        # Every member's address in this same transaction (claims.ipam), or none placed.
                        chosen, hosts, short = addresses_take(claims=claims, hosts=hosts, actor=actor)
                        if short:
                            raise _NoAddress(next(iter(short.values())))
                        _bind(hosts, chosen, node_type, actor,
                              message=f"group {group.name}: {need} {node_type.name} hosts on "
                                      f"{_domain_name(shares, domain)}")
                except _FellShort:
                    continue
                except _NoAddress as short:
                    return f"{NO_ADDRESS}:{short}", counts
                placed = {"placed_at": timezone.now(), "placements": F("placements") + 1, "reason": "Placed",
                          "message": f"{need} hosts on {_domain_name(shares, domain)}",
                          **dict(zip(shares, domain))}
                ClaimGroup.objects.filter(pk=group.pk).update(**placed)
                return "placed", counts
            return ("busy" if fitting else "none"), counts
    except ConcurrentTransition:
        for claim in claims:
            claim.host, claim.ip_address = None, None
        return "gone", {}


def _host_order(tried: list[str]) -> list:
    """The order the allocator takes free hosts in: hosts that already failed these claims last (when they are
    all that is left), before them hosts held back (a BMC that does not answer: hosts.capacity), which the
    flow's BMC step would only confirm or clear; among the rest warm hosts first (hosts/flows/warm.py: on in the
    ramdisk, they skip power-on, boot and lookup), the longest warm first."""
    return [Case(When(name__in=list(tried), then=2), When(not_allocatable_q(), then=1), default=0),
            Case(When(state=HostState.CHECKING, then=1), default=0),  # an idle check is pre-empted last
            F("warm_since").asc(nulls_last=True), "pk"]


def _bind(hosts: list[BareMetalHost], claims: list[NodeClaim], node_type: NodeType, actor: str,
          message: str) -> None:
    """Hosts to provisioning and each claim to its host, in the caller's transaction (hosts locked by it)."""
    tenant_of = {h.pk: c.tenant_id for h, c in zip(hosts, claims)}
    _hosts_to_provisioning(hosts, actor=actor, reason=f"allocated to a {node_type.name} claim", tenant_ids=tenant_of)
    for host, claim in zip(hosts, claims):
        claim.host, claim.host_name, claim.node_type = host, host.name, node_type
        claim.attempts += 1
    _link_claims_to_hosts(claims)
    claims_transition(claims=claims, to_phase=P.PROVISIONING, actor=actor, reason="Scheduled", message=message,
                      fields={"node_type": node_type, "attempts": F("attempts") + 1},
                      event_messages={c.pk: f"host {c.host_name} ({node_type.name})" for c in claims})
    _say_retried(claims, node_type.name)


def _allocate_in_place(where: tuple, claims: list[NodeClaim], candidates: list[NodeType], tried: tuple[str, ...],
                       actor: str) -> tuple[dict[str, str], tuple[str, str] | None]:
    """Claims whose hosts must sit in one place, taken one by one (a partial answer is fine): a group's new
    member (Replace) on the group's rail group; a pool with `topology` where its nodes already are, else in
    the domain with room for all of them (best fit), else the largest."""
    kind, owner = where
    shares = tuple(owner.shares) if kind == "member" else owner.shared_topology()
    allocated: dict[str, str] = {}
    no_address: dict[int, str] = {}
    domain = owner.domain() if kind == "member" else None
    excluded = tried if tried and _another_host_may_free_up(candidates, "", tried) else ()
    for node_type in candidates:
        if not claims:
            break
        with transaction.atomic():
            if kind == "pool":
                # One allocation per pool at a time, so that two workers do not start it on two domains.
                NodePool.objects.select_for_update(no_key=True).filter(pk=owner.pk).exists()
                domain = domain or _pool_domain(owner, shares)
            by_domain = _free_by_domain(node_type, shares, excluded=excluded, tried_last=tried)
            if domain is None and by_domain:
                fits = [(len(pks), d) for d, pks in by_domain.items() if len(pks) >= len(claims)]
                domain = min(fits)[1] if fits else max((len(pks), d) for d, pks in by_domain.items())[1]
            if domain is None:
                continue
            taken = _allocate_group(claims, node_type, "", actor, excluded=excluded, only=by_domain.get(domain, []),
                                    no_address=no_address)
        for claim in claims[:taken]:
            allocated[claim.name] = claim.host_name
        claims = claims[taken:]
        if no_address:
            break
    if not claims:
        return allocated, None
    if no_address:
        return allocated, (NO_ADDRESS, no_address.get(claims[0].pk) or next(iter(no_address.values())))
    if kind == "member":
        return allocated, ("NoCapacity", (f"group {owner.name} needs {len(claims)} more on "
                                          f"{_domain_name(shares, domain)} ({owner.on_member_failure}); "
                                          f"no free host of {_types(candidates)} there"))
    words = SHARES_WORDS.get(shares, ("together", "group"))[0]
    if domain is None:
        kinds = "a rail group" if "rail_group" in shares else "a rack"
        return allocated, ("NoCapacity", (f"pool {owner.name} keeps its nodes {words}; no free host of "
                                          f"{_types(candidates)} has {kinds} label"))
    return allocated, ("NoCapacity", (f"pool {owner.name} keeps its nodes {words} ({_domain_name(shares, domain)}); "
                                      f"no free host of {_types(candidates)} there"))


def _pool_domain(pool: NodePool, shares: tuple[str, ...]) -> tuple[str, ...] | None:
    """Where the pool's nodes are: the domain of most of its serving hosts (then the first by name)."""
    counts: dict[tuple, int] = defaultdict(int)
    serving = (NodeClaim.objects.filter(pool=pool, host__isnull=False).exclude(phase__in=[P.RELEASING, P.RELEASED])
               .values_list("host__labels", flat=True))
    for labels in serving:
        topology = host_topology(labels)
        domain = tuple(getattr(topology, key) for key in shares)
        if all(domain):
            counts[domain] += 1
    if not counts:
        return None
    return min(counts, key=lambda d: (-counts[d], d))


# States from which a host comes back to the pool by itself (no admin needed).
ON_ITS_WAY = (HostState.AVAILABLE, HostState.DEPROVISIONING, HostState.INSPECTING, HostState.REGISTERING)


def _another_host_may_free_up(candidates: list[NodeType], pinned: str, tried: tuple[str, ...]) -> bool:
    """A host of these types that did not fail the claim is available, or will be (cleaning, inspecting)."""
    match = Q()
    for node_type in candidates:
        match |= label_selector_q(node_type.host_selector)
    others = BareMetalHost.objects.filter(match, state__in=ON_ITS_WAY).exclude(name__in=tried)
    return (others.filter(name=pinned) if pinned else others).exists()


# A host under its idle health check is free: a claim pre-empts the check (the host is taken after the available
# ones: _host_order).
FREE_STATES = tuple(sorted(FREE))


def _hosts_to_provisioning(hosts: list[BareMetalHost], *, actor: str, reason: str, tenant_ids: dict) -> None:
    """The allocated hosts to provisioning, a batch per state they are in (an idle check is abandoned)."""
    for state in FREE_STATES:
        batch = [h for h in hosts if h.state == state]
        if batch:
            hosts_transition_batch(hosts=batch, to_state=HostState.PROVISIONING, actor=actor, tenant_ids=tenant_ids,
                                   reason=reason + ("; its idle health check is abandoned"
                                                    if state == HostState.CHECKING else ""))


def free_hosts(node_type: NodeType, *, excluded: tuple[str, ...] = ()):
    """The available hosts of a type the allocator may take (both paths: one by one and whole groups); what must
    never be allocated is left out here, once."""
    return (BareMetalHost.objects.filter(label_selector_q(node_type.host_selector), state__in=FREE_STATES)
            .exclude(name__in=excluded)
            .exclude(NEVER_ALLOCATED))  # a red preflight: never (hosts/preflight.py)


def _allocate_group(claims: list[NodeClaim], node_type: NodeType, pinned: str, actor: str, tries: int = 3,
                    excluded: tuple[str, ...] = (), no_address: dict | None = None,
                    only: list[int] | None = None) -> int:
    """Allocate up to len(claims) hosts of one type to these claims (not the `excluded` ones; `only` these
    hosts, when given); returns how many got one."""
    for _ in range(tries):
        try:
            with transaction.atomic():
                environments_lock(claims)  # before the hosts: one allocation at a time per environment (IPAM)
                free = free_hosts(node_type, excluded=excluded)
                if pinned:
                    free = free.filter(name=pinned)
                if only is not None:
                    free = free.filter(pk__in=only)
                tried = sorted({name for claim in claims for name in claim.failed_hosts})
                hosts = list(free.select_for_update(skip_locked=True, of=("self",))
                             .order_by(*_host_order(tried))[: len(claims)])
                if not hosts:
                    return 0
                # Each claim's address in this same transaction; one that cannot get one takes no host.
                chosen, hosts, short = addresses_take(claims=claims[: len(hosts)], hosts=hosts, actor=actor)
                if short and no_address is not None:
                    no_address.update(short)
                if not chosen:
                    return 0
                tenant_of = {h.pk: c.tenant_id for h, c in zip(hosts, chosen)}
                _hosts_to_provisioning(hosts, actor=actor, reason=f"allocated to a {node_type.name} claim",
                                       tenant_ids=tenant_of)
                for host, claim in zip(hosts, chosen):
                    claim.host, claim.host_name, claim.node_type = host, host.name, node_type
                    claim.attempts += 1
                _link_claims_to_hosts(chosen)
                claims_transition(claims=chosen, to_phase=P.PROVISIONING, actor=actor, reason="Scheduled",
                                  message=f"a {node_type.name} host was allocated",
                                  fields={"node_type": node_type, "attempts": F("attempts") + 1},
                                  event_messages={c.pk: f"host {c.host_name} ({node_type.name})" for c in chosen})
                _say_retried(chosen, node_type.name)
                return len(chosen)
        except ConcurrentTransition:
            for claim in claims:
                claim.host, claim.ip_address = None, None
                if no_address is not None:
                    no_address.pop(claim.pk, None)
            continue
    return 0


def _link_claims_to_hosts(claims: list[NodeClaim]) -> None:
    """Set each claim's host in one statement. Django's bulk_update writes a CASE per row, which costs
    seconds for a thousand claims on PostgreSQL; UPDATE … FROM (VALUES …) costs milliseconds."""
    if connection.vendor != "postgresql":
        NodeClaim.objects.bulk_update(claims, ["host", "host_name"])
        return
    rows = ", ".join(["(%s, %s, %s)"] * len(claims))
    params = [value for c in claims for value in (c.pk, c.host_id, c.host_name)]
    table = NodeClaim._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} AS c SET host_id = v.host_id, host_name = v.host_name "
                       f"FROM (VALUES {rows}) AS v(id, host_id, host_name) WHERE c.id = v.id", params)


def _requirements_key(requirements: list[dict]) -> tuple:
    return tuple(sorted((p, op, tuple(v)) for p, op, v in map(normalize_requirement, requirements)))


def _describe(requirements: list[dict]) -> str:
    parts = []
    for prop, op, values in map(normalize_requirement, requirements):
        parts.append(f"{prop}={values[0]}" if op == "" else f"{prop} {op} {','.join(values)}".strip())
    return "; ".join(parts) or "(no selector)"


def _say_retried(claims: list[NodeClaim], node_type: str) -> None:
    """A claim given another host after one failed it says so: "allocated" alone would hide the failure its
    page shows (one update per retried claim; first attempts keep the batch's message)."""
    for claim in claims:
        if claim.attempts > 1:
            failed = ", ".join(claim.failed_hosts)
            claim.message = (f"a {node_type} host was allocated: {claim.host_name}, attempt {claim.attempts}"
                             + (f" ({failed} failed it before)" if failed else " (the attempt before failed)"))
            NodeClaim.objects.filter(pk=claim.pk).update(message=claim.message)


def _no_capacity_message(candidates: list[NodeType], capacity: dict, pinned: str) -> str:
    parts = [f"{t.name}: {capacity[t.pk]['available']} of {capacity[t.pk]['total']} available" for t in candidates]
    noun = "type" if len(candidates) == 1 else "types"
    where = f" named {pinned}" if pinned else ""
    red = preflight_held_back(candidates)
    held = f"; preflight red, not allocated: {', '.join(red)}" if red else ""
    if len(candidates) == 1:
        return f"no free host{where} of type {candidates[0].name}: " + parts[0].split(": ", 1)[1] + held
    return f"no free host{where} of {noun} " + "; ".join(parts) + held


def allocate_soon() -> None:
    """A host joined the free pool: pending claims may take it now rather than at the next beat."""
    if NodeClaim.objects.filter(phase=P.PENDING).exists():
        task_send_on_commit(RECONCILE_TASK, pool_ids=None)


# --- what claims do when pools and tenants go (registered with pools.services when the app starts) ----------

def pool_claims_release(*, pool: NodePool, actor: str) -> None:
    """A pool goes: its live claims are released (drain, delete the Node, erase the host)."""
    claims_release(claims=list(pool.claims.filter(phase__in=list(LIVE))), actor=actor,
                   reason=f"pool {pool.name} deleted")


def tenants_finalize(*, tenant_ids: list[int] | None = None, actor: str = "system:reconciler") -> list[str]:
    """Delete the tenants being deleted whose claims are all Released (the claims go with them; the Event
    log keeps their story). Locked rows are skipped: whoever holds them finalises."""
    deleting = Tenant.objects.filter(deleting_since__isnull=False)
    if tenant_ids is not None:
        deleting = deleting.filter(pk__in=tenant_ids)
    if not deleting.exists():  # the common case: one cheap query
        return []
    holding = NodeClaim.objects.filter(tenant=OuterRef("pk")).exclude(phase="Released")
    with transaction.atomic():
        gone = []
        for tenant in deleting.exclude(Exists(holding)).select_for_update(skip_locked=True):
            fabric_partitions_release(tenant=tenant, actor=actor)
            tenant.claims.all().delete()
            link = copy.copy(tenant)  # the Event names the tenant by id once the row is gone
            object_delete(tenant, actor=actor, object_type=ObjectType.TENANT, tenant=link)
            gone.append(link.name)
        return gone
