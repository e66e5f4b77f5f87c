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
from hosts.lifecycle import ConcurrentTransition
from hosts.models import BareMetalHost
from hosts.services import hosts_transition_batch
from pools.choices import PoolKind
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
from .models import NodeClaim
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


@retry_on_deadlock(also=(ConcurrentTransition,))  # claims that moved meanwhile: look again
def pools_reconcile(*, pool_ids: list[int] | None = None, actor: str = "system:reconciler") -> ReconcileResult:
    """For each static pool, desired quantity vs live claims: create or release the difference,
    then allocate hosts to pending claims. Safe to run at any time, from any number of workers."""
    result = ReconcileResult()
    with transaction.atomic():
        pools = NodePool.objects.filter(kind=PoolKind.STATIC)
        if pool_ids is not None:
            pools = pools.filter(pk__in=pool_ids)
        # Lock the pools so that two reconciles of one pool cannot both create its missing claims. FOR NO KEY
        # UPDATE: an allocation moving one of their claims checks the claim's pool key (FOR KEY SHARE) and
        # must not wait for us while we wait for that claim.
        locked = list(pools.select_for_update(no_key=True).order_by("pk").values_list("pk", flat=True))
        pools = list(NodePool.objects.filter(pk__in=locked).select_related("tenant", "provider").order_by("pk")
                     .annotate(live=Count("claims", filter=Q(claims__phase__in=list(LIVE)))))
        growing = [(p, p.quantity - p.live) for p in pools if p.quantity > p.live]
        shrinking = {p.pk: p.live - p.quantity for p in pools if p.quantity < p.live}
        if growing:
            result.created = [c.name for c in _claims_create(growing, actor)]
        if shrinking:
            candidates = defaultdict(list)
            for claim in NodeClaim.objects.filter(pool_id__in=list(shrinking), phase__in=list(LIVE)):
                candidates[claim.pool_id].append(claim)
            doomed = []
            for pool_id, surplus in shrinking.items():
                ordered = sorted(candidates[pool_id],
                                 key=lambda c: (RELEASE_ORDER[c.phase], c.host_id is not None, -c.created_at.timestamp()))
                doomed += ordered[:surplus]
            claims_release(claims=doomed, actor=actor, reason="pool shrank")
            result.released = [c.name for c in doomed]
    allocation = claims_allocate(pool_ids=pool_ids, actor=actor)
    result.allocated, result.pending = allocation.allocated, allocation.pending
    if pool_ids is None:  # the periodic full pass also finishes tenant deletions (a release usually does)
        result.tenants_deleted = tenants_finalize(actor=actor)
    return result


def _claims_create(growing: list[tuple[NodePool, int]], actor: str, *, node_type: NodeType | None = None,
                   message: str = "", launch_deadline_at=None) -> list[NodeClaim]:
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
                  node_type=node_type, reason="Created", message="waiting for a host",
                  launch_deadline_at=launch_deadline_at)
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
def claim_host_lost(*, claim: NodeClaim, reason: str, actor: str, claim_reason: str = "") -> NodeClaim:
    """The claim's host failed (error, deadline): free the claim and try another host, until CLAIM_MAX_ATTEMPTS
    distinct hosts failed it. `claim_reason`: the claim itself caused the failure (its image): it fails with
    that reason, and the host is not counted against it. Its join token, if any, is deleted by a task."""
    cap = settings.CLAIM_MAX_ATTEMPTS
    blamed = claim.host_name and not claim_reason
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
    elif len(set(failed)) >= cap:
        claims_transition(claims=[claim], to_phase=P.FAILED, actor=actor, reason="RetriesExhausted",
                          message=f"gave up after {claim.attempts} attempt(s); last: {reason}", fields=fields)
    else:
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason="HostFailed",
                          message=f"{reason}; trying another host ({len(set(failed))} of {cap} failed it)",
                          fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    token_id = claim.bootstrap_token_id
    if token_id:  # network I/O: after commit, in a worker
        task_send_on_commit("claims.tasks.revoke_join_token", claim_id=claim.pk, token_id=token_id)
    claim.host = None
    return claim


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
    groups = defaultdict(list)
    environments = environments_of(pending)  # a group shares one NodeEnvironment: its addresses (claims.ipam)
    no_address = {}  # claim id → why it waits for an address (filled by _allocate_group)
    for claim in pending:
        if claim in waiting:
            continue
        pinned = claim.properties.get(SERVER_NAME_PROPERTY, "")
        env = environments[claim.pk]
        key = (claim.provider_id, _requirements_key(claim.requirements), pinned, tuple(sorted(set(claim.failed_hosts))),
               env.pk if env else None)
        groups[key].append(claim)
    for (provider_id, _, pinned, tried, _env), claims in groups.items():
        candidates = [t for t in node_types if t.provider_id == provider_id
                      and requirements_match(claims[0].requirements, t.effective_properties())]
        if not candidates:
            msg = f"no NodeType matches {_describe(claims[0].requirements)}"
            waiting.update({c: ("NoNodeType", msg) for c in claims})
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
    for claim, (reason, msg) in waiting.items():
        result.pending[claim.name] = msg
        if (claim.reason, claim.message) != (reason, msg):
            by_message[(reason, msg)].append(claim.pk)
    for (reason, msg), ids in by_message.items():
        NodeClaim.objects.filter(pk__in=ids, phase=P.PENDING).update(reason=reason, message=msg)
    return result


