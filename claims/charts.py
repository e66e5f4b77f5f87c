"""Fleet timing (/timing/): p50/p95 per step and the hosts-by-state history, as SVG geometry for the page."""
import math
from datetime import timedelta

from django.db.models import Count, Min, Q
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.models import Event
from hosts.choices import HostState
from hosts.flows.steps import GATE_STEPS, TIER_STEPS
from hosts.lifecycle import FLOWS
from hosts.models import BareMetalHost

from .choices import ALLOCATE, ClaimPhase
from .models import NodeClaim
from .providers import MACHINE_FLOW, MACHINE_STEP_ORDER, machine_step_durations
from .stats import percentile


# Flows in the order a host lives them: registered, inspected, serving a claim (the claim's wait, provision),
# released, retested. A flow not named here comes after them, by name.
# An external provider's machine (machines/) lives its own steps in place of provision and deprovision.
FLOW_ORDER = ("register", "inspect", "claim", "provision", MACHINE_FLOW, "deprovision", "retest", "idle_check")
CLAIM_STEPS = (ALLOCATE, "pending → available")  # the claim's own rows: the wait for a host, then the whole way


def flow_steps(flow: str) -> tuple[str, ...]:
    """The steps of `flow` in the order it runs them, from the step engine's registry (hosts.lifecycle.FLOWS)."""
    if flow == "claim":
        return CLAIM_STEPS
    if flow == MACHINE_FLOW:
        return MACHINE_STEP_ORDER
    registered = FLOWS.get(flow)
    return tuple(dict.fromkeys(step.name for step in registered.steps)) if registered else ()


def step_sort_key(flow: str, step: str) -> tuple:
    """Flows as FLOW_ORDER lists them, each flow's steps as the flow runs them; unknown steps last, by name."""
    order = flow_steps(flow)
    flow_rank = FLOW_ORDER.index(flow) if flow in FLOW_ORDER else len(FLOW_ORDER)
    return (flow_rank, flow, order.index(step) if step in order else len(order), step)


def step_timings(recent: int = 5000) -> list[dict]:
    """p50 / p95 per flow step over the last `recent` finished steps (every flow), ordered as the flows run."""
    rows = list(Event.objects.filter(kind=EventKind.STEP, message="done", duration_s__isnull=False)
                .order_by("-pk").values_list("step", "data__flow", "duration_s")[:recent])
    by_step: dict[tuple, list[float]] = {}
    for step, flow, duration in rows:
        by_step.setdefault((flow or "provision", step), []).append(duration)
    waits = list(Event.objects.filter(object_type=ObjectType.CLAIM, from_state=ClaimPhase.PENDING,
                                      to_state=ClaimPhase.PROVISIONING, duration_s__isnull=False)
                 .order_by("-pk").values_list("duration_s", flat=True)[:1000])
    if waits:
        by_step[("claim", ALLOCATE)] = waits
    totals = [(c.available_at - c.created_at).total_seconds() for c in
              NodeClaim.objects.filter(available_at__isnull=False).only("created_at", "available_at")
              .order_by("-available_at")[:1000]]
    if totals:
        by_step[("claim", CLAIM_STEPS[-1])] = totals
    for step, values in machine_step_durations(recent).items():  # external providers' machines (machines/)
        if values:
            by_step[(MACHINE_FLOW, step)] = values
    result = [{"flow": flow, "step": step, "n": len(values), "p50": percentile(values, 50),
               "p95": percentile(values, 95), "max": max(values)}
              for (flow, step), values in by_step.items()]
    result.sort(key=lambda r: step_sort_key(r["flow"], r["step"]))
    return result


TIER_ORDER = ("handover", "release", "intake", "idle")


