"""Decisions of dynamic pools: a tenant's Pending pods in, claims out (autonodes.simulation decides), each decision
recorded as an Event; and the pods of a claim that ended without serving them back to the demand."""
from __future__ import annotations

import functools
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from claims.choices import ClaimPhase as P
from claims.models import NodeClaim
from claims.reconcile import ClaimsAsk, claim_group_create, claims_create_many, reconcile_soon
from claims.selectors import (LaunchDeadline, group_free_domains, group_where, held_for_others_q, launch_deadlines,
                             pool_free_domain)
from core import live
from core.rows import rows_update
from core.tasks import task_send_on_commit
from core.transactions import retry_on_deadlock
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record
from hosts.lifecycle import FREE
from hosts.models import BareMetalHost
from pools.choices import PoolKind
from pools.matching import label_selector_q, requirements_match
from pools.models import NodePool, NodeType, Tenant

from . import task_names
from .choices import DecisionReason, DemandStatus, WatchState
from .demand import SEEN_READY_AFTER, turned_away, turned_away_from
from .fit import Demand, add_resources, format_quantity, quantities, short_of
from .live import demand_changed
from .models import NodeUsage, PendingPod, TenantWatch
from .simulation import (
    Node,
    PodDemand,
    PoolOption,
    Problem,
    TypeOption,
    Verdict,
    is_extended,
    simulate,
    with_undeclared,
)

log = logging.getLogger(__name__)

ACTOR = "system:autonodes"
# Claims that hold (or will hold) a node: they count against a pool's limits and the tenant's quota.
ACTIVE = (P.PENDING, P.PROVISIONING, P.JOINING, P.AVAILABLE, P.RELEASING)
# Claims a Pending pod may still land on: in flight, or Ready.
IN_FLIGHT = (P.PENDING, P.PROVISIONING, P.JOINING)
OPEN = (*IN_FLIGHT, P.AVAILABLE)
# A node's use read this long after it was Ready tells whether the pods launched for it still fit there: by then a pod
# the scheduler bound to it has left the demand (the watcher), so its requests are not taken for another pod's.
TAKEN_AFTER = timedelta(seconds=5)


def decide_soon(*, tenant_ids: list[int]) -> None:
    """A decision for the tenants, in one pass, once the current transaction commits (a worker runs it)."""
    task_send_on_commit(task_names.DECIDE, tenant_ids=sorted(tenant_ids))


@dataclass
class Decision:
    """What one tenant_decide did: claim → its pods, pod → claim it fits on, pod → why it waits / is not served."""

    launched: dict[str, list[str]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)  # all-or-nothing group asked for → its claims
    placed: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, str] = field(default_factory=dict)
    unservable: dict[str, str] = field(default_factory=dict)
    skipped: str = ""  # why nothing was decided
    events: int = 0
    claims_per_type: dict[int, int] = field(default_factory=dict)  # NodeType id → claims made (tenants_decide)
    pool_ids: list[int] = field(default_factory=list)  # pools given claims, allocated after the pass


def daemonset_overhead() -> dict[str, float]:
    """What daemonset pods take on every node (settings.AUTONODES_DAEMONSET_OVERHEAD: one setting for all pools,
    as the console does not watch the tenants' DaemonSets)."""
    return quantities(settings.AUTONODES_DAEMONSET_OVERHEAD)


def _demand(pod: PendingPod) -> Demand:
    return Demand(requests=quantities(pod.requests), node_selector=dict(pod.node_selector or {}),
                  node_affinity=list(pod.node_affinity or []), tolerations=list(pod.tolerations or []))


def tenant_decide(*, tenant_id: int, actor: str = ACTOR) -> Decision:
    """Decide for the tenant's undecided Pending pods (new, waiting, launched on a claim that is gone, and
    unservable ones when a pool or NodeType changed since): create the claims of the dynamic pools that serve
    them, and say per pod what was decided. Idempotent: pods launched on a live claim stay launched on it,
    so a second call on the same demand creates nothing. Reads and writes the database only (no tenant API).
    A pass of one tenant (tenants_decide)."""
    return tenants_decide(tenant_ids=[tenant_id], actor=actor)[tenant_id]


