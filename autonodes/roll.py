"""Static pools follow what their nodes are made from: drifted nodes (claims.drift) replaced within the pool's
disruption budgets, as dynamic pools' drift is (autonodes.disruption), one pool's roll at a time."""
# One pass (`pools_roll`, Celery beat's `autonodes.tasks.roll`): for each tenant with static pools, the drift of
# each Available claim is written on it (Drifted since, what changed). Only a tenant with a drifted node or a roll
# under way goes on: ONE list of its pods and of its Nodes through its API (outside any transaction: a tenant whose
# API fails is held and says so), then, under the tenant's lock, each static pool's roll:
# - the budgets are the pool's `disruption.budgets` as dynamic pools read them (pools.budgets: count or
#   percentage of the quantity, schedule + duration windows, reasons; none written: 10%, rounded up), for the
#   reason Drifted. Nodes already out (an in-place re-image under way, any node missing from the quantity) and
#   replacements not Ready yet count against it, so the pool is never more than the budget below its quantity.
# - a drifted node is replaced first when a free host of a type the pool takes exists and the tenant's quota has
#   room for one more node: a new claim of the pool (`replacement_of` the old one: the pair counts once towards
#   the quantity), the old one released once the new one is Available. Else it is re-imaged in place: drained and
#   released (ReleasePurpose.REIMAGE: the release gate holds its host for the pool), the pool's reconcile makes
#   its new claim.
# - held, saying why: a node with karpenter.sh/do-not-disrupt (on the Node, or a pod on it), the budget (a
#   window that is closed), an OS image that cannot be written (nothing is erased for an image that would fail),
#   a replacement that failed (the old node keeps serving; made again after REPLACEMENT_RETRY), a claim of the
#   pool that is Failed (an in-place re-image's new node that did not come), a pool of all-or-nothing groups (not
#   rolled node by node, as dynamic pools' groups).
# Each action, and each hold that starts or changes, is one decision Event on the pool.
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from claims import task_names as claim_tasks
from claims.choices import ClaimPhase as P
from claims.choices import ReleasePurpose
from claims.drift import claim_drift
from claims.lifecycle import LIVE
from claims.models import NodeClaim
from claims.phases import claims_release
from claims.reconcile import claims_create
from claims.selectors import free_hosts, os_image
from claims.tenant_api import TenantAPI, TenantAPIError
from core.tasks import task_send_on_commit
from core.transactions import retry_on_deadlock
from core.transitions import ConcurrentTransition
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record
from pools.budgets import allowance
from pools.choices import PoolKind
from pools.matching import requirements_match
from pools.models import OS_IMAGE_PROPERTY, NodePool, NodeType, OSImage, Tenant

from .choices import DecisionReason as R
from .disruption import REPLACEMENT_RETRY, pod_key, tenant_pools_locked
from .fit import DO_NOT_DISRUPT, do_not_disrupt
from .live import demand_changed
from .models import PoolRoll

log = logging.getLogger(__name__)

ACTOR = "system:roll"


@dataclass
class RollResult:
    tenants: list[str] = field(default_factory=list)  # rolled (a drifted node or a roll under way)
    skipped: dict[str, str] = field(default_factory=dict)  # tenant → why (its API failed)
    drifted: dict[str, str] = field(default_factory=dict)  # claim → what changed (found drifted in this pass)
    replacing: dict[str, str] = field(default_factory=dict)  # old claim → its replacement, made first
    reimaging: list[str] = field(default_factory=list)  # claims released to be re-imaged in place
    released: list[str] = field(default_factory=list)  # old claims released once their replacement was Ready
    held: dict[str, str] = field(default_factory=dict)  # "tenant/pool" → why


def pools_roll(*, actor: str = ACTOR, now: datetime | None = None) -> RollResult:
    """One pass over every tenant with static pools (Celery beat runs it every AUTONODES_ROLL_EVERY_S). Safe to
    run at any time from any number of workers: each tenant's roll is decided under its lock."""
    result = RollResult()
    tenants = (Tenant.objects.filter(pools__kind=PoolKind.STATIC, pools__claims__phase=P.AVAILABLE,
                                     deleting_since__isnull=True).distinct().order_by("pk"))
    for tenant in tenants:
        if not tenant_drift_mark(tenant_id=tenant.pk, result=result, now=now):
            continue
        try:  # network I/O: outside any transaction
            api = TenantAPI(tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S)
            pods, annotations = api.list_node_pods(), api.list_node_annotations()
        except TenantAPIError as exc:
            log.warning("roll: tenant %s held: %s", tenant.name, exc)
            result.skipped[tenant.name] = str(exc)
            PoolRoll.objects.filter(pool__tenant=tenant, started_at__isnull=False).update(
                status=f"held: the tenant API did not answer ({exc})"[:300], held_by="tenant-api")
            continue
        try:
            tenant_roll(tenant_id=tenant.pk, pods=pods, annotations=annotations, actor=actor, now=now, result=result)
        except (ConcurrentTransition, DatabaseError) as exc:  # retried already; the others still go on
            log.exception("roll: tenant %s failed", tenant.name)
            result.skipped[tenant.name] = f"failed: {exc}"
    return result