def tier_timings(recent: int = 5000) -> list[dict]:
    """p50 / p95 of each health tier's whole duration (pools/health_tiers.py): its steps in one flow run added
    up (release: the gate, erase to NCCL), over the last `recent` finished tier steps; skipped steps left out."""
    tier_of = {**dict.fromkeys(GATE_STEPS, "release"), **TIER_STEPS}
    rows = list(Event.objects.filter(kind=EventKind.STEP, message="done", duration_s__isnull=False,
                                     step__in=list(tier_of), data__skipped__isnull=True)
                .order_by("-pk").values_list("step", "data__flow_id", "duration_s")[:recent])
    runs: dict[tuple, float] = {}
    for step, flow_id, duration in rows:
        key = (tier_of[step], flow_id)
        runs[key] = runs.get(key, 0.0) + duration
    by_tier: dict[str, list[float]] = {}
    for (tier, _), total in runs.items():
        by_tier.setdefault(tier, []).append(total)
    return [{"tier": tier, "n": len(by_tier[tier]), "p50": percentile(by_tier[tier], 50),
             "p95": percentile(by_tier[tier], 95), "max": max(by_tier[tier])}
            for tier in TIER_ORDER if tier in by_tier]


CHAR_W = 7  # px per character of the charts' 11 px labels, on the generous side: a label is never clipped


def _time_unit(biggest: float) -> tuple[str, float]:
    """One unit for a whole axis: minutes once the longest bar passes two minutes, else seconds."""
    return ("min", 60.0) if biggest >= 120 else ("s", 1.0)