def tenants_decide(*, tenant_ids: list[int], actor: str = ACTOR) -> dict[int, Decision]:
    """A pass of decisions: each tenant's as tenant_decide, one after the other, each under its own lock and in
    its own transaction. What the fleet shares (the NodeTypes, their free hosts, their launch deadlines) is read
    once for the pass, and the free hosts are reduced by what each decision launched once it is committed, so no
    two tenants of the pass are promised the same free host. The allocation of the claims made and the live
    pages' messages go out once, after the last decision. A tenant whose decision fails does not stop the
    others: the first failure is raised at the end (at once for a pass of one)."""
    tenant_ids = list(dict.fromkeys(tenant_ids))
    if not tenant_ids:
        return {}
    fleet = Fleet()
    decisions: dict[int, Decision] = {}
    failure: Exception | None = None
    with live.held():  # every decision's messages in one hand-off, after the pass
        try:
            for tenant_id in tenant_ids:
                try:
                    decision = _tenant_decide(tenant_id=tenant_id, fleet=fleet, actor=actor)
                except Exception as exc:
                    if len(tenant_ids) == 1:
                        raise
                    log.exception("the decision for tenant %s failed; the pass goes on", tenant_id)
                    failure = failure or exc
                    continue
                fleet.took(decision)
                decisions[tenant_id] = decision
        finally:
            if fleet.pool_ids:  # one allocation for every pool given claims (on commit, inside a transaction)
                pool_ids = list(fleet.pool_ids)
                transaction.on_commit(lambda: reconcile_soon(pool_ids=pool_ids))
    if failure is not None:
        raise failure
    return decisions


class Fleet:
    """What a pass of decisions reads once for all its tenants: the NodeTypes (with their providers, resources
    and properties parsed), their free hosts and launch deadlines (at the first decision that needs them); the
    free hosts then less the claims each decision of the pass made, as reading them again would find (the pass
    sends no allocation before its end); the pools given claims, allocated after the pass."""

    def __init__(self) -> None:
        self.read_at = timezone.now()
        self.node_types = list(NodeType.objects.select_related("provider").order_by("pk"))
        self.resources = {t.pk: quantities(t.resources) for t in self.node_types}
        self.properties = {t.pk: t.effective_properties() for t in self.node_types}
        self.type_by_pk = {t.pk: t for t in self.node_types}
        self.providers = {t.provider_id: t.provider for t in self.node_types}
        self.changed = max((t.updated_at for t in self.node_types), default=None)
        self.pool_ids: dict[int, None] = {}
        self._free: dict[int, int | None] | None = None
        self._deadlines: dict[int, LaunchDeadline] | None = None

    def free_hosts(self) -> dict[int, int | None]:
        if self._free is None:
            self._free = _free_hosts(self.node_types)
        return self._free

    def deadlines(self) -> dict[int, LaunchDeadline]:
        if self._deadlines is None:
            self._deadlines = launch_deadlines(self.node_types)
        return self._deadlines

    def took(self, decision: Decision) -> None:
        """A decision of the pass committed: its new claims wait for free hosts of their types."""
        self.pool_ids.update(dict.fromkeys(decision.pool_ids))
        if self._free is None:
            return  # not read yet: the first read counts them (they are Pending claims without a host)
        for type_id, count in decision.claims_per_type.items():
            if self._free.get(type_id) is not None:
                self._free[type_id] = max(0, self._free[type_id] - count)


@functools.cache
def _statements() -> dict[str, str]:
    """The decision's own reads, in SQL: the ORM's compilation of a statement cost more than running it, at
    every tenant (Model.objects.raw still makes the rows models, with the fields' own conversions)."""
    tenant, watch = Tenant._meta.db_table, TenantWatch._meta.db_table
    lock = " FOR NO KEY UPDATE OF t" if connection.features.has_select_for_no_key_update else ""
    active = ", ".join(["%s"] * len(ACTIVE))
    return {
        # The tenant's row FOR NO KEY UPDATE (OF t: the lock is the tenant's alone), with its watcher's state.
        # The columns a decision uses; the others (its kubeconfig) load if ever asked for.
        "tenant": f"SELECT t.id, t.name, t.namespace, t.quota_nodes, t.provider_properties, t.deleting_since, "
                  f"w.state AS watch_state FROM {tenant} t LEFT JOIN {watch} w ON w.tenant_id = t.id "
                  f"WHERE t.id = %s{lock}",
        "pods": f"SELECT * FROM {PendingPod._meta.db_table} WHERE tenant_id = %s ORDER BY seen_at, id",
        "pools": f"SELECT * FROM {NodePool._meta.db_table} WHERE tenant_id = %s AND kind = %s ORDER BY id",
        "claims": f"SELECT * FROM {NodeClaim._meta.db_table} WHERE tenant_id = %s AND phase IN ({active})",
    }


