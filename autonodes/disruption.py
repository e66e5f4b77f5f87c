"""Giving dynamic pools' nodes back: Karpenter's disruption (empty, underutilized, expired, drifted; budgets;
do-not-disrupt), made for bare metal (a minimum node lifetime; a long default consolidateAfter for GPU servers)."""
# One pass (`pools_disrupt`, Celery beat's `autonodes.tasks.disrupt`): for each tenant with dynamic pools and
# Available claims, ONE list of its pods through its API (outside any transaction; a tenant whose API fails is
# skipped and says so on its nodes), then, under the tenant's lock, each node's NodeUsage (its pods, what they
# ask, since when it is empty, what happens next and when) and the pools' actions. Released nodes go the path
# every release goes (claims.phases.claims_release: drain, delete the Node, erase, gate, available); an
# expired or drifted node with pods is replaced first (a new claim of the same pool and type) and released only
# once its replacement is Available, so its pods have somewhere to go, when the replacement fits the pool's
# limits and the tenant's quota (counted as the provisioning decision counts them: autonodes.services and
# simulation.over_limit). When it does not: an expired node is released without a replacement (its pods go
# Pending and the provisioning decision adds a node once there is room, as Karpenter v1's forceful expiry); a
# drifted node is kept, saying why, and looked at again at the next pass. Each action, and each block that starts
# or changes, is one decision Event (events EventKind.DECISION, object_type pool).
#
# Where we differ from Karpenter, and why:
# - consolidationPolicy defaults to WhenEmpty, not WhenEmptyOrUnderutilized: moving running pods (training jobs)
#   off a server to give it back pays for VMs billed by the second; on bare metal it costs the jobs' progress
#   and a 10-30 minute erase, so a pool asks for it.
# - consolidateAfter defaults to 30m for a node whose NodeType has GPUs and 10m for a CPU-only one (vCluster's
#   30s is made for cloud VMs that come back in a minute: a GPU server takes 10-30 min to come back and is
#   erased on release, so a job that resubmits within minutes should find it still there).
# - disruption.minNodeLifetime (ours, default 30m from the node's Ready): a node is never consolidated (Empty,
#   Underutilized) younger than that; a server that took half an hour to install serves at least that long.
# - expiry honours do-not-disrupt and budgets (Karpenter v1 expires forcefully): ours replaces before it
#   releases, so it is a voluntary disruption like drift; budgets may name Expired among their reasons. Only
#   when a replacement would pass a limit or the quota is an expired node released first (forceful, within
#   the budget and do-not-disrupt still), as a pool at its limit could otherwise keep it forever.
# - budgets: `nodes` a count or a percentage of the pool's nodes (Available or Releasing), a percentage rounded
#   UP as Karpenter does (10% of 3 nodes allows 1); nodes already being released or replaced count against it;
#   `schedule` (cron, UTC, read by Celery's crontab) + `duration`: in force from each firing for `duration`;
#   `reasons` any of Empty, Underutilized, Drifted, Expired (none: all). The most restrictive budget in force
#   wins; no budget written: Karpenter's default, 10%.
# - all-or-nothing groups (a pool with `group.size`): a group's nodes go as one unit or not at all. A member is
#   never consolidated, expired or drifted alone (that would break the gang it was placed for); the whole group
#   is released once every live member is an Available node, empty for consolidateAfter, past its minimum
#   lifetime, with no do-not-disrupt pod, and the budget allows all its members at once. Underutilized members
#   are not consolidated (their pods would move off the rail group they were placed on), and expired or drifted
#   groups are not replaced (a replacement would have to be a whole new group first): both are said on the node.
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from claims.choices import ClaimPhase as P
from claims.drift import claim_drift
from claims.models import NodeClaim
from claims.phases import claims_release
from claims.reconcile import claims_create
from claims.tenant_api import TenantAPI, TenantAPIError
from core.transactions import retry_on_deadlock
from core.transitions import ConcurrentTransition
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record
from pools.choices import ConsolidationPolicy, PoolKind
from pools.matching import requirements_match
from pools.models import NodePool, NodeType, Tenant
from pools.budgets import DEFAULT_BUDGET, allowance, budget_window, budgets, in_force  # noqa: F401 (read here)
from pools.validators import parse_duration, parse_quantity

