"""What the console shows of claims: rows, the step timeline of one claim ("where the time goes"), and
the fleet's step timings. All read the Event log: step Events (kind="step", "started" / "done" /
"failed: …", duration_s) and phase transitions."""
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.template.loader import render_to_string
from django.utils import timezone

from events.choices import EventKind
from events.models import Event
from hosts.models import HostCommand

from .choices import ClaimPhase
from .models import NodeClaim

ALLOCATE = "allocate"  # the claim's wait for a host: from its creation to Scheduled
# The seed's table, step by step: what happens, where the time goes, and the flow steps that do it.
SEED_STEPS = [
    (1, "The Platform creates a NodeClaim and picks a free host that matches the node type", "Seconds",
     (ALLOCATE,)),
    (2, "The BMC is told to boot the server from the network and power it on",
     "Server POST: seconds in a VM, minutes on a real GPU server", ("power_on_pxe",)),
    (3, "The server PXE boots the agent ramdisk", "Seconds", ("agent_lookup", "inspect")),
    (4, "The agent downloads the OS image and writes it to disk", "The longest part", ("write_image", "write_seed")),
    (5, "The server reboots into the new OS; cloud-init runs the join script", "A minute or so",
     ("reboot_to_disk", "boot_from_disk")),
    (6, "The kubelet registers with the tenant API and the node goes Ready", "Seconds", ("node_ready", "node_labels")),
]
FLOW_LABELS = {"provision": "Provision", "deprovision": "Release (drain, clean, check)", "claim": "Claim"}


@dataclass
class StepBar:
    name: str
    flow: str
    host: str
    started_at: datetime
    ended_at: datetime | None = None
    duration_s: float | None = None
    status: str = "running"  # running | done | failed
    message: str = ""
    progress: float | None = None
    left: float = 0.0  # percent of the timeline
    width: float = 0.0

    @property
    def dom_id(self) -> str:
        return f"step-{self.flow}-{self.name}"


@dataclass
class Timeline:
    bars: list[StepBar] = field(default_factory=list)
    start: datetime | None = None
    end: datetime | None = None
    seed: list[dict] = field(default_factory=list)
    total_s: float = 0.0
    running: StepBar | None = None


def claim_timeline(claim: NodeClaim, *, now: datetime | None = None) -> Timeline:
    """Every step of the claim, in order, as bars on one time axis. Two queries: the claim's step Events
    and, when a step is under way, its agent command's progress."""
    now = now or timezone.now()
    events = list(Event.objects.filter(claim_id=claim.pk, kind=EventKind.STEP).order_by("pk")
                  .values("step", "message", "duration_s", "created_at", "object_name", "data"))
    bars: list[StepBar] = []
    open_bars: dict[tuple, StepBar] = {}
    scheduled = claim.scheduled_at
    if scheduled or claim.phase == ClaimPhase.PENDING:
        end = scheduled or None
        bars.append(StepBar(name=ALLOCATE, flow="claim", host="", started_at=claim.created_at, ended_at=end,
                            duration_s=(end - claim.created_at).total_seconds() if end else None,
                            status="done" if end else "running",
                            message="a host was allocated" if end else (claim.message or "waiting for a host")))
        if end is None:
            open_bars[("claim", ALLOCATE)] = bars[-1]
    for e in events:
        flow = (e["data"] or {}).get("flow") or "provision"
        key = (flow, e["step"], e["object_name"])
        message = e["message"] or ""
        if message == "started":
            bar = StepBar(name=e["step"], flow=flow, host=e["object_name"], started_at=e["created_at"])
            bars.append(bar)
            open_bars[key] = bar
            continue
        bar = open_bars.pop(key, None)
        if bar is None:  # no "started" seen (older events): place it by its duration
            duration = e["duration_s"] or 0.0
            bar = StepBar(name=e["step"], flow=flow, host=e["object_name"],
                          started_at=e["created_at"] - timedelta(seconds=duration))
            bars.append(bar)
        bar.ended_at = e["created_at"]
        bar.duration_s = e["duration_s"] if e["duration_s"] is not None else \
            (bar.ended_at - bar.started_at).total_seconds()
        bar.status = "failed" if message.startswith(("failed", "skipped")) else "done"
        bar.message = message
    live = claim.phase not in (ClaimPhase.RELEASED, ClaimPhase.FAILED)
    running = None
    for bar in bars:
        if bar.status == "running":
            if live:
                bar.duration_s = (now - bar.started_at).total_seconds()
                running = bar
            else:
                bar.status = "abandoned"
    if running is not None and claim.host_id and running.flow != "claim":
        command = (HostCommand.objects.filter(host_id=claim.host_id, step=running.name).defer("secret_args")
                   .order_by("-pk").first())
        if command is not None and command.progress is not None:
            running.progress = round(command.progress, 1)
            running.message = command.message or running.message
    timeline = Timeline(bars=bars, running=running)
    if bars:
        timeline.start = min(b.started_at for b in bars)
        timeline.end = max((b.ended_at or now) for b in bars)
        span = max((timeline.end - timeline.start).total_seconds(), 0.001)
        for bar in bars:
            bar.left = round(100 * (bar.started_at - timeline.start).total_seconds() / span, 3)
            bar.width = round(max(0.4, 100 * (bar.duration_s or 0) / span), 3)
            bar.width = min(bar.width, round(100 - bar.left, 3)) if bar.left < 100 else 0.4
        timeline.total_s = span
    timeline.seed = seed_summary(bars)
    return timeline


def seed_summary(bars: list[StepBar]) -> list[dict]:
    """The seed's six steps with the time each took for this claim (its provisioning only)."""
    provision = [b for b in bars if b.flow in ("provision", "claim")]
    total = sum(b.duration_s or 0 for b in provision) or 0.0
    rows = []
    for number, what, expectation, steps in SEED_STEPS:
        spent = sum(b.duration_s or 0 for b in provision if b.name in steps)
        seen = any(b.name in steps for b in provision)
        rows.append({"number": number, "what": what, "expectation": expectation, "steps": steps,
                     "seconds": spent if seen else None, "share": round(100 * spent / total, 1) if total else 0})
    return rows


def claims_rows_queryset(qs):
    return qs.select_related("tenant", "node_type", "host").defer(
        "requirements", "properties", "node_labels", "taints", "host__bmc_username", "host__bmc_password",
        "host__inventory", "host__flow")


def with_progress(claims: list[NodeClaim]) -> list[NodeClaim]:
    """Each provisioning claim's current step and image write % (one query for all)."""
    host_ids = [c.host_id for c in claims if c.host_id and c.phase == ClaimPhase.PROVISIONING]
    progress = {}
    if host_ids:
        for cmd in (HostCommand.objects.filter(host_id__in=host_ids, status__in=["queued", "sent"])
                    .order_by("host_id", "-pk").values("host_id", "step", "progress")):
            progress.setdefault(cmd["host_id"], cmd)
    for claim in claims:
        cmd = progress.get(claim.host_id) if claim.phase == ClaimPhase.PROVISIONING else None
        claim.current_step = cmd["step"] if cmd else ""
        claim.progress = round(cmd["progress"], 1) if cmd and cmd["progress"] is not None else None
    return claims


def render_claim_rows(claims: list[NodeClaim], *, show_tenant: bool) -> list[str]:
    return [render_to_string("claims/partials/claim_row.html", {"c": c, "show_tenant": show_tenant, "oob": True})
            for c in claims]


# --- fleet timing ---------------------------------------------------------------------------------------

def claim_total(claim: NodeClaim) -> float | None:
    if claim.available_at:
        return (claim.available_at - claim.created_at).total_seconds()
    return None