@retry_on_deadlock()
def _tenant_decide(*, tenant_id: int, fleet: Fleet, actor: str) -> Decision:
    result = Decision()
    sql = _statements()
    with transaction.atomic():
        # One decision at a time per tenant: the tenant's row FOR NO KEY UPDATE, the first lock of the project's
        # order (core/transactions.py: tenant → pools → hosts → claims). A second decision waits here and then
        # sees the first one's pods as launched. NO KEY: the claims and Events inserted below (here and
        # elsewhere) check the tenant's key with FOR KEY SHARE, which this lock does not block.
        tenant = next(iter(Tenant.objects.raw(sql["tenant"], [tenant_id])), None)
        if tenant is None or tenant.deleting_since is not None:
            result.skipped = "tenant gone or being deleted"
            return result
        pods = list(PendingPod.objects.raw(sql["pods"], [tenant_id]))
        if not pods:
            return result
        if tenant.watch_state == WatchState.BACKING_OFF:
            # Its API is down: what we know of its pods may be stale, so nothing is decided until it is back.
            why = "not decided: the tenant's API is unreachable; decisions resume when the watch reconnects"
            PendingPod.objects.filter(tenant=tenant, status__in=[DemandStatus.NEW, DemandStatus.WAITING]).exclude(
                reason=why).update(reason=why)
            demand_changed(tenant_id=tenant.pk)
            result.skipped = why
            return result
        pools = list(NodePool.objects.raw(sql["pools"], [tenant_id, PoolKind.DYNAMIC.value]))
        for pool in pools:
            pool.tenant = tenant  # the row locked above: the claims made below name it
            if pool.provider_id in fleet.providers:
                pool.provider = fleet.providers[pool.provider_id]
        node_types = fleet.node_types
        claims = list(NodeClaim.objects.raw(sql["claims"], [tenant_id, *ACTIVE]))
        # Their NodeTypes and dynamic pools are the rows already read: joining them again costs more than the claims do.
        type_by_pk, pool_by_pk = fleet.type_by_pk, {p.pk: p for p in pools}
        for claim in claims:
            if claim.node_type_id in type_by_pk:
                claim.node_type = type_by_pk[claim.node_type_id]
            if claim.pool_id in pool_by_pk:
                claim.pool = pool_by_pk[claim.pool_id]
        open_claims = {c.pk: c for c in claims if c.phase in OPEN}
        # What runs on the Ready nodes of dynamic pools (autonodes.disruption keeps it): nothing to read while every
        # node is on its way.
        ready_ids = [pk for pk, c in open_claims.items() if c.phase == P.AVAILABLE]
        usage = ({u.claim_id: u for u in NodeUsage.objects.filter(claim_id__in=ready_ids, checked_at__isnull=False)}
                 if ready_ids else {})
        changed = max([p.updated_at for p in pools] + ([fleet.changed] if fleet.changed else []), default=None)

        kept, undecided = [], []
        unbound = timezone.now() - timedelta(seconds=settings.AUTONODES_BIND_GRACE_S)
        for pod in pods:
            if pod.status == DemandStatus.LAUNCHED and pod.claim_id in open_claims:
                claim = open_claims[pod.claim_id]
                if claim.phase == P.AVAILABLE and claim.available_at and (
                        (claim.available_at < unbound and (pod.decided_at is None or pod.decided_at < unbound))
                        or _taken(pod, claim, usage.get(claim.pk)) or turned_away_from(pod, claim)):
                    # Its node is Ready and the scheduler still did not place it (it gave the node to other pods,
                    # or could not): look again.
                    undecided.append(pod)
                else:
                    kept.append(pod)
            elif pod.status == DemandStatus.UNSERVABLE:
                if pod.decided_at is None or (changed is not None and changed > pod.decided_at):
                    undecided.append(pod)
            else:
                undecided.append(pod)
        if not undecided:
            return result

        problem = _problem(tenant, undecided, kept, pools, fleet, claims, open_claims, usage)
        outcome = simulate(problem)
        now = timezone.now()
        by_key = {f"{p.namespace}/{p.name}": p for p in undecided}
        pool_of = {p.name: p for p in pools}
        type_of = {t.name: t for t in node_types}
        events: list[Event] = []
        deadlines = fleet.deadlines() if outcome.launches or outcome.groups else {}

        # New nodes: claims for every pool and NodeType in one claims_create_many, one Event per pool and NodeType
        # (written with the claims' own and the verdicts' in one insert, at the end).
        groups: dict[tuple[str, str], list[list[str]]] = defaultdict(list)
        for launch in outcome.launches:
            groups[(launch.pool, launch.node_type)].append(launch.pods)
        answered: list[PendingPod] = []  # written in one statement below
        launches = []  # (pool, NodeType, its nodes' pods, all those pods, the decision's message)
        for (pool_name, type_name), nodes in groups.items():
            members = [by_key[k] for keys in nodes for k in keys]
            launches.append((pool_of[pool_name], type_of[type_name], nodes, members,
                             f"added {len(nodes)} {type_name} for {_owners(members)}: {_describe(members)}"))
        # The pass allocates every pool given claims once, after its last decision (tenants_decide).
        made = claims_create_many(asks=[
            ClaimsAsk(pool=pool, count=len(nodes), node_type=node_type, message=f"{pool.name}: {message}",
                      launch_deadline=deadlines[node_type.pk])
            for pool, node_type, nodes, _members, message in launches], actor=actor, events=events, reconcile=False)
        for (pool, node_type, nodes, members, message), created in zip(launches, made):
            result.pool_ids.append(pool.pk)
            result.claims_per_type[node_type.pk] = result.claims_per_type.get(node_type.pk, 0) + len(created)
            for claim, keys in zip(created, nodes):
                result.launched[claim.name] = list(keys)
                answered += _answer([by_key[k] for k in keys], claim=claim, now=now,
                                    reason=f"a {node_type.name} node is being added for it (claim {claim.name})")
            events.append(Event(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=pool.name,
                                tenant_id=tenant.pk, actor=actor, message=message,
                                data={"reason": DecisionReason.LAUNCHED.value, "pool": pool.name,
                                      "node_type": node_type.name, "pods": sorted(str(m) for m in members),
                                      "claims": [c.name for c in created]}))

        # New groups (pools with group.size): one claim_group_create and one Event per group, naming it.
        for launch in outcome.groups:
            pool, node_type = pool_of[launch.pool], type_of[launch.node_type]
            members = [by_key[k] for keys in launch.nodes for k in keys]
            size = len(launch.nodes)
            where = f" on {launch.domain}" if launch.domain else ""
            message = (f"added a group of {size} {launch.node_type} for {_owners(members)}: {_describe(members)}"
                       f" (all or nothing{where})")
            created = claim_group_create(pool=pool, size=size, node_type=node_type, actor=actor,
                                         message=f"{pool.name}: {message}", launch_deadline=deadlines[node_type.pk])
            result.claims_per_type[node_type.pk] = result.claims_per_type.get(node_type.pk, 0) + len(created)
            group_name = created[0].group.name
            for claim, keys in zip(created, launch.nodes):
                result.launched[claim.name] = list(keys)
                answered += _answer([by_key[k] for k in keys], claim=claim, now=now,
                                    reason=f"a {launch.node_type} node is being added for it (claim {claim.name}, "
                                           f"group {group_name} of {size})")
            result.groups[group_name] = [c.name for c in created]
            events.append(Event(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=pool.name,
                                tenant_id=tenant.pk, actor=actor, message=f"{message}: group {group_name}",
                                data={"reason": DecisionReason.LAUNCHED.value, "pool": pool.name,
                                      "node_type": launch.node_type, "group": group_name, "size": size,
                                      "domain": launch.domain, "pods": sorted(str(m) for m in members),
                                      "claims": [c.name for c in created]}))

        # Pods that fit on a node that exists or is on its way: nothing launched; they wait for it.
        placed: dict[int, list[PendingPod]] = defaultdict(list)
        claim_named = {c.name: c for c in open_claims.values()}
        for key, claim_name in outcome.placed.items():
            claim = claim_named[claim_name]
            placed[claim.pk].append(by_key[key])
            result.placed[key] = claim_name
        for claim_id, members in placed.items():
            claim = open_claims[claim_id]
            where = "its node" if claim.phase == P.AVAILABLE else f"its node, on its way ({claim.phase})"
            answered += _answer(members, claim=claim, now=now,
                                reason=f"fits on claim {claim.name}: waits for {where}")
        rows_update(answered, ["status", "claim", "pool", "decided_at", "reason", "updated_at"])

        # Verdicts are dated when the NodeTypes they were judged against were read: a type changed since (during
        # the pass) is newer than them, and an unservable pod is looked at again.
        judged = min(now, fleet.read_at)
        events += _verdicts(tenant, outcome.waiting, DemandStatus.WAITING, by_key, pool_of, judged, actor)
        events += _verdicts(tenant, outcome.unservable, DemandStatus.UNSERVABLE, by_key, pool_of, judged, actor)
        rows_update([by_key[k] for k in (*outcome.waiting, *outcome.unservable)],
                    ["status", "claim", "pool", "reason", "decided_at"])
        result.waiting = {k: v.message for k, v in outcome.waiting.items()}
        result.unservable = {k: v.message for k, v in outcome.unservable.items()}
        events_record(events)
        result.events = len(events)
        demand_changed(tenant_id=tenant.pk)  # the pool pages (on commit)
    return result


