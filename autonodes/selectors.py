"""Reads of Auto Nodes for the pool page, its live view and the API: one pool's status in a fixed number of
queries, whatever the number of pods and nodes."""
# Reads of Auto Nodes for the pool page, its live view and the API: one pool's status (the watcher, the demand
# with each pod's state for people, the decisions, the nodes with their use and next disruption action, limits
# used, the disruption settings and budgets) in a fixed number of queries, whatever the number of pods and nodes.
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.lifecycle import LIVE
from claims.models import NodeClaim
from core import scoping
from events.choices import EventKind, ObjectType
from events.models import Event
from hosts.engine.drive import step_status
from pools.choices import PoolKind
from pools.models import NodePool
from pools.validators import parse_quantity

from . import disruption
from .choices import DecisionReason, DemandStatus
from .models import NodeUsage, PendingPod, TenantWatch

DECISIONS_SHOWN = 50  # the pool page's newest decisions; the API pages through all of them
PODS_SHOWN = 500  # a pool page lists at most this many Pending pods (the count says how many there are)


# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def pending_pods_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = PendingPod.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def decisions_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Decision Events (kind DECISION: about a pool, or about the tenant when no pool matches a pod) of the tenants
    the user sees, newest first."""
    qs = Event.objects.all() if qs is None else qs
    qs = qs.filter(kind=EventKind.DECISION)
    ids = scoping.tenant_ids(user)
    qs = qs if ids is None else qs.filter(tenant_id__in=ids)
    return qs.order_by("-created_at", "-pk")


def pool_decisions(pool: NodePool) -> QuerySet:
    """A pool's decision Events (they name the pool by its name, within its tenant), and its tenant's about pods no
    pool matches (the page lists those pods too), newest first."""
    return (Event.objects.filter(Q(object_type=ObjectType.POOL, object_name=pool.name) | Q(object_type=ObjectType.TENANT),
                                 kind=EventKind.DECISION, tenant_id=pool.tenant_id).order_by("-created_at", "-pk"))


# --- one Pending pod's state, for people ---------------------------------------------------------

@dataclass
class PodState:
    key: str  # new | waiting | provisioning | ready | unservable
    label: str
    colour: str
    detail: str = ""  # the reason, or the claim's step: "write_image on gpu-03"


STATE_LABELS = {
    "new": ("deciding", "secondary"),
    "waiting": ("waiting for capacity", "secondary"),
    "provisioning": ("provisioning", "warning"),
    "ready": ("node ready, binding", "success"),
    "unservable": ("no pool can serve it", "danger"),
}


def _state(key: str, detail: str = "") -> PodState:
    label, colour = STATE_LABELS[key]
    return PodState(key=key, label=label, colour=colour, detail=detail)


def pod_state(pod: PendingPod) -> PodState:
    """What the console is doing for a Pending pod: still deciding; waiting for capacity (a limit, the quota, or
    no free server for its claim); provisioning (a server is being installed: the claim and its step); ready (the
    node is Ready, the tenant's scheduler binds the pod next); no pool can serve it. Needs pod.claim and
    pod.claim.host loaded (pending_pods_shown does)."""
    if pod.status == DemandStatus.UNSERVABLE:
        return _state("unservable", pod.reason)
    if pod.status == DemandStatus.WAITING:
        return _state("waiting", pod.reason)
    if pod.status == DemandStatus.NEW:
        return _state("new", pod.reason or "in the batch window; a decision follows within seconds")
    claim = pod.claim
    if claim is None:
        return _state("provisioning", pod.reason)
    if claim.phase == ClaimPhase.AVAILABLE:
        return _state("ready", f"node {claim.node_name or claim.host_name} of claim {claim.name}")
    if claim.phase == ClaimPhase.PENDING or claim.host_id is None:
        # A member of an all-or-nothing group waits with its group: the claim's message is the group's reason.
        of = f" (group {claim.group.name})" if claim.group_id and claim.group is not None else ""
        return _state("waiting", f"claim {claim.name}{of}: {claim.message or 'no free server matches yet'}")
    if claim.phase in (ClaimPhase.PROVISIONING, ClaimPhase.JOINING):
        step = step_status(claim.host) if claim.host is not None else {}
        where = claim.host.name if claim.host is not None else claim.host_name
        doing = f"{step['name']} on {where}" if step else f"{claim.phase.lower()} on {where}"
        return _state("provisioning", f"claim {claim.name}: {doing}")
    return _state("waiting", f"claim {claim.name} is {claim.phase}: {claim.message or 'back to the demand soon'}")


def pending_pods_shown(qs: QuerySet) -> QuerySet:
    """Pending pods with what pod_state reads: their claim and its host (its flow: the current step)."""
    return qs.select_related("claim", "claim__host", "claim__group", "pool").defer(
        "claim__requirements", "claim__properties", "claim__node_labels", "claim__taints",
        "claim__host__bmc_username", "claim__host__bmc_password", "claim__host__inventory")


# --- one pool's status ----------------------------------------------------------------------------

@dataclass
class LimitUse:
    resource: str
    used: float
    limit: float
    limit_text: str

    @property
    def reached(self) -> bool:
        return self.used >= self.limit

    @property
    def used_text(self) -> str:
        return _amount(self.resource, self.used)


@dataclass
class Budget:
    nodes: str
    schedule: str = ""
    duration: str = ""
    reasons: list[str] = field(default_factory=list)
    in_force: bool = True  # now: always without a schedule, inside its windows with one
    until: datetime | None = None  # when a scheduled budget in force stops being so

    @property
    def blocks(self) -> bool:
        return self.nodes.strip() in ("0", "0%")


@dataclass
class PoolStatus:
    pool: NodePool
    now: datetime
    watch: TenantWatch | None = None
    demand: list[PendingPod] = field(default_factory=list)
    demand_total: int = 0
    demand_counts: dict[str, int] = field(default_factory=dict)  # PodState.key → pods
    decisions: list[Event] = field(default_factory=list)
    nodes: list[NodeClaim] = field(default_factory=list)  # live claims, each with .usage (or None) and .age_s
    # Claims being released (drained, erased, checked): listed, as the nodes are, until they are Released.
    releasing: list[NodeClaim] = field(default_factory=list)

    @property
    def listed(self) -> list[NodeClaim]:
        return [*self.nodes, *self.releasing]
    limits: list[LimitUse] = field(default_factory=list)
    disruption: dict = field(default_factory=dict)
    budgets: list[Budget] = field(default_factory=list)

    @property
    def dynamic(self) -> bool:
        return self.pool.kind == PoolKind.DYNAMIC


def pool_status(pool: NodePool, *, now: datetime | None = None, decisions: int = DECISIONS_SHOWN) -> PoolStatus:
    """Everything the pool page and GET /api/v1/pools/<id>/status/ show. Six queries for a dynamic pool (the
    watcher, the demand, its count, the decisions, the nodes with their use and host, their NodeTypes' resources
    ride along), two for a static one, whatever the number of pods and nodes."""
    now = now or timezone.now()
    status = PoolStatus(pool=pool, now=now)
    claims = _live_claims(pool, now)
    status.nodes = [c for c in claims if c.phase != ClaimPhase.RELEASING]
    status.releasing = [c for c in claims if c.phase == ClaimPhase.RELEASING]
    if pool.kind != PoolKind.DYNAMIC:
        return status
    status.watch = TenantWatch.objects.filter(tenant_id=pool.tenant_id).first()
    pods = pending_pods_shown(PendingPod.objects.filter(Q(pool=pool) | Q(pool__isnull=True), tenant_id=pool.tenant_id)
                              ).order_by("seen_at", "namespace", "name")
    status.demand = list(pods[:PODS_SHOWN])
    for pod in status.demand:
        pod.state = pod_state(pod)
        pod.asks = _asks(pod.requests)
        pod.dom_id = pod_dom_id(f"{pod.namespace}/{pod.name}")
    status.demand_total = len(status.demand) if len(status.demand) < PODS_SHOWN else pods.count()
    for pod in status.demand:
        status.demand_counts[pod.state.key] = status.demand_counts.get(pod.state.key, 0) + 1
    status.decisions = list(pool_decisions(pool)[:decisions])
    for event in status.decisions:
        decorate_decision(event)
    status.limits = limits_used(pool, status.nodes)
    status.disruption = disruption_settings(pool, status.nodes)
    status.budgets = budgets(pool, now)
    return status


def _live_claims(pool: NodePool, now: datetime) -> list[NodeClaim]:
    claims = list(NodeClaim.objects.filter(pool=pool, phase__in=[*LIVE, ClaimPhase.RELEASING])
                  .select_related("node_type", "host", "usage", "usage__replacement")
                  .defer("requirements", "properties", "host__bmc_username", "host__bmc_password", "host__inventory")
                  .order_by("created_at", "pk"))
    for claim in claims:
        try:
            claim.use = claim.usage
        except NodeUsage.DoesNotExist:
            claim.use = None
        since = claim.available_at or claim.created_at
        claim.age_s = max(0.0, (now - since).total_seconds())
        step = step_status(claim.host) if claim.host is not None and claim.phase != ClaimPhase.AVAILABLE else {}
        claim.step = step.get("name", "")
    return claims


def pod_dom_id(key: str) -> str:
    """An element id for a pod named "ns/name" (both DNS names: letters, digits, '-' and '.')."""
    return "pod-" + key.replace("/", "--").replace(".", "_")


def decorate_decision(event: Event) -> Event:
    data = event.data if isinstance(event.data, dict) else {}
    reason = str(data.get("reason", ""))
    event.reason = reason
    event.reason_label = DecisionReason(reason).label if reason in DecisionReason.values else reason or "decision"
    event.reason_colour = DecisionReason.colour(reason)
    event.pods = [str(p) for p in data.get("pods") or [] if isinstance(p, str)]
    event.pod_links = [(p, pod_dom_id(p)) for p in event.pods]
    event.claims = [str(c) for c in data.get("claims") or [] if isinstance(c, str)]
    return event


def limits_used(pool: NodePool, claims: list[NodeClaim]) -> list[LimitUse]:
    """Per limit the pool sets: what its live claims hold (nodes: how many; a resource: the sum of their NodeTypes'
    resources, a node's allocatable) against the limit."""
    rows = []
    for resource, limit in sorted((pool.limits or {}).items()):
        try:
            limit_value = parse_quantity(limit)
        except (TypeError, ValueError):
            continue
        if resource == "nodes":
            used = float(len(claims))
        else:
            used = 0.0
            for claim in claims:
                amount = (claim.node_type.resources or {}).get(resource) if claim.node_type else None
                try:
                    used += parse_quantity(amount) if amount is not None else 0.0
                except (TypeError, ValueError):
                    pass
        rows.append(LimitUse(resource=resource, used=used, limit=limit_value, limit_text=str(limit)))
    return rows


def disruption_settings(pool: NodePool, nodes: list[NodeClaim]) -> dict:
    """The pool's disruption as the disruption pass reads it (autonodes.disruption): what the pool leaves out
    shows as the default that applies, and says so."""
    written = pool.disruption or {}
    types = {c.node_type_id: c.node_type for c in nodes if c.node_type is not None}
    if written.get("consolidateAfter") not in (None, ""):
        after = str(written["consolidateAfter"])
    elif types:
        after = ", ".join(sorted({f"{_duration(disruption.consolidate_after(pool, t))} (default for "
                                  f"{'GPU' if disruption.has_gpus(t) else 'CPU-only'} NodeTypes)"
                                  for t in types.values()}))
    else:
        after = (f"default: {_duration(disruption.DEFAULT_CONSOLIDATE_AFTER_GPU)} for GPU NodeTypes, "
                 f"{_duration(disruption.DEFAULT_CONSOLIDATE_AFTER_CPU)} for CPU-only ones")
    try:
        lifetime = _duration(disruption.min_node_lifetime(pool))
    except (TypeError, ValueError):
        lifetime = str(written.get("minNodeLifetime"))
    if written.get("minNodeLifetime") in (None, ""):
        lifetime += " (default)"
    return {
        "consolidationPolicy": disruption.consolidation_policy(pool)
        + ("" if written.get("consolidationPolicy") else " (default)"),
        "consolidateAfter": after,
        "minNodeLifetime": lifetime,
        "expireAfter": pool.expire_after or "Never",
    }


def budgets(pool: NodePool, now: datetime) -> list[Budget]:
    """The pool's budgets (none written: Karpenter's default, 10% of the nodes), each with whether it is in force
    now and until when, as the disruption pass reads its schedule (autonodes.disruption.budget_window)."""
    out = []
    for budget in disruption.budgets(pool):
        if not isinstance(budget, dict):
            continue
        try:
            active, until = disruption.budget_window(budget, now)
        except (TypeError, ValueError):
            active, until = True, None  # the pass fails closed on a budget it cannot read: it blocks
        out.append(Budget(nodes=str(budget.get("nodes", "")), schedule=str(budget.get("schedule") or ""),
                          duration=str(budget.get("duration") or ""),
                          reasons=[str(r) for r in budget.get("reasons") or []], in_force=active, until=until))
    return out


def _duration(value) -> str:
    """A timedelta as the manifests write durations ("30m", "1h30m"); None: Never."""
    if value is None:
        return "Never"
    seconds = int(value.total_seconds())
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


def _asks(requests: dict) -> str:
    if not isinstance(requests, dict):
        return ""
    parts = []
    for key in sorted(requests, key=lambda k: (k not in ("nvidia.com/gpu", "cpu", "memory"), k)):
        parts.append(f"{requests[key]} {key}")
    return ", ".join(parts)


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20)):
            if value >= size:
                return f"{value / size:g}{unit}"
    return f"{value:g}"


# --- the live view's check for changes that carry no Event (PendingPod and NodeUsage rows) ---------

def demand_signature(pool: NodePool) -> tuple:
    """Something that changes when the pool's demand, its nodes' use or the tenant's watcher change: the
    in-memory live mode (no messages across processes) compares it at each re-sync. Two queries."""
    pods = (PendingPod.objects.filter(Q(pool=pool) | Q(pool__isnull=True), tenant_id=pool.tenant_id).order_by()
            .aggregate(n=Count("pk"), last=Max("updated_at"), ids=Sum("pk")))
    # Not checked_at: every disruption pass sets it; what the page shows changes these.
    use = NodeUsage.objects.filter(claim__pool=pool).order_by().aggregate(
        n=Count("pk"), pods=Sum("pods"), empty=Max("empty_since"), changed=Max("pods_changed_at"),
        next=Max("next_action_at"))
    watch = TenantWatch.objects.filter(tenant_id=pool.tenant_id).values_list("updated_at", flat=True).first()
    return (pods["n"], pods["last"], pods["ids"], *use.values(), watch)