def nice_step(biggest: float, ticks: int = 4) -> float:
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) that covers `biggest` in about `ticks` steps."""
    raw = max(biggest, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:g}"


def timing_chart(timings: list[dict], width: int = 960) -> dict:
    """Horizontal bars: p50 filled, p95 as a lighter bar behind it, on a linear axis in one unit (named in the
    axis title and after each bar's values). The label column is as wide as the longest label and the value
    labels have room on the right, so nothing is clipped; the page scales the SVG to its card (viewBox, 100%)."""
    row_h, top = 22, 24
    biggest = max((t["p95"] for t in timings), default=1.0) or 1.0
    unit, per = _time_unit(biggest)
    labels = [f"{t['flow']} · {t['step']}" for t in timings]
    values = [f"{t['p50'] / per:.1f} / {t['p95'] / per:.1f} {unit}" for t in timings]  # the axis's unit
    label_w = CHAR_W * max((len(label) for label in labels), default=10) + 16
    value_w = CHAR_W * max((len(v) for v in values), default=10) + 12
    width = max(width, label_w + value_w + 240)
    tick = nice_step(biggest / per)
    axis_max = tick * math.ceil(biggest / per / tick) * per  # the axis ends on a round tick at or past the longest bar
    scale = (width - label_w - value_w) / axis_max
    bars = []
    for i, (t, label, value) in enumerate(zip(timings, labels, values)):
        y = top + i * row_h
        bars.append({**t, "y": y, "text_y": y + 14, "label": label, "value": value,
                     "w50": max(1.0, t["p50"] * scale), "w95": max(1.0, t["p95"] * scale),
                     "value_x": label_w + max(1.0, t["p95"] * scale) + 6})
    ticks = []
    for k in range(round(axis_max / per / tick) + 1):
        value = k * tick * per
        ticks.append({"x": label_w + value * scale, "label": _number(round(k * tick, 6))})
    axis_y = top + len(timings) * row_h + 4
    return {"width": width, "height": axis_y + 36, "bars": bars, "label_w": label_w, "ticks": ticks,
            "axis_y": axis_y, "axis_title": f"step duration ({unit})", "title_y": axis_y + 30,
            "plot_mid": label_w + (width - label_w - value_w) / 2, "unit": unit,
            "unit_name": "minutes" if unit == "min" else "seconds"}


def state_history(hours: int = 24, buckets: int = 48, cap: int = 100_000) -> dict:
    """Host counts per state over the last `hours`, rebuilt backwards from today's counts and the host events in
    the Event log: each move undone, each host's creation (a transition from nothing) taking it out, each deletion
    putting it back. The history starts where the data starts: at the window's start, or later when the first
    host came later (a host counts only from its creation). One aggregate and one read of the window's events."""
    now = timezone.now()
    window_start = now - timedelta(hours=hours)
    counts = dict.fromkeys(HostState.values, 0)
    for row in BareMetalHost.objects.order_by().values("state").annotate(n=Count("pk")):
        counts[row["state"]] = row["n"]
    events = list(Event.objects.filter(Q(kind=EventKind.TRANSITION) | Q(kind=EventKind.CHANGE, data__deleted=True),
                                       object_type=ObjectType.HOST, created_at__gte=window_start)
                  .order_by("-created_at", "-pk").values_list("created_at", "from_state", "to_state")[:cap])
    first_host = BareMetalHost.objects.aggregate(first=Min("created_at"))["first"]
    if first_host is None and not events:
        return {"start": now, "end": now, "series": {}, "buckets": buckets, "data_starts_late": False}
    if first_host is not None and first_host <= window_start:
        start = window_start
    else:  # every host came within the window: the first event (a host's creation) is where the data starts
        start = events[-1][0] if events else first_host
    step = (now - start) / buckets
    series = {s: [0] * (buckets + 1) for s in HostState.values}
    current = dict(counts)
    i = 0
    for b in range(buckets, -1, -1):
        moment = start + step * b
        while i < len(events) and events[i][0] > moment:
            _, from_state, to_state = events[i]
            if to_state in current:
                current[to_state] -= 1
            if from_state in current:
                current[from_state] += 1
            i += 1
        for s in HostState.values:
            series[s][b] = max(0, current[s])
    return {"start": start, "end": now, "series": series, "buckets": buckets, "data_starts_late": start > window_start}


# Each state's line in its badge's colour family (hosts.choices.HostState): available green, provisioned blue,
# repair violet, the in-progress states amber.
STATE_STROKES = {"registering": "#8a94a6", "inspecting": "#6b7280", "available": "#16a34a", "checking": "#86efac",
                 "provisioning": "#f59e0b", "provisioned": "#1c7ed6", "deprovisioning": "#d97706",
                 "repair": "#7048e8", "error": "#dc2626", "maintenance": "#334155"}


def history_chart(history: dict, width: int = 960, height: int = 240) -> dict:
    """Lines of hosts per state from the first data point to now: a y axis of whole hosts, time ticks along x
    (times of day, with the date when the span passes a day), both axes titled, a legend wide enough for its
    labels. The page scales the SVG to its card."""
    series = {state: values for state, values in history["series"].items() if any(values)}
    legend = [f"{state} ({values[-1]})" for state, values in series.items()]
    left, top, bottom = 52, 10, 42
    right = CHAR_W * max((len(label) for label in legend), default=8) + 30
    buckets = history["buckets"]
    biggest = max((max(v) for v in series.values()), default=1) or 1
    per_tick = max(1, math.ceil(biggest / 4))
    top_value = per_tick * math.ceil(biggest / per_tick)
    x = lambda b: left + (width - left - right) * b / buckets  # noqa: E731
    y = lambda n: top + (height - top - bottom) * (1 - n / top_value)  # noqa: E731
    lines = []
    for (state, values), label in zip(series.items(), legend):
        points = " ".join(f"{x(b):.1f},{y(n):.1f}" for b, n in enumerate(values))
        lines.append({"state": state, "points": points, "colour": STATE_STROKES.get(state, "#888"),
                      "last": values[-1], "legend": label, "legend_y": top + 14 * len(lines) + 8})
    ticks = [{"y": y(n), "label": n} for n in range(0, top_value + 1, per_tick)]
    start, end = history["start"], history["end"]
    fmt = "%m-%d %H:%M" if end - start > timedelta(days=1) else "%H:%M:%S" if end - start < timedelta(minutes=5) \
        else "%H:%M"
    x_ticks = [{"x": x(buckets * k / 4), "label": timezone.localtime(start + (end - start) * k / 4).strftime(fmt),
                "anchor": "start" if k == 0 else "end" if k == 4 else "middle"} for k in range(5)]
    bottom_y = height - bottom
    return {"width": width, "height": height, "lines": lines, "ticks": ticks, "x_ticks": x_ticks, "left": left,
            "right_x": width - right + 8, "plot_right": width - right, "bottom_y": bottom_y,
            "x_label_y": bottom_y + 14, "x_title_y": height - 4, "plot_mid": (left + width - right) / 2,
            "y_title_y": top + (bottom_y - top) / 2, "timezone": timezone.get_current_timezone_name(),
            "start": start, "end": end, "data_starts_late": history.get("data_starts_late", False)}