def _verdicts(tenant: Tenant, verdicts: dict[str, Verdict], status: str, by_key: dict[str, PendingPod],
              pool_of: dict[str, NodePool], now, actor: str) -> list[Event]:
    """Answer waiting or unservable pods (on the objects: the caller writes them); an Event per (pool, reason)
    for the pods whose answer changed (so a pod that stays waiting, or stays unservable, is reported once, not
    at every decision)."""
    events = []
    groups: dict[tuple[str, str, str], list[PendingPod]] = defaultdict(list)
    for key, verdict in verdicts.items():
        groups[(verdict.pool, verdict.reason, verdict.message)].append(by_key[key])
    reported: dict[tuple[str, str], list[tuple[PendingPod, str]]] = defaultdict(list)
    for (pool_name, reason, message), members in groups.items():
        pool = pool_of.get(pool_name)
        for member in members:
            if (member.status, member.reason) != (status, message):
                reported[(pool_name, reason)].append((member, message))
            # The caller writes every verdict in one statement (updated_at untouched, as an update() leaves it).
            member.status, member.claim, member.pool = status, None, pool
            member.reason, member.decided_at = message, now
    for (pool_name, reason), members in reported.items():
        names = sorted(str(m) for m, _ in members)
        message = members[0][1]
        if len(members) > 1:
            message += f" ({len(members)} pods: {', '.join(names[:5])}{', …' if len(names) > 5 else ''})"
        # A pod no pool matches is the tenant's matter, not a pool's.
        where = (ObjectType.POOL, pool_name) if pool_name else (ObjectType.TENANT, tenant.name)
        events.append(Event(kind=EventKind.DECISION, object_type=where[0], object_name=where[1], tenant_id=tenant.pk,
                            actor=actor, message=message,
                            data={"reason": reason, "pool": pool_name or None, "pods": names, "claims": []}))
    return events