from .choices import DecisionReason as R
from .fit import (
    Demand,
    do_not_disrupt,
    fits,
    format_quantity,
    is_daemonset_pod,
    pod_requests,
    quantities,
    total_resources,
)
from .live import demand_changed
from .models import NodeUsage
from .services import ACTIVE, limits_counted, quota_nodes_left
from .simulation import over_limit

log = logging.getLogger(__name__)

ACTOR = "system:disruption"
DEFAULT_POLICY = ConsolidationPolicy.WHEN_EMPTY
DEFAULT_CONSOLIDATE_AFTER_GPU = timedelta(minutes=30)
DEFAULT_CONSOLIDATE_AFTER_CPU = timedelta(minutes=10)
DEFAULT_MIN_NODE_LIFETIME = timedelta(minutes=30)
HOSTNAME_LABEL = "kubernetes.io/hostname"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# A replacement that failed is not made again at once: a broken image or no server of the type would otherwise
# launch and fail a claim on every pass: never relaunched in a loop.
REPLACEMENT_RETRY = timedelta(minutes=30)


# --- the pool's settings, as this module reads them (the show pages ask the same functions) ---------------------

def has_gpus(node_type: NodeType | None) -> bool:
    return node_type is not None and any("gpu" in key.lower() and parse_quantity(value) > 0
                                         for key, value in (node_type.resources or {}).items())


def consolidation_policy(pool: NodePool) -> str:
    return (pool.disruption or {}).get("consolidationPolicy") or DEFAULT_POLICY


def consolidate_after(pool: NodePool, node_type: NodeType | None) -> timedelta | None:
    """How long a node stays empty (or its pods unchanged) before it is consolidated; None: Never."""
    written = (pool.disruption or {}).get("consolidateAfter")
    if written is not None and str(written) != "":
        return parse_duration(str(written))
    return DEFAULT_CONSOLIDATE_AFTER_GPU if has_gpus(node_type) else DEFAULT_CONSOLIDATE_AFTER_CPU


def min_node_lifetime(pool: NodePool) -> timedelta:
    written = (pool.disruption or {}).get("minNodeLifetime")
    return parse_duration(str(written)) if written not in (None, "") else DEFAULT_MIN_NODE_LIFETIME


def expire_after(pool: NodePool) -> timedelta | None:
    return parse_duration(pool.expire_after) if pool.expire_after else None


def drift(claim: NodeClaim, pool: NodePool) -> str | None:
    """Why the claim's node no longer is what the pool would make now (None: it is): claims.drift's first change."""
    changes = claim_drift(claim, pool)
    return changes[0] if changes else None


# --- what runs where ---------------------------------------------------------------------------------------------

