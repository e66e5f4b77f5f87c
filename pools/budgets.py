"""A pool's disruption budgets, as Karpenter reads them: how many of its nodes may be disrupted at once, for which
reasons, in which schedule windows. Dynamic pools' disruption (autonodes.disruption) and static pools' drift roll
(autonodes.roll) ask the same functions; so do the pages that show them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils import timezone

from .models import NodePool
from .validators import parse_cron, parse_duration

DEFAULT_BUDGET = {"nodes": "10%"}
UNLIMITED = 2**31 - 1


def budgets(pool: NodePool) -> list[dict]:
    return list((pool.disruption or {}).get("budgets") or [DEFAULT_BUDGET])


def _next_firing(cron, after: datetime) -> datetime:
    """The schedule's first firing strictly after `after` (minute resolution), in UTC."""
    start, delta, _ = cron.remaining_delta(after.astimezone(UTC), tz=UTC)
    return start + delta


def budget_window(budget: dict, now: datetime) -> tuple[bool, datetime | None]:
    """(in force now, until when: None when it has no schedule or is not in force). As Karpenter: in force when
    the schedule fired within the last `duration` (its next firing after now − duration is not after now)."""
    if budget.get("schedule") is None:
        return True, None
    cron = parse_cron(str(budget["schedule"]))
    duration = parse_duration(str(budget["duration"]))
    fired = _next_firing(cron, now - duration)
    if fired > now:
        return False, None
    for _ in range(10_000):  # the latest firing so far, then windows that overlap it
        following = _next_firing(cron, fired)
        if following > now:
            break
        fired = following
    until = fired + duration
    for _ in range(1_000):  # windows that begin before this one ends extend it
        following = _next_firing(cron, fired)
        if following >= until:
            return True, until
        fired, until = following, following + duration
    return True, None  # windows overlap without end (every minute for an hour): in force, no end in sight


def next_window(budget: dict, now: datetime) -> datetime | None:
    """When a scheduled budget's window next opens after `now` (None: it has no schedule, or cannot be read)."""
    if budget.get("schedule") is None:
        return None
    try:
        return _next_firing(parse_cron(str(budget["schedule"])), now)
    except (ValueError, TypeError):
        return None


def budget_nodes(budget: dict, total: int) -> int:
    """A budget's node count for a pool of `total` nodes: a percentage rounded up, as Karpenter does."""
    nodes = str(budget.get("nodes", "10%")).strip()
    if nodes.endswith("%"):
        return math.ceil(int(nodes[:-1]) * total / 100)
    return int(nodes)


@dataclass
class Allowance:
    allowed: int  # nodes this reason may disrupt at once (before those already being disrupted)
    budget: dict | None  # the binding budget (None: no budget in force for this reason)
    until: datetime | None  # when that budget stops being in force (scheduled budgets)


def allowance(pool: NodePool, reason: str, total: int, now: datetime) -> Allowance:
    """The most restrictive budget in force for this reason. A budget that cannot be read blocks (fail closed,
    as Karpenter); apply refuses such budgets, so only a row changed behind the validators' back gets here."""
    best = Allowance(UNLIMITED, None, None)
    for budget in budgets(pool):
        if budget.get("reasons") and reason not in budget["reasons"]:
            continue
        try:
            active, until = budget_window(budget, now)
            allowed = budget_nodes(budget, total)
        except (ValueError, TypeError):
            return Allowance(0, budget, None)
        if active and allowed < best.allowed:
            best = Allowance(allowed, budget, until)
    return best


def in_force(pool: NodePool, now: datetime | None = None) -> list[dict]:
    """The pool's budgets in force now, each with "until" (a datetime or None), for the pool page."""
    now = now or timezone.now()
    shown = []
    for budget in budgets(pool):
        try:
            active, until = budget_window(budget, now)
        except (ValueError, TypeError):
            active, until = True, None
        if active:
            shown.append({**budget, "until": until})
    return shown