def _problem(tenant: Tenant, undecided: list[PendingPod], kept: list[PendingPod], pools: list[NodePool],
             fleet: Fleet, claims: list[NodeClaim], open_claims: dict[int, NodeClaim],
             usage: dict[int, NodeUsage]) -> Problem:
    overhead = daemonset_overhead()
    node_types, resources, properties = fleet.node_types, fleet.resources, fleet.properties
    dynamic_ids = {p.pk for p in pools}

    matching = {p.pk: [t for t in node_types if t.provider_id == p.provider_id
                       and requirements_match(p.node_type_selector, properties[t.pk])] for p in pools}
    free_hosts = fleet.free_hosts()

    of_pool: dict[int, list[NodeClaim]] = defaultdict(list)
    for claim in claims:
        if claim.pool_id in dynamic_ids:
            of_pool[claim.pool_id].append(claim)
    used = {pool_id: limits_counted(members, resources) for pool_id, members in of_pool.items()}
    options = []
    domains: dict[tuple, dict[str, int]] = {}  # (type, shares) → free hosts per rail group: pools of groups only
    for pool in pools:
        shares = pool.group_shares() if pool.group_size else ()
        for t in matching[pool.pk] if shares else ():
            if (t.pk, shares) not in domains:
                domains[(t.pk, shares)] = group_free_domains(t, shares)
        # A pool with topology and no group: only the free hosts where its nodes are kept count.
        in_place = {t.pk: pool_free_domain(pool, t) for t in matching[pool.pk]} if not shares else {}
        kept_where = ""
        if in_place and pool.shared_topology():
            where = next((d for d, _ in in_place.values() if d), "")
            kept_where = group_where(pool.shared_topology()) + (f" ({where})" if where else "")
        types = tuple(
            TypeOption(name=t.name, cost=t.effective_cost(), allocatable=resources[t.pk], properties=properties[t.pk],
                       free_hosts=(min(free_hosts[t.pk], in_place[t.pk][1])
                                   if in_place.get(t.pk) is not None and free_hosts[t.pk] is not None
                                   else free_hosts[t.pk]),
                       free_domains=domains.get((t.pk, shares)))
            for t in matching[pool.pk])
        options.append(PoolOption(name=pool.name, types=types, weight=pool.weight or 0,
                                  labels=dict(pool.node_labels or {}), taints=tuple(pool.taints or ()),
                                  limits=quantities(pool.limits), used=used.get(pool.pk, {}),
                                  group_size=pool.group_size, group_where=group_where(shares) if shares else "",
                                  kept_where=kept_where))

    # Capacity that exists: claims in flight (their node is coming) and Ready nodes of dynamic pools whose use
    # is known (autonodes.disruption keeps NodeUsage); less what is planned there (pods launched on them).
    planned: dict[int, dict[str, float]] = defaultdict(dict)
    for pod in kept:
        add_resources(planned[pod.claim_id], quantities(pod.requests))
    nodes = []
    for claim in sorted(open_claims.values(), key=lambda c: (c.created_at, c.pk)):
        if claim.node_type_id is None:
            continue  # its type is not chosen yet: what it will hold is unknown
        if claim.phase == P.AVAILABLE:
            if claim.pool_id not in dynamic_ids or claim.pk not in usage:
                continue  # what runs there is unknown; the tenant's scheduler has seen it anyway
            add_resources(planned[claim.pk], quantities(usage[claim.pk].requested))
        free = {k: v - overhead.get(k, 0.0) - planned[claim.pk].get(k, 0.0)
                for k, v in with_undeclared(resources[claim.node_type_id]).items()}
        nodes.append(Node(name=claim.name, pool=claim.pool_name, labels={**(claim.node_labels or {}),
                                                                         **properties[claim.node_type_id]},
                          taints=tuple(claim.taints or ()), free=free))

    quota_left = quota_nodes_left(tenant, claims, dynamic_ids)
    ready = [c for c in open_claims.values() if c.phase == P.AVAILABLE and c.available_at]
    pods = tuple(PodDemand(key=f"{p.namespace}/{p.name}", demand=_demand(p), owner=p.owner, gang=gang,
                           min_member=p.gang_min_member, not_on=_refused(p, ready))
                 for p, gang in _gangs(undecided, kept))
    return Problem(pods=pods, pools=tuple(options), nodes=tuple(nodes), overhead=overhead, quota_nodes_left=quota_left)


