"""Fleet timing (/timing/): p50/p95 per step and the hosts-by-state history, as SVG geometry for the page."""
from datetime import timedelta

from django.db.models import Count
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost

from .choices import ClaimPhase
from .models import NodeClaim
from .presenters import ALLOCATE, FLOW_LABELS


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def step_timings(recent: int = 5000) -> list[dict]:
    """p50 / p95 per flow step over the last `recent` finished steps (provisions and releases)."""
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
        by_step[("claim", "pending → available")] = totals
    order = {name: i for i, name in enumerate(
        [ALLOCATE, "power_on_pxe", "agent_lookup", "inspect", "write_image", "write_seed", "reboot_to_disk",
         "boot_from_disk", "node_ready", "node_labels", "drain_node", "delete_node", "power_off", "erase_metadata",
         "power_off_after_clean", "bmc_check", "pending → available"])}
    flows = {"claim": 0, "provision": 1, "deprovision": 2, "inspect": 3, "register": 4}
    result = [{"flow": flow, "step": step, "n": len(values), "p50": percentile(values, 50),
               "p95": percentile(values, 95), "max": max(values)}
              for (flow, step), values in by_step.items()]
    result.sort(key=lambda r: (flows.get(r["flow"], 9), order.get(r["step"], 99), r["step"]))
    return result


def timing_chart(timings: list[dict], width: int = 760) -> dict:
    """Horizontal bars: p50 filled, p95 as a lighter bar behind it; a log-free linear axis in seconds."""
    row_h, label_w, pad = 22, 230, 8
    top = 24
    biggest = max((t["p95"] for t in timings), default=1.0) or 1.0
    scale = (width - label_w - 70) / biggest
    bars = []
    for i, t in enumerate(timings):
        y = top + i * row_h
        bars.append({**t, "y": y, "text_y": y + 14, "label": f"{FLOW_LABELS.get(t['flow'], t['flow'])} · {t['step']}",
                     "w50": max(1.0, t["p50"] * scale), "w95": max(1.0, t["p95"] * scale),
                     "value_x": label_w + max(1.0, t["p95"] * scale) + 6})
    ticks = []
    for k in range(5):
        value = biggest * k / 4
        ticks.append({"x": label_w + value * scale, "label": _seconds(value)})
    return {"width": width, "height": top + len(timings) * row_h + pad + 18, "bars": bars, "label_w": label_w,
            "ticks": ticks, "axis_y": top + len(timings) * row_h + 4}


def _seconds(value: float) -> str:
    if value >= 120:
        return f"{value / 60:.0f}m"
    if value >= 10:
        return f"{value:.0f}s"
    return f"{value:.1f}s"


def state_history(hours: int = 24, buckets: int = 48, cap: int = 100_000) -> dict:
    """Host counts per state over the last `hours`, rebuilt backwards from today's counts and the host
    transitions in the Event log (an aggregate and one read of the window's transitions)."""
    now = timezone.now()
    start = now - timedelta(hours=hours)
    counts = dict.fromkeys(HostState.values, 0)
    for row in BareMetalHost.objects.order_by().values("state").annotate(n=Count("pk")):
        counts[row["state"]] = row["n"]
    transitions = list(Event.objects.filter(object_type=ObjectType.HOST, kind=EventKind.TRANSITION,
                                            created_at__gte=start)
                       .exclude(from_state="").order_by("-created_at")
                       .values_list("created_at", "from_state", "to_state")[:cap])
    step = (now - start) / buckets
    series = {s: [0] * (buckets + 1) for s in HostState.values}
    current = dict(counts)
    i = 0
    for b in range(buckets, -1, -1):
        moment = start + step * b
        while i < len(transitions) and transitions[i][0] > moment:
            _, from_state, to_state = transitions[i]
            if to_state in current:
                current[to_state] -= 1
            if from_state in current:
                current[from_state] += 1
            i += 1
        for s in HostState.values:
            series[s][b] = max(0, current[s])
    return {"start": start, "end": now, "series": series, "buckets": buckets}


# Each state's line in its badge's colour family (hosts.choices.HostState): available green, provisioned blue,
# repair violet, the in-progress states amber.
STATE_STROKES = {"registering": "#8a94a6", "inspecting": "#6b7280", "available": "#16a34a",
                 "provisioning": "#f59e0b", "provisioned": "#1c7ed6", "deprovisioning": "#d97706",
                 "repair": "#7048e8", "error": "#dc2626", "maintenance": "#334155"}


def history_chart(history: dict, width: int = 760, height: int = 220) -> dict:
    left, right, top, bottom = 40, 120, 10, 24
    buckets = history["buckets"]
    biggest = max((max(v) for v in history["series"].values()), default=1) or 1
    x = lambda b: left + (width - left - right) * b / buckets  # noqa: E731
    y = lambda n: top + (height - top - bottom) * (1 - n / biggest)  # noqa: E731
    lines = []
    for i, (state, values) in enumerate(history["series"].items()):
        if not any(values):
            continue
        points = " ".join(f"{x(b):.1f},{y(n):.1f}" for b, n in enumerate(values))
        lines.append({"state": state, "points": points, "colour": STATE_STROKES.get(state, "#888"),
                      "last": values[-1], "legend_y": top + 14 * len(lines) + 8})
    ticks = [{"y": y(biggest * k / 4), "label": round(biggest * k / 4)} for k in range(5)]
    return {"width": width, "height": height, "lines": lines, "ticks": ticks, "left": left,
            "right_x": width - right + 8, "plot_right": width - right, "bottom_y": height - bottom,
            "start": history["start"], "end": history["end"]}