def occupies(pod: dict) -> bool:
    """A pod that keeps its node from being empty: not a DaemonSet's or a static (mirror) pod, not finished,
    not terminating (as Karpenter counts reschedulable pods)."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return not (is_daemonset_pod(pod) or MIRROR_ANNOTATION in (meta.get("annotations") or {})
                or phase in ("Succeeded", "Failed") or meta.get("deletionTimestamp"))


def pod_key(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _size(requests: dict[str, float]) -> tuple:
    """Largest first: GPUs (any extended resource) before CPU before memory."""
    extended = sum(v for k, v in requests.items() if k not in ("cpu", "memory", "pods", "ephemeral-storage"))
    return (extended, requests.get("cpu", 0.0), requests.get("memory", 0.0))


@dataclass
class Node:
    claim: NodeClaim
    usage: NodeUsage
    pods: list[dict]  # the pods that occupy it
    requested: dict[str, float]
    labels: dict
    taints: list
    allocatable: dict[str, float]
    guarded: list[str]  # pods with do-not-disrupt
    blocked_before: str = ""  # its usage's blocked_by when the pass began
    retry_at: datetime | None = None  # its usage's next_action_at when the pass began
    expires_at: datetime | None = None  # created_at + expireAfter

    @property
    def free(self) -> dict[str, float]:
        return {k: v - self.requested.get(k, 0.0) for k, v in self.allocatable.items()}


def _node(claim: NodeClaim, usage: NodeUsage, pods: list[dict]) -> Node:
    node_type = claim.node_type
    labels = {**(node_type.effective_properties() if node_type else {}), **(claim.node_labels or {}),
              HOSTNAME_LABEL: claim.node_name}
    allocatable = {k: parse_quantity(v) for k, v in ((node_type.resources if node_type else {}) or {}).items()}
    occupying = [p for p in pods if occupies(p)]
    guarded = [pod_key(p) for p in pods if do_not_disrupt(p) and not (p.get("metadata") or {}).get("deletionTimestamp")]
    return Node(claim=claim, usage=usage, pods=occupying, requested=total_resources([pod_requests(p) for p in occupying]),
                labels=labels, taints=list(claim.taints or []), allocatable=allocatable, guarded=sorted(guarded))


def place(pods: list[dict], nodes: list[Node]) -> dict[str, str] | None:
    """Would these pods all fit on these nodes (autonodes.fit: labels, taints, free resources)? Largest pod first,
    each on the fullest node it fits (so the emptier nodes stay consolidatable). {pod: node name}, or None."""
    free = {n.claim.node_name: n.free for n in nodes}
    placement = {}
    for pod in sorted(pods, key=lambda p: _size(pod_requests(p)), reverse=True):
        demand = Demand.of_pod(pod)
        for node in sorted(nodes, key=lambda n: _size({k: -v for k, v in free[n.claim.node_name].items()}),
                           reverse=True):
            room = free[node.claim.node_name]
            if fits(demand, node.labels, node.taints, room):
                for key, value in demand.requests.items():
                    room[key] = room.get(key, 0.0) - value
                placement[pod_key(pod)] = node.claim.node_name
                break
        else:
            return None
    return placement


# --- the pass ----------------------------------------------------------------------------------------------------

@dataclass
class DisruptResult:
    tenants: list[str] = field(default_factory=list)  # looked at
    skipped: dict[str, str] = field(default_factory=dict)  # tenant → why (its API failed)
    released: dict[str, str] = field(default_factory=dict)  # claim → reason
    replacing: dict[str, str] = field(default_factory=dict)  # old claim → its replacement
    blocked: dict[str, str] = field(default_factory=dict)  # claim → what keeps it

    def merge(self, other: DisruptResult) -> None:
        self.tenants += other.tenants
        for name in ("skipped", "released", "replacing", "blocked"):
            getattr(self, name).update(getattr(other, name))


def pools_disrupt(*, actor: str = ACTOR, now: datetime | None = None) -> DisruptResult:
    """One disruption pass over every tenant with dynamic pools and Available claims (Celery beat runs it
    every AUTONODES_DISRUPT_EVERY_S). Safe to run at any time from any number of workers: each tenant is decided
    under its lock, on the pods listed just before."""
    result = DisruptResult()
    tenants = (Tenant.objects.filter(pools__kind=PoolKind.DYNAMIC, pools__claims__phase=P.AVAILABLE,
                                     deleting_since__isnull=True).distinct().order_by("pk"))
    for tenant in tenants:
        try:  # network I/O: outside any transaction
            pods = TenantAPI(tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S).list_node_pods()
        except TenantAPIError as exc:
            log.warning("disruption: tenant %s skipped: %s", tenant.name, exc)
            result.skipped[tenant.name] = str(exc)
            _say_skipped(tenant, str(exc))
            continue
        try:
            result.merge(tenant_disrupt(tenant_id=tenant.pk, pods=pods, actor=actor, now=now))
        except (ConcurrentTransition, DatabaseError) as exc:  # retried already; the others still go on
            log.exception("disruption: tenant %s failed", tenant.name)
            result.skipped[tenant.name] = f"failed: {exc}"
    return result


def _say_skipped(tenant: Tenant, why: str) -> None:
    """The nodes say that nothing is decided for them while their tenant's API is away."""
    text = f"paused: the tenant API did not answer ({why})"[:300]
    NodeUsage.objects.filter(claim__tenant=tenant, claim__phase=P.AVAILABLE).exclude(next_action=text).update(
        next_action=text, next_action_at=None)


def tenant_pools_locked(tenant_id: int, kind: str) -> tuple[Tenant | None, list[int], list[NodePool]]:
    """The tenant and its pools of this kind, locked in that order (the tenant's lock: one decision at a time per
    tenant); (None, [], []) for a tenant gone or being deleted. Inside the caller's transaction."""
    tenant = Tenant.objects.select_for_update(no_key=True).filter(pk=tenant_id).first()
    if tenant is None or tenant.deleting_since is not None:
        return None, [], []
    locked = list(NodePool.objects.filter(tenant_id=tenant_id, kind=kind).order_by("pk")
                  .select_for_update(no_key=True).values_list("pk", flat=True))
    return tenant, locked, list(NodePool.objects.filter(pk__in=locked).select_related("tenant", "provider")
                                .order_by("pk"))