def limits_counted(claims: list[NodeClaim], resources: dict[int, dict[str, float]]) -> dict[str, float]:
    """What a pool's live claims (ACTIVE) count against its limits: a node each, and each its NodeType's
    resources (`resources`: type id → parsed resources); a claim whose type is not chosen yet counts a node only."""
    used: dict[str, float] = {}
    for claim in claims:
        used["nodes"] = used.get("nodes", 0.0) + 1
        if claim.node_type_id:
            add_resources(used, resources[claim.node_type_id])
    return used


def quota_nodes_left(tenant: Tenant, claims: list[NodeClaim], dynamic_ids: set[int]) -> int | None:
    """Nodes the tenant's quota still allows (None: it has none): the quota less what its static pools ask for,
    less its live claims (ACTIVE: `claims`) of dynamic pools (`dynamic_ids`) or of no pool."""
    if tenant.quota_nodes is None:
        return None
    static = sum(q or 0 for q in NodePool.objects.filter(tenant=tenant, kind=PoolKind.STATIC)
                 .values_list("quantity", flat=True))
    dynamic = sum(1 for c in claims if c.pool_id is None or c.pool_id in dynamic_ids)
    return tenant.quota_nodes - static - dynamic


def _gangs(undecided: list[PendingPod], kept: list[PendingPod]) -> list[tuple[PendingPod, str]]:
    """Each undecided pod with the gang it is placed with ("" alone). A gang's unit is minMember less its pods
    already launched (all its undecided pods when minMember is not known); pods beyond that are placed alone,
    as coscheduling lets them bind once minMember run. Fewer undecided than that: all of them, together (the
    others may be running: the console sees only Pending pods)."""
    launched = defaultdict(int)
    for pod in kept:
        if pod.gang:
            launched[pod.gang] += 1
    members: dict[str, list[PendingPod]] = defaultdict(list)
    for pod in undecided:
        if pod.gang:
            members[pod.gang].append(pod)
    together: set[int] = set()
    for gang, pods in members.items():
        need = pods[0].gang_min_member
        unit = pods if not need else sorted(pods, key=lambda p: (p.namespace, p.name))[:max(need - launched[gang], 0)]
        together.update(p.pk for p in unit)
    return [(p, p.gang if p.pk in together else "") for p in undecided]


