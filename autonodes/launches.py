"""Slow launches: a dynamic pool's claim past its launch deadline is reported once, and kept."""
# The deadline is its NodeType's measured launch p95 (claims.selectors.launch_deadlines). Karpenter deletes a
# NodeClaim that has not registered within its TTL and launches another; on bare metal that loops (the next server
# takes just as long, and the first one is erased for nothing), so here a slow claim is only reported, on the claim
# and on its pool, and its pods keep waiting for it. Only a Failed claim gives its pods back (autonodes.services).
import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.selectors import LaunchDeadline, launch_deadline_unknown_type, launch_deadlines
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record
from pools.choices import PoolKind
from pools.models import NodeType

from .choices import DecisionReason

log = logging.getLogger(__name__)

LAUNCHING = (ClaimPhase.PENDING, ClaimPhase.PROVISIONING, ClaimPhase.JOINING)
ACTOR = "system:autonodes"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _where(claim: NodeClaim) -> str:
    """Where the launch is now, for people: the host's current step, or the wait for a host."""
    host = claim.host
    if host is None:
        said = claim.message if claim.message and "waiting for a host" not in claim.message else ""
        return f"still waiting for a host ({said})" if said else "still waiting for a host"
    step = (host.flow or {}).get("step")
    if step:
        return f"at step {step} on {host.name}"
    return f"{claim.phase.lower()} on {host.name}"


def slow_launch_message(claim: NodeClaim, deadline: LaunchDeadline, now: datetime) -> str:
    """"gpu-server usually ready in 12 min (p95); this one has taken 19 min, at step write_image on gpu-03"."""
    type_name = claim.node_type.name if claim.node_type else "a server of this pool"
    if deadline.p95_s is None:
        usual = f"{type_name} has no launch measured yet (allowed {_minutes(deadline.seconds)}, the cap)"
    else:
        usual = f"{type_name} usually ready in {_minutes(deadline.p95_s)} (p95)"
    taken = _minutes((now - claim.created_at).total_seconds())
    return f"{usual}; this one has taken {taken}, {_where(claim)}. Not relaunched: its pods keep waiting for it"


def launches_check(*, now: datetime | None = None) -> list[str]:
    """Report each launching claim of a dynamic pool that is past its launch deadline, once: one Event on the
    claim and one decision Event (LaunchSlow) on its pool. Nothing is released or created. A claim without a
    deadline (made before deadlines existed) gets one now, from its creation. Safe to run concurrently: the
    report is claimed with a compare-and-swap on launch_reported_at. Returns the names of the claims reported."""
    now = now or timezone.now()
    launching = NodeClaim.objects.filter(pool__kind=PoolKind.DYNAMIC, phase__in=LAUNCHING,
                                         launch_reported_at__isnull=True)
    undated = list(launching.filter(launch_deadline_at__isnull=True).values_list("pk", "node_type_id"))
    if undated:
        types = NodeType.objects.filter(pk__in={t for _, t in undated if t})
        deadlines = launch_deadlines(types)
        for pk, type_id in undated:
            seconds = (deadlines.get(type_id) or launch_deadline_unknown_type()).seconds
            NodeClaim.objects.filter(pk=pk, launch_deadline_at__isnull=True).update(
                launch_deadline_at=F("created_at") + timedelta(seconds=seconds))
    overdue = list(launching.filter(launch_deadline_at__lt=now)
                   .select_related("node_type", "host", "pool").order_by("pk"))
    if not overdue:
        return []
    deadlines = launch_deadlines({c.node_type for c in overdue if c.node_type})
    reported = []
    for claim in overdue:
        deadline = deadlines.get(claim.node_type_id) or launch_deadline_unknown_type()
        message = slow_launch_message(claim, deadline, now)
        with transaction.atomic():
            if not NodeClaim.objects.filter(pk=claim.pk, launch_reported_at__isnull=True).update(launch_reported_at=now):
                continue  # another pass reported it
            data = {"reason": DecisionReason.SLOW.value, "pool": claim.pool_name, "claims": [claim.name],
                    "node_type": claim.node_type.name if claim.node_type else "", "host": claim.host_name,
                    "phase": claim.phase, "p95_s": deadline.p95_s, "deadline_s": deadline.seconds,
                    "samples": deadline.samples, "taken_s": round((now - claim.created_at).total_seconds(), 1),
                    "step": ((claim.host.flow or {}).get("step") or "") if claim.host else ""}
            events_record([
                Event(kind=EventKind.DECISION, object_type=ObjectType.CLAIM, object_name=claim.name, claim_id=claim.pk,
                      tenant_id=claim.tenant_id, host_id=claim.host_id, message=message, actor=ACTOR, data=data),
                Event(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=claim.pool_name,
                      tenant_id=claim.tenant_id, message=f"claim {claim.name}: {message}", actor=ACTOR, data=data),
            ])
        log.info("claim %s launches slowly: %s", claim.name, message)
        reported.append(claim.name)
    return reported