@transaction.atomic
def tenant_drift_mark(*, tenant_id: int, result: RollResult | None = None, now: datetime | None = None) -> bool:
    """Write each Available claim of the tenant's static pools Drifted (since when, what changed) or not; whether
    the tenant has something to roll (a drifted node, or a roll under way)."""
    now = now or timezone.now()
    pools = {p.pk: p for p in NodePool.objects.filter(tenant_id=tenant_id, kind=PoolKind.STATIC)
             .select_related("tenant", "provider")}
    names = {p.properties.get(OS_IMAGE_PROPERTY) for p in pools.values()} - {None, ""}
    images = {i.name: i for i in OSImage.objects.filter(name__in=names)}
    drifted = False
    for claim in (NodeClaim.objects.filter(pool_id__in=list(pools), phase=P.AVAILABLE)
                  .select_related("node_type__provider")):
        text = "; ".join(claim_drift(claim, pools[claim.pool_id], images=images))[:500]
        drifted = drifted or bool(text)
        if text == claim.drift and bool(text) == bool(claim.drifted_since):
            continue
        since = (claim.drifted_since or now) if text else None
        NodeClaim.objects.filter(pk=claim.pk).update(drift=text, drifted_since=since)
        if text:
            if result is not None:
                result.drifted[claim.name] = text
            events_record([Event(kind=EventKind.CHANGE, object_type=ObjectType.CLAIM, object_name=claim.name,
                                 claim_id=claim.pk, tenant_id=claim.tenant_id, host_id=claim.host_id,
                                 actor=ACTOR, message=f"drifted: {text}")])
    return drifted or PoolRoll.objects.filter(pool_id__in=list(pools), started_at__isnull=False).exists()


@retry_on_deadlock(also=(ConcurrentTransition,))  # a claim that moved meanwhile: look again
def tenant_roll(*, tenant_id: int, pods: list[dict], annotations: dict[str, dict], actor: str = ACTOR,
                now: datetime | None = None, result: RollResult | None = None) -> RollResult:
    """Roll the tenant's static pools from `pods` (its pods bound to nodes) and `annotations` (its Nodes'), under
    the tenant's lock (one decision at a time per tenant, as dynamic pools' disruption)."""
    result = result if result is not None else RollResult()
    with transaction.atomic():
        tenant, locked, pools = tenant_pools_locked(tenant_id, PoolKind.STATIC)
        if tenant is None:
            return result
        now = now or timezone.now()
        result.tenants.append(tenant.name)
        claims = list(NodeClaim.objects.filter(tenant_id=tenant_id).exclude(phase=P.RELEASED)
                      .select_related("node_type").order_by("created_at", "pk"))
        guarded = _guarded(pods, annotations)
        rolls = {r.pool_id: r for r in PoolRoll.objects.filter(pool_id__in=locked)}
        quota = _QuotaLeft(tenant, claims)
        changed = set()
        for pool in pools:
            roll = rolls.get(pool.pk) or PoolRoll(pool=pool)
            before = _as_shown(roll)
            _PoolPass(pool=pool, claims=[c for c in claims if c.pool_id == pool.pk], roll=roll, guarded=guarded,
                      quota=quota, now=now, actor=actor, result=result).run()
            if before != _as_shown(roll):
                roll.save()
                changed.add(pool.pk)
        if changed:  # what the tenant and pool pages show
            demand_changed(tenant_id=tenant_id, pool_ids=changed)
    return result


def _as_shown(roll: PoolRoll) -> tuple:
    return (roll.pk, roll.status, roll.held_by, roll.replaced, roll.total, roll.started_at, roll.next_at,
            roll.retry_at, roll.failure)


def _guarded(pods: list[dict], annotations: dict[str, dict]) -> dict[str, str]:
    """{node name: why it must not be disrupted}: karpenter.sh/do-not-disrupt on the Node or on a pod on it."""
    guarded = {name: f"node {name} has {DO_NOT_DISRUPT}" for name, notes in annotations.items()
               if str((notes or {}).get(DO_NOT_DISRUPT, "")).lower() == "true"}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node not in guarded and do_not_disrupt(pod) and not (pod.get("metadata") or {}).get(
                "deletionTimestamp"):
            guarded[node] = f"node {node} has {DO_NOT_DISRUPT} (pod {pod_key(pod)})"
    return guarded