def _taken(pod: PendingPod, claim: NodeClaim, usage: NodeUsage | None) -> bool:
    """Whether the Ready node launched for this Pending pod no longer has room for it: the tenant's scheduler picks
    pods in its own order and gave the node to another (one that was waiting, say). Without this the pod would say
    "a node is being added for it" until AUTONODES_BIND_GRACE_S."""
    if usage is None or claim.node_type is None or usage.checked_at < claim.available_at + TAKEN_AFTER:
        return False
    overhead, used = daemonset_overhead(), quantities(usage.requested)
    free = {k: v - overhead.get(k, 0.0) - used.get(k, 0.0)
            for k, v in with_undeclared(quantities(claim.node_type.resources)).items()}
    return bool(short_of(quantities(pod.requests), free))


def _refused(pod: PendingPod, ready: list[NodeClaim]) -> frozenset[str]:
    """The Ready nodes (their claims' names) that the pod's scheduler found without room for it: every node it had
    seen when it said so. What is known of their use may be older than that."""
    if pod.scheduler_message_at is None or not turned_away(pod.scheduler_message):
        return frozenset()
    return frozenset(c.name for c in ready if c.available_at + SEEN_READY_AFTER <= pod.scheduler_message_at)


def _free_hosts(node_types: list[NodeType]) -> dict[int, int | None]:
    """Per type: its available hosts, less the claims (of any tenant) already waiting for one of that type. Two
    queries whatever the number of types. An external provider's type has no host here: its room instead
    (_external_room; None: no limit)."""
    if not node_types:
        return {}
    external = [t for t in node_types if t.provider.external]
    hosts = [t for t in node_types if not t.provider.external]
    free: dict[int, int | None] = _external_room(external)
    if not hosts:
        return free
    # A host held for a static pool's kept data is no dynamic pool's to count on (claims.selectors).
    available = BareMetalHost.objects.filter(state__in=list(FREE)).exclude(held_for_others_q(None)).aggregate(
        **{f"t{t.pk}": Count("pk", filter=label_selector_q(t.host_selector)) for t in hosts})
    promised = dict(NodeClaim.objects.filter(phase=P.PENDING, host__isnull=True, node_type__in=hosts)
                    .values_list("node_type").annotate(n=Count("pk")).values_list("node_type", "n"))
    free.update({t.pk: max(0, available[f"t{t.pk}"] - promised.get(t.pk, 0)) for t in hosts})
    return free


def _external_room(node_types: list[NodeType]) -> dict[int, int | None]:
    """An external provider's type (machines/): the maxCapacity its provider declares for it (kubeVirt,
    OpenTofu; none: no limit) less its claims not ended, whatever their tenant. Read from the database only: a
    decision holds the tenant's lock, and a kind's own answer (a Metal3 cluster's hosts) is network I/O, which
    machines.services.claims_fill asks outside any transaction before it makes a machine."""
    if not node_types:
        return {}
    live = dict(NodeClaim.objects.filter(phase__in=ACTIVE, node_type__in=node_types).order_by()
                .values_list("node_type").annotate(n=Count("pk")).values_list("node_type", "n"))
    room: dict[int, int | None] = {}
    for t in node_types:
        limit = (t.provider_config or {}).get("maxCapacity") or (t.provider.config or {}).get("maxCapacity")
        room[t.pk] = None if not limit else max(0, int(limit) - live.get(t.pk, 0))
    return room