@retry_on_deadlock(also=(ConcurrentTransition,))  # a claim that moved meanwhile: look again
def tenant_disrupt(*, tenant_id: int, pods: list[dict], actor: str = ACTOR,
                   now: datetime | None = None) -> DisruptResult:
    """Update the tenant's NodeUsage from `pods` (every pod of the tenant bound to a node) and disrupt what its
    dynamic pools allow, under the tenant's lock (one decision at a time per tenant: autonodes.services)."""
    result = DisruptResult()
    with transaction.atomic():
        tenant, locked, pools = tenant_pools_locked(tenant_id, PoolKind.DYNAMIC)
        if tenant is None:
            return result
        now = now or timezone.now()
        result.tenants.append(tenant.name)
        claims = list(NodeClaim.objects.filter(pool_id__in=locked).exclude(phase=P.RELEASED)
                      .select_related("node_type__provider", "group").order_by("created_at", "pk"))
        by_node = defaultdict(list)
        for pod in pods:
            if node_name := (pod.get("spec") or {}).get("nodeName"):
                by_node[node_name].append(pod)
        available = [c for c in claims if c.phase == P.AVAILABLE and c.node_name]
        usages = {u.claim_id: u for u in NodeUsage.objects.filter(claim__in=available).select_related("replacement")}
        nodes = []
        for claim in available:
            usage = usages.get(claim.pk) or NodeUsage(claim=claim)
            nodes.append(_node(claim, usage, by_node.get(claim.node_name, [])))
        before = {n.claim.pk: _usage_as_pages_show(n.usage) for n in nodes}
        _upkeep(nodes, now)
        quota = _Quota(tenant=tenant, dynamic_ids=set(locked))
        for pool in pools:
            _Pass(pool=pool, nodes=[n for n in nodes if n.claim.pool_id == pool.pk],
                  claims=[c for c in claims if c.pool_id == pool.pk], now=now, actor=actor, result=result,
                  quota=quota).run()
        NodeUsage.objects.bulk_create([n.usage for n in nodes if n.usage.pk is None])
        NodeUsage.objects.bulk_update([n.usage for n in nodes if n.usage.pk is not None and n.usage.claim_id in usages],
                                      USAGE_FIELDS)
        changed = {n.claim.pool_id for n in nodes if before[n.claim.pk] != _usage_as_pages_show(n.usage)}
        if changed:  # what the pool pages show (checked_at alone is not news)
            demand_changed(tenant_id=tenant_id, pool_ids=changed)
    return result


def _usage_as_pages_show(usage: NodeUsage) -> tuple:
    """The parts of a node's usage the pool pages show: a change in them is news (checked_at alone is not)."""
    return (usage.pk, usage.pods, usage.requested, usage.empty_since, usage.do_not_disrupt, usage.next_action,
            usage.next_action_at, usage.replacement_id)


USAGE_FIELDS = ["pods", "requested", "empty_since", "do_not_disrupt", "pods_changed_at", "blocked_by", "checked_at",
                "next_action", "next_action_at", "replacement"]


def _upkeep(nodes: list[Node], now: datetime) -> None:
    """What runs on each node, and since when it is empty or its pods unchanged."""
    for node in nodes:
        usage = node.usage
        requested = {k: format_quantity(k, v) for k, v in sorted(node.requested.items())}
        if usage.pk is None or (usage.pods, usage.requested) != (len(node.pods), requested):
            usage.pods_changed_at = now
        usage.pods, usage.requested = len(node.pods), requested
        usage.do_not_disrupt = bool(node.guarded)
        usage.empty_since = (usage.empty_since or now) if not node.pods else None
        usage.checked_at = now


def _hhmm(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%H:%M")


def _go_duration(delta: timedelta) -> str:
    """A duration as the pool's manifest writes it (Go's form): 2h, 30m, 45s."""
    seconds = int(delta.total_seconds())
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60}m"
    return f"{seconds}s"