class _QuotaLeft:
    """Nodes the tenant's quota still allows beyond its static pools' quantities and its other live claims (None:
    no quota): a replacement made first is one node more for a while."""

    def __init__(self, tenant: Tenant, claims: list[NodeClaim]) -> None:
        self.left = None
        if tenant.quota_nodes is not None:
            static = {p.pk: p.quantity or 0 for p in NodePool.objects.filter(tenant=tenant, kind=PoolKind.STATIC)}
            live = [c for c in claims if c.phase in LIVE]
            by_id = {c.pk: c for c in live}
            extra = sum(1 for c in live if c.pool_id not in static or c.replacement_of_id in by_id)
            self.left = tenant.quota_nodes - sum(static.values()) - extra

    def take(self) -> bool:
        if self.left is None:
            return True
        if self.left < 1:
            return False
        self.left -= 1
        return True


@dataclass
class _PoolPass:
    """One static pool's roll in one pass."""

    pool: NodePool
    claims: list[NodeClaim]
    roll: PoolRoll
    guarded: dict[str, str]
    quota: _QuotaLeft
    now: datetime
    actor: str
    result: RollResult
    events: list[Event] = field(default_factory=list)

    def run(self) -> None:
        by_id = {c.pk: c for c in self.claims}
        self.gone: set[int] = set()  # released in this pass
        in_flight = []  # (old, its replacement) not Ready yet
        for new in self.claims:
            old = by_id.get(new.replacement_of_id)
            if old is None or old.phase != P.AVAILABLE:
                continue
            self._replacement(old, new, in_flight)
        serving = [c for c in self.claims if c.phase == P.AVAILABLE and c.pk not in self.gone]
        drifted = [c for c in serving if c.drifted_since]
        replacing = {old.pk for old, _ in in_flight}
        quantity = self.pool.quantity or 0
        down = max(0, quantity - len(serving))
        disrupting = down + len(in_flight)
        roll = self.roll
        roll.next_at = None
        if drifted and roll.started_at is None:
            roll.started_at, roll.replaced, roll.retry_at, roll.failure = self.now, 0, None, ""
        if roll.started_at is None:
            self._say("", "")
            return
        roll.total = roll.replaced + len(drifted)
        progress = _progress(roll, in_flight)
        candidates = [c for c in drifted if c.pk not in replacing]
        if not candidates:
            if not in_flight and not down:  # done
                roll.started_at = None
                self._say(progress, "")
            else:
                self._say(progress + (f", {down} node(s) not serving yet" if down else ""), "")
            return
        if hold := self._hold_before():
            key, why = hold
            self._say(f"{progress}; held: {why}", key)
            return
        budget = allowance(self.pool, R.DRIFTED, quantity, self.now)
        left = budget.allowed - disrupting
        guarded, waiting = [], []
        for claim in candidates:
            if why := self.guarded.get(claim.node_name):
                guarded.append((f"do-not-disrupt:{claim.node_name}", why))
            elif left > 0:
                in_flight.append((claim, self._start(claim)))
                left -= 1
            else:
                waiting.append(claim)
        progress = _progress(roll, in_flight) + (f", {down} node(s) not serving yet" if down else "")
        if waiting:
            key, says = self._budget_says(budget)
            self._say(f"{progress}; {says}", key)
        elif guarded:
            self._say(f"{progress}; held: {guarded[0][1]}", guarded[0][0])
        else:
            self._say(progress, "")

    # -- what holds the whole pool

    def _hold_before(self) -> tuple[str, str] | None:
        if self.pool.group_size:
            return "groups", "a pool of all-or-nothing groups is not rolled node by node"
        if self.roll.retry_at is not None and self.roll.retry_at > self.now:
            self.roll.next_at = self.roll.retry_at
            return "replacement-failed", f"{self.roll.failure}; tried again from {_hhmm(self.roll.retry_at)}"
        if failed := [c for c in self.claims if c.phase == P.FAILED and c.replacement_of_id is None]:
            # A node that did not come back (an in-place re-image's new claim): no other goes before it is seen to.
            return "failed", f"claim {failed[0].name} is Failed ({failed[0].message or failed[0].reason})"
        _, problem = os_image(self.pool.properties.get(OS_IMAGE_PROPERTY) or "")
        if problem:
            return f"image:{problem[0]}", f"{problem[1]}: no node is replaced with an image that cannot be written"
        return None

    def _budget_says(self, budget) -> tuple[str, str]:
        """(the hold's key, what the status says) for drifted nodes the budget keeps waiting."""
        nodes = budget.budget.get("nodes") if budget.budget else "?"
        if budget.allowed <= 0:
            if budget.until is not None:
                self.roll.next_at = budget.until
                return f"budget:{nodes}", f"held: the budget's window is closed until {_hhmm(budget.until)}"
            return f"budget:{nodes}", f"held: budget {nodes} ({R.DRIFTED})"
        window = f" within the window until {_hhmm(budget.until)}" if budget.until is not None else ""
        return "", f"next once one is Ready{window} (budget {nodes} at once)"

    # -- replacements made first

    def _replacement(self, old: NodeClaim, new: NodeClaim, in_flight: list) -> None:
        if new.phase == P.AVAILABLE:
            if why := self.guarded.get(old.node_name):
                in_flight.append((old, new))
                self.result.held[str(self.pool)] = why
                return
            claims_release(claims=[old], actor=self.actor,
                           reason=f"replaced by {new.name} (drifted: {old.drift or 'the pool changed'})")
            self.gone.add(old.pk)
            self.roll.replaced += 1
            self.result.released.append(old.name)
            self._event(R.DRIFTED, [old], f"released {old.name}: its replacement {new.name} is Ready "
                                          f"(drifted: {old.drift})", replacement=new.name)
            return
        if new.phase in (P.FAILED, P.RELEASING):
            why = new.message or new.reason or new.phase
            if new.phase == P.FAILED:
                claims_release(claims=[new], actor=self.actor, reason=f"a failed replacement of {old.name}")
            self.roll.retry_at = self.now + REPLACEMENT_RETRY
            self.roll.failure = f"replacement {new.name} of {old.name} failed ({why}); {old.name} keeps serving"[:300]
            NodeClaim.objects.filter(pk=new.pk).update(replacement_of=None)
            self._event(R.BLOCKED, [old], f"{self.roll.failure}; made again from {_hhmm(self.roll.retry_at)}",
                        replacement=new.name)
            return
        in_flight.append((old, new))

    def _start(self, claim: NodeClaim) -> NodeClaim | None:
        """Replace a drifted node: its replacement first (returned), else re-imaged in place (None)."""
        why = f"drifted: {claim.drift}"
        if self._free_host() and self.quota.take():
            new = claims_create(pool=self.pool, count=1, actor=self.actor, message=f"replaces {claim.name} ({why})")[0]
            NodeClaim.objects.filter(pk=new.pk).update(replacement_of=claim)
            self.result.replacing[claim.name] = new.name
            self._event(R.DRIFTED, [claim], f"replacing {claim.name} ({why}): new claim {new.name} first, "
                                            f"{claim.name} released once it is Ready", replacement=new.name)
            return new
        claims_release(claims=[claim], actor=self.actor, reason=f"re-imaged for pool {self.pool.name} ({why})",
                       purpose=ReleasePurpose.REIMAGE)
        task_send_on_commit(claim_tasks.RECONCILE_POOLS, pool_ids=[self.pool.pk])  # its new claim
        self.gone.add(claim.pk)
        self.roll.replaced += 1
        self.result.reimaging.append(claim.name)
        self._event(R.DRIFTED, [claim], f"re-imaging {claim.name} in place ({why}): no free host for a replacement "
                                        "first; drained and released, the pool makes its new node")
        return None

    def _free_host(self) -> bool:
        """Whether a host of a type this pool takes is free now (a replacement first would get it)."""
        for node_type in NodeType.objects.filter(provider_id=self.pool.provider_id).select_related("provider"):
            if (requirements_match(self.pool.node_type_selector, node_type.effective_properties())
                    and free_hosts(node_type).exists()):
                return True
        return False

    # -- telling

    def _say(self, status: str, held_by: str) -> None:
        if held_by and held_by != self.roll.held_by:
            self._event(R.BLOCKED, [], f"roll of {self.pool.name} {status}")
        if held_by:
            self.result.held[str(self.pool)] = status
        self.roll.status, self.roll.held_by = status[:300], held_by[:200]
        events_record(self.events)
        self.events = []

    def _event(self, reason: str, claims: list[NodeClaim], message: str, **extra) -> None:
        self.events.append(Event(
            kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=self.pool.name,
            tenant_id=self.pool.tenant_id, claim_id=claims[0].pk if len(claims) == 1 else None,
            host_id=claims[0].host_id if len(claims) == 1 else None, actor=self.actor, message=message,
            data={"reason": str(reason), "pool": self.pool.name, "claims": [c.name for c in claims],
                  "nodes": [c.node_name for c in claims], **extra}))


def _progress(roll: PoolRoll, in_flight: list[tuple[NodeClaim, NodeClaim | None]]) -> str:
    """"1 of 3 replaced, replacing one-x7k2q" (a replacement made first) / "re-imaging one-x7k2q" (in place)."""
    text = f"{roll.replaced} of {roll.total} replaced"
    first = [old.name for old, new in in_flight if new is not None]
    in_place = [old.name for old, new in in_flight if new is None]
    if first:
        text += f", replacing {', '.join(first)}"
    if in_place:
        text += f", re-imaging {', '.join(in_place)}"
    return text


def _hhmm(moment: datetime) -> str:
    return timezone.localtime(moment).strftime("%H:%M")