# States from which a host comes back to the pool by itself (no admin needed).
ON_ITS_WAY = (HostState.AVAILABLE, HostState.DEPROVISIONING, HostState.INSPECTING, HostState.REGISTERING)


def _another_host_may_free_up(candidates: list[NodeType], pinned: str, tried: tuple[str, ...]) -> bool:
    """A host of these types that did not fail the claim is available, or will be (cleaning, inspecting)."""
    match = Q()
    for node_type in candidates:
        match |= label_selector_q(node_type.host_selector)
    others = BareMetalHost.objects.filter(match, state__in=ON_ITS_WAY).exclude(name__in=tried)
    return (others.filter(name=pinned) if pinned else others).exists()


def _allocate_group(claims: list[NodeClaim], node_type: NodeType, pinned: str, actor: str, tries: int = 3,
                    excluded: tuple[str, ...] = (), no_address: dict | None = None) -> int:
    """Allocate up to len(claims) hosts of one type to these claims (not the `excluded` ones); returns how
    many got one."""
    for _ in range(tries):
        try:
            with transaction.atomic():
                environments_lock(claims)  # before the hosts: one allocation at a time per environment (IPAM)
                free = BareMetalHost.objects.filter(label_selector_q(node_type.host_selector),
                                                    state=HostState.AVAILABLE).exclude(name__in=excluded)
                free = free.exclude(NEVER_ALLOCATED)  # a red preflight: never (hosts/preflight.py)
                if pinned:
                    free = free.filter(name=pinned)
                # Hosts that already failed one of these claims come last (when they are all that is left), and
                # before them hosts held back (a BMC that does not answer: hosts.capacity), which the flow's BMC
                # step would only confirm or clear.
                tried = sorted({name for claim in claims for name in claim.failed_hosts})
                order = [Case(When(name__in=tried, then=2), When(not_allocatable_q(), then=1), default=0), "pk"]
                hosts = list(free.select_for_update(skip_locked=True, of=("self",)).order_by(*order)[: len(claims)])
                if not hosts:
                    return 0
                # Each claim's address in this same transaction; one that cannot get one takes no host.
                chosen, hosts, short = addresses_take(claims=claims[: len(hosts)], hosts=hosts, actor=actor)
                if short and no_address is not None:
                    no_address.update(short)
                if not chosen:
                    return 0
                tenant_of = {h.pk: c.tenant_id for h, c in zip(hosts, chosen)}
                hosts_transition_batch(hosts=hosts, to_state=HostState.PROVISIONING, actor=actor,
                                 reason=f"allocated to a {node_type.name} claim", tenant_ids=tenant_of)
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