def _answer(pods: list[PendingPod], *, claim: NodeClaim, now, reason: str) -> list[PendingPod]:
    """The pods are launched on `claim` (a new node, or one that exists or is on its way), in its pool."""
    for pod in pods:
        pod.status, pod.claim, pod.pool_id = DemandStatus.LAUNCHED, claim, claim.pool_id
        pod.decided_at, pod.reason = now, reason
        pod.updated_at = now  # bulk_update does not set auto_now fields: the pool pages' signature reads it
    return pods


def _owners(pods: list[PendingPod]) -> str:
    owners = sorted({p.owner for p in pods if p.owner})
    if not owners:
        return "pod " + str(pods[0]) if len(pods) == 1 else f"{len(pods)} pods"
    return ", ".join(owners[:3]) + (f" and {len(owners) - 3} more" if len(owners) > 3 else "")


def _describe(pods: list[PendingPod]) -> str:
    """"3 pods × 8 nvidia.com/gpu": what they ask, the extended resources if any, else cpu and memory."""
    asks = {tuple(sorted(quantities(p.requests).items())) for p in pods}
    noun = "pod" if len(pods) == 1 else "pods"
    if len(asks) != 1:
        return f"{len(pods)} {noun}"
    requests = dict(next(iter(asks)))
    shown = {k: v for k, v in requests.items() if is_extended(k) and v > 0} or \
        {k: v for k, v in requests.items() if k in ("cpu", "memory") and v > 0}
    if not shown:
        return f"{len(pods)} {noun}"
    return f"{len(pods)} {noun} × " + ", ".join(f"{format_quantity(k, v)} {k}" for k, v in sorted(shown.items()))


# --- a claim that ended: its pods back to the demand (registered with claims.phases at start) -------------

def claims_ended(*, claims: list[NodeClaim], to_phase: str, actor: str) -> None:
    """Claims failed or were released: the Pending pods still launched on them (their node never served them)
    are new demand again, and their tenants decide again once this commits."""
    ids = [c.pk for c in claims]
    waiting = dict(PendingPod.objects.filter(claim_id__in=ids, status=DemandStatus.LAUNCHED)
                   .values_list("claim_id").annotate(n=Count("pk")).values_list("claim_id", "n"))
    if not waiting:
        return
    tenants = set()
    for claim in claims:
        if claim.pk not in waiting:
            continue
        why = f"its claim {claim.name} {'failed' if to_phase == P.FAILED else 'was released'}"
        if claim.message:
            why += f" ({claim.message})"
        PendingPod.objects.filter(claim_id=claim.pk, status=DemandStatus.LAUNCHED).update(
            status=DemandStatus.NEW, claim=None, reason=f"{why}; deciding again", decided_at=None)
        tenants.add(claim.tenant_id)
    decide_soon(tenant_ids=sorted(tenants))


def tenants_to_decide() -> list[int]:
    """Tenants with demand to look at again (the periodic sweep): pods waiting (a limit, the quota or free hosts
    may have changed), new ones older than a batch window (a lost decide task), unservable ones (a pool or a
    NodeType may have changed: tenant_decide tells), and pods still Pending AUTONODES_BIND_GRACE_S after the node
    launched for them was Ready (the scheduler could not place them there after all), or TAKEN_AFTER after it when its
    use was read since (tenant_decide tells whether other pods took it)."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.AUTONODES_SWEEP_NEW_AFTER_S)
    unbound = now - timedelta(seconds=settings.AUTONODES_BIND_GRACE_S)
    q = (Q(status=DemandStatus.WAITING) | Q(status=DemandStatus.NEW, updated_at__lt=stale)
         | Q(status=DemandStatus.UNSERVABLE)
         | Q(status=DemandStatus.LAUNCHED, claim__phase=P.AVAILABLE, claim__available_at__lt=unbound,
             decided_at__lt=unbound)
         | Q(status=DemandStatus.LAUNCHED, claim__phase=P.AVAILABLE,
             claim__usage__checked_at__gt=F("claim__available_at") + TAKEN_AFTER))
    tenants = set(PendingPod.objects.filter(q).values_list("tenant_id", flat=True))
    # Launched pods whose scheduler spoke since their node was Ready: those it turned away (autonodes.demand).
    spoke = PendingPod.objects.filter(status=DemandStatus.LAUNCHED, claim__phase=P.AVAILABLE,
                                      scheduler_message_at__gte=F("claim__available_at") + SEEN_READY_AFTER)
    tenants.update(t for t, message in spoke.values_list("tenant_id", "scheduler_message") if turned_away(message))
    return sorted(tenants)