@dataclass
class _Quota:
    """The tenant's node quota as replacements use it up in one pass (read once, when a replacement is first
    asked for: most passes replace nothing)."""

    tenant: Tenant
    dynamic_ids: set[int]
    read: bool = False
    left: int | None = None

    def nodes_left(self) -> int | None:
        if not self.read and self.tenant.quota_nodes is not None:
            claims = list(NodeClaim.objects.filter(tenant=self.tenant, phase__in=ACTIVE).only("pk", "pool_id"))
            self.left, self.read = quota_nodes_left(self.tenant, claims, self.dynamic_ids), True
        return self.left


@dataclass
class _Pass:
    """One pool's disruption decisions in one pass."""

    pool: NodePool
    nodes: list[Node]
    claims: list[NodeClaim]
    now: datetime
    actor: str
    result: DisruptResult
    quota: _Quota | None = None
    events: list[Event] = field(default_factory=list)
    blocks: dict[str, list[Node]] = field(default_factory=lambda: defaultdict(list))  # message → nodes

    def run(self) -> None:
        releasing = [c for c in self.claims if c.phase == P.RELEASING]
        self.total = len(self.nodes) + len(releasing)  # the pool's nodes, as budgets count them
        self.disrupting = len(releasing)
        self.gone: set[int] = set()  # claims released or being replaced: not candidates, nowhere to move pods
        self.receiving: set[int] = set()  # nodes that take pods of a consolidated node this pass: they stay
        self.kept: set[int] = set()  # nodes something keeps in this pass: one decision per node and pass
        self.limits = quantities(self.pool.limits)
        self.resources = {c.node_type_id: quantities(c.node_type.resources) for c in self.claims if c.node_type_id}
        # What the pool's live claims count against its limits; replacements made in this pass add to it.
        self.used = limits_counted([c for c in self.claims if c.phase in ACTIVE], self.resources)
        by_id = {c.pk: c for c in self.claims}
        for node in self.nodes:
            node.blocked_before, node.retry_at = node.usage.blocked_by, node.usage.next_action_at
            node.usage.next_action, node.usage.next_action_at, node.usage.blocked_by = "", None, ""
        self._replacements(by_id)
        policy = consolidation_policy(self.pool)
        members: dict[int, list[Node]] = defaultdict(list)  # all-or-nothing groups: released whole or kept
        for node in self.nodes:
            if node.claim.group_id:
                members[node.claim.group_id].append(node)
        candidates = [n for n in self.nodes if n.claim.pk not in self.gone | self.kept and not n.claim.group_id]
        for node in candidates:
            self._expiry_or_drift(node)
        for node in sorted(candidates, key=lambda n: (n.usage.empty_since or self.now, n.claim.pk)):
            if node.claim.pk not in self.gone | self.kept and not node.pods:
                self._empty(node)
        for group_id, nodes in sorted(members.items()):
            self._group(group_id, nodes)
        for node in sorted(candidates, key=lambda n: (len(n.pods), _size(n.requested), n.claim.pk)):
            if node.claim.pk not in self.gone | self.kept and node.pods:
                self._underutilized(node, policy)
        self._blocked_events()
        events_record(self.events)

    # -- expiry and drift: replace first, release once the replacement is Available

    def _replacements(self, by_id: dict[int, NodeClaim]) -> None:
        for node in self.nodes:
            replacement = node.usage.replacement
            if replacement is None:
                continue
            replacement = by_id.get(replacement.pk) or replacement
            why, reason = self._why_replace(node)
            if replacement.phase == P.AVAILABLE and node.guarded:
                self.gone.add(node.claim.pk)
                self.disrupting += 1
                self._block(node, f"do-not-disrupt:{node.guarded[0]}",
                            f"kept: pod {node.guarded[0]} has do-not-disrupt (its replacement {replacement.name} "
                            "is Ready)")
                continue
            if replacement.phase == P.AVAILABLE:
                message = f"released {node.claim.name}: its replacement {replacement.name} is Ready ({why})"
                self._release([node], reason, message, extra={"replacement": replacement.name})
                continue
            if replacement.phase in (P.FAILED, P.RELEASING, P.RELEASED):
                # The node keeps its pods; replaced again after a while, within the budget.
                node.usage.replacement = None
                retry = self.now + REPLACEMENT_RETRY
                self._event(reason, [node], f"replacement {replacement.name} of {node.claim.name} is "
                                            f"{replacement.phase}: {node.claim.name} kept, replaced again from "
                                            f"{_hhmm(retry)}", extra={"replacement": replacement.name})
                node.retry_at, node.blocked_before = retry, "replacement-failed"
                self._block(node, "replacement-failed", f"kept: replacement {replacement.name} "
                                                        f"{replacement.phase}; replaced again from {_hhmm(retry)}")
                node.usage.next_action_at = retry
                continue
            self.gone.add(node.claim.pk)
            self.disrupting += 1
            node.usage.next_action = (f"being replaced ({why}): {replacement.name} is {replacement.phase}; "
                                      f"released once it is Ready")

    def _why_replace(self, node: Node) -> tuple[str, str]:
        expiry = expire_after(self.pool)
        if expiry is not None and node.claim.created_at + expiry <= self.now:
            return f"expired: older than expireAfter {self.pool.expire_after}", R.EXPIRED
        return f"drifted: {drift(node.claim, self.pool) or 'the pool changed'}", R.DRIFTED

    def _expiry_or_drift(self, node: Node) -> None:
        expiry = expire_after(self.pool)
        if expiry is not None and node.claim.created_at + expiry <= self.now:
            reason, why = R.EXPIRED, f"expired: older than expireAfter {self.pool.expire_after}"
            drifted = None
        elif (drifted := drift(node.claim, self.pool)) is not None:
            reason, why = R.DRIFTED, f"drifted: {drifted}"
        else:
            if expiry is not None:
                node.expires_at = node.claim.created_at + expiry
            return
        if (node.blocked_before == "replacement-failed" and node.retry_at is not None and node.retry_at > self.now
                and node.pods):
            node.usage.next_action_at = node.retry_at
            self._block(node, "replacement-failed", f"kept: its last replacement failed; replaced again from "
                                                    f"{_hhmm(node.retry_at)}")
            return
        if self._blocked(node, reason, lifetime=False):
            return
        if not node.pods:  # nothing to move: no replacement needed (as Karpenter)
            self._release([node], reason, f"released {node.claim.name}: {why}; empty, so no replacement")
            return
        node_type = node.claim.node_type
        if node_type is not None and not requirements_match(self.pool.node_type_selector,
                                                            node_type.effective_properties()):
            node_type = None  # the pool no longer takes this type: the allocator picks one it takes
        allocatable = quantities(node_type.resources) if node_type is not None else {}
        if (no_room := self._no_room(allocatable)) is not None:
            key, passed = no_room
            if reason == R.EXPIRED:  # forceful, as Karpenter v1: its pods go Pending, provisioning adds a node
                self._release([node], reason, f"released {node.claim.name}: {why}; no replacement first: a "
                                              f"replacement would {passed}")
            else:  # drift waits for room: looked at again at the next pass (one Event while the reason holds)
                self._block(node, f"no-room:{key}", f"kept: drifted ({drifted}), but a replacement would {passed}")
            return
        new = claims_create(pool=self.pool, count=1, node_type=node_type, actor=self.actor,
                            message=f"replaces {node.claim.name} ({why})")[0]
        self.used["nodes"] = self.used.get("nodes", 0.0) + 1
        for resource, value in allocatable.items():
            self.used[resource] = self.used.get(resource, 0.0) + value
        if self.quota is not None and self.quota.left is not None:
            self.quota.left -= 1
        node.usage.replacement = new
        self.gone.add(node.claim.pk)
        self.disrupting += 1
        self.result.replacing[node.claim.name] = new.name
        node.usage.next_action = f"being replaced ({why}): {new.name} is Pending; released once it is Ready"
        self._event(reason, [node], f"replacing {node.claim.name} ({why}): new claim {new.name} first, "
                                    f"{node.claim.name} released once it is Ready ({len(node.pods)} pod(s) to move)",
                    extra={"replacement": new.name})

    def _no_room(self, allocatable: dict[str, float]) -> tuple[str, str] | None:
        """Why one more node of `allocatable` (a replacement) may not be added now: (a key for the block, "pass
        limit nodes 4 (4 of 4)"), the tenant's quota first, as the provisioning decision; None: it may. A
        replacement whose type the allocator picks (the pool no longer takes the old one) counts as a node only,
        as the decision counts a claim whose type is not chosen yet."""
        left = self.quota.nodes_left() if self.quota is not None else None
        if left is not None and left < 1:
            quota = self.quota.tenant.quota_nodes
            return "quota", f"pass the tenant's node quota {quota} ({quota - left} of {quota})"
        over = over_limit(self.limits, self.used, allocatable)
        if over is None:
            return None
        limit, used = self.limits[over], self.used.get(over, 0.0)
        return (f"limit:{over}", f"pass limit {over} {format_quantity(over, limit)} "
                                 f"({format_quantity(over, used)} of {format_quantity(over, limit)})")

    # -- consolidation

    def _empty(self, node: Node) -> None:
        after = consolidate_after(self.pool, node.claim.node_type)
        since = node.usage.empty_since or self.now
        if after is None:
            node.usage.next_action = "kept: consolidateAfter Never"
            return
        due = since + after
        if due > self.now:
            lifetime_end = self._lifetime_end(node)
            at = max(due, lifetime_end)
            node.usage.next_action = (f"empty since {_hhmm(since)}, released at {_hhmm(at)} unless a pod arrives"
                                      + (" (minimum lifetime)" if lifetime_end > due else ""))
            node.usage.next_action_at = at
            return
        if self._blocked(node, R.EMPTY):
            return
        self._release([node], R.EMPTY, f"released {node.claim.name}: empty since {_hhmm(since)} "
                                       f"(consolidateAfter {_go_duration(after)})")

    def _group(self, group_id: int, nodes: list[Node]) -> None:
        """An all-or-nothing group's nodes: released together once all are empty long enough, or all kept."""
        nodes = [n for n in nodes if n.claim.pk not in self.gone]
        if not nodes:
            return
        name = nodes[0].claim.group.name if nodes[0].claim.group else f"#{group_id}"
        live = [c for c in self.claims if c.group_id == group_id and c.phase not in (P.RELEASED, P.RELEASING)]
        busy = [n for n in nodes if n.pods]
        size = len(live)

        def say(text: str, at: datetime | None = None) -> None:
            for node in nodes:
                node.usage.next_action, node.usage.next_action_at = text[:300], at

        if busy or len(nodes) != size:
            ready = f"{len(nodes) - len(busy)} of {size} empty" if len(nodes) == size else \
                f"{size - len(nodes)} of {size} not Ready"
            say(f"member of group {name}: released only with the whole group, once every member is empty "
                f"({ready})")
            return
        after = consolidate_after(self.pool, nodes[0].claim.node_type)
        if after is None:
            say(f"group {name}: kept: consolidateAfter Never")
            return
        since = max(n.usage.empty_since or self.now for n in nodes)
        due = max([since + after] + [self._lifetime_end(n) for n in nodes])
        if due > self.now:
            say(f"group {name} empty since {_hhmm(since)}, released whole at {_hhmm(due)} unless a pod arrives",
                due)
            return
        for node in nodes:
            if node.guarded:
                for other in nodes:
                    self._block(other, f"do-not-disrupt:{node.guarded[0]}",
                                f"kept with group {name}: pod {node.guarded[0]} has do-not-disrupt")
                return
        budget = allowance(self.pool, R.EMPTY, self.total, self.now)
        if budget.allowed - self.disrupting < len(nodes):
            for node in nodes:
                self._block(node, f"budget:{R.EMPTY}:group",
                            f"kept: group {name} needs {len(nodes)} disruptions at once; the budget allows "
                            f"{max(budget.allowed - self.disrupting, 0)} now (Empty)")
            return
        self._release(nodes, R.EMPTY, f"released group {name} whole ({len(nodes)} nodes: "
                                      f"{', '.join(n.claim.name for n in nodes)}): every member empty since "
                                      f"{_hhmm(since)} (consolidateAfter {_go_duration(after)})", extra={"group": name})

    def _underutilized(self, node: Node, policy: str) -> None:
        pods = f"in use: {len(node.pods)} pod(s)"
        if policy != ConsolidationPolicy.WHEN_EMPTY_OR_UNDERUTILIZED:
            node.usage.next_action = pods
            if node.expires_at is not None:
                node.usage.next_action += f"; replaced from {_hhmm(node.expires_at)} (expireAfter {self.pool.expire_after})"
                node.usage.next_action_at = node.expires_at
            return
        after = consolidate_after(self.pool, node.claim.node_type)
        if after is None:
            node.usage.next_action = f"{pods}; kept: consolidateAfter Never"
            return
        settled = (node.usage.pods_changed_at or self.now) + after
        if settled > self.now:
            node.usage.next_action = f"{pods}; consolidated from {_hhmm(settled)} if they fit on other nodes"
            node.usage.next_action_at = settled
            return
        if node.claim.pk in self.receiving:
            node.usage.next_action = f"{pods}; takes pods of a node consolidated now"
            return
        others = [n for n in self.nodes if n is not node and n.claim.pk not in self.gone]
        placement = place(node.pods, others)
        if placement is None:
            node.usage.next_action = f"{pods}; they do not fit on the pool's other nodes"
            return
        if self._blocked(node, R.UNDERUTILIZED):
            return
        # Commit the placement: the receivers' room shrinks, and they are not consolidated in this pass.
        targets = {n.claim.node_name: n for n in others}
        for pod in node.pods:
            target = targets[placement[pod_key(pod)]]
            target.requested = total_resources([target.requested, pod_requests(pod)])
            self.receiving.add(target.claim.pk)
        moves = ", ".join(f"{pod} → {to}" for pod, to in sorted(placement.items()))
        self._release([node], R.UNDERUTILIZED,
                      f"released {node.claim.name}: underutilized, its {len(node.pods)} pod(s) fit on "
                      f"{', '.join(sorted(set(placement.values())))} ({moves})",
                      extra={"moves": placement})

    # -- what keeps a node

    def _lifetime_end(self, node: Node) -> datetime:
        ready = node.claim.available_at or node.claim.joined_at or node.claim.created_at
        return ready + min_node_lifetime(self.pool)

    def _blocked(self, node: Node, reason: str, lifetime: bool = True) -> bool:
        """Whether something keeps this node now, saying what on the node (and once in an Event)."""
        if node.guarded:
            return self._block(node, f"do-not-disrupt:{node.guarded[0]}",
                               f"kept: pod {node.guarded[0]} has do-not-disrupt")
        if lifetime and (end := self._lifetime_end(node)) > self.now:
            node.usage.next_action_at = end
            return self._block(node, "min-lifetime", f"kept: younger than the minimum lifetime (until {_hhmm(end)})")
        budget = allowance(self.pool, reason, self.total, self.now)
        if budget.allowed - self.disrupting > 0:
            return False
        nodes = budget.budget.get("nodes") if budget.budget else "?"
        written = budget.budget is not DEFAULT_BUDGET and budget.budget is not None
        name = f"budget {nodes}" if written else f"the default budget {nodes}"
        if budget.until is not None:
            node.usage.next_action_at = budget.until
            text = f"kept: {name} in force until {_hhmm(budget.until)} ({reason})"
        elif budget.allowed == 0:
            text = f"kept: {name} ({reason})"
        else:
            text = f"kept: {name} allows {budget.allowed} at once, {self.disrupting} being disrupted ({reason})"
        return self._block(node, f"budget:{reason}:{nodes}", text)

    def _block(self, node: Node, key: str, text: str) -> bool:
        node.usage.next_action, node.usage.blocked_by = text, key
        self.kept.add(node.claim.pk)
        self.result.blocked[node.claim.name] = text
        if node.blocked_before != key:
            self.blocks[text].append(node)
        return True

    def _blocked_events(self) -> None:
        for text, nodes in self.blocks.items():
            names = ", ".join(n.claim.name for n in nodes)
            self._event(R.BLOCKED, nodes, f"{names} {text}")

    # -- acting and telling

    def _release(self, nodes: list[Node], reason: str, message: str, extra: dict | None = None) -> None:
        claims_release(claims=[n.claim for n in nodes], actor=self.actor, reason=message)
        for node in nodes:
            self.gone.add(node.claim.pk)
            self.disrupting += 1
            node.usage.next_action, node.usage.next_action_at = message[:300], self.now
            node.usage.blocked_by = ""
            self.result.released[node.claim.name] = reason
        self._event(reason, nodes, message, extra=extra)

    def _event(self, reason: str, nodes: list[Node], message: str, extra: dict | None = None) -> None:
        claims = [n.claim for n in nodes]
        self.events.append(Event(
            kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=self.pool.name,
            tenant_id=self.pool.tenant_id, claim_id=claims[0].pk if len(claims) == 1 else None,
            host_id=claims[0].host_id if len(claims) == 1 else None, actor=self.actor, message=message,
            data={"reason": str(reason), "pool": self.pool.name, "claims": [c.name for c in claims],
                  "nodes": [c.node_name for c in claims], "pods": sorted(pod_key(p) for n in nodes for p in n.pods),
                  **(extra or {})}))
