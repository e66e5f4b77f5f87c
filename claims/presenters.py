"""What the console shows of claims: rows, one claim's step timeline ("where the time goes") and its groups,
read from the Event log."""
# What the console shows of claims: rows, the step timeline of one claim ("where the time goes"), and
# the fleet's step timings. All read the Event log: step Events (kind="step", "started" / "done" /
# "failed: …", duration_s) and phase transitions.
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.template.loader import render_to_string
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.models import Event
from hosts.engine.drive import step_status
from hosts.models import HostCommand

from .choices import ALLOCATE, ClaimPhase
from .models import ClaimGroup, NodeClaim
from .providers import MACHINE_FLOW, machine_steps
from .selectors import claims_visible

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


@dataclass
class StepBar:
    name: str
    flow: str
    host: str
    started_at: datetime
    ended_at: datetime | None = None
    duration_s: float | None = None
    status: str = "running"  # running | done | failed | abandoned
    message: str = ""
    progress: float | None = None
    left: float = 0.0  # percent of the timeline
    width: float = 0.0
    attempt: int = 1  # the claim's attempt (one per host allocated to it) the step belongs to
    last_error: str = ""  # a step that retries: its last error ("retrying: …" Events)
    retries: int = 0

    @property
    def dom_id(self) -> str:
        return f"step-{self.flow}-{self.name}" + (f"-a{self.attempt}" if self.attempt > 1 else "")

    @property
    def reason(self) -> str:
        """Why a failed (or skipped) step ended so: its Event's words without the "failed: " prefix."""
        return self.message.split(": ", 1)[1] if self.status == "failed" and ": " in self.message else ""


@dataclass
class Attempt:
    """One host's turn at the claim: the wait for it (allocate), the steps on it, how it ended."""
    number: int
    host: str = ""
    bars: list[StepBar] = field(default_factory=list)
    outcome: str = "running"  # running | failed | the claim's phase for the last one
    reason: str = ""  # why a failed attempt ended (the claim's move back to Pending)
    seconds: float = 0.0  # its steps' time, the wait for the host not counted


@dataclass
class Timeline:
    bars: list[StepBar] = field(default_factory=list)
    start: datetime | None = None
    end: datetime | None = None
    seed: list[dict] = field(default_factory=list)
    total_s: float = 0.0
    running: StepBar | None = None
    attempts: list[Attempt] = field(default_factory=list)
    step: dict = field(default_factory=dict)  # the running step as its host's flow has it (hosts.engine)
    boot_skipped: bool = False  # no power-on or network boot: the server was already on (boot_skipped)


def _allocations(claim: NodeClaim, now: datetime) -> tuple[list[StepBar], list[str]]:
    """The claim's waits for a host, one per attempt, from its phase changes: from its creation (or its move
    back to Pending after a host failed it) to the next Scheduled. Time spent on a failed host is not a wait.
    Also why each attempt but the current one ended (the message of the move back to Pending)."""
    moves = list(Event.objects.filter(claim_id=claim.pk, kind=EventKind.TRANSITION, object_type=ObjectType.CLAIM)
                 .order_by("pk").values("from_state", "to_state", "created_at", "message"))
    waits, ended, since = [], [], claim.created_at
    for move in moves:
        if move["to_state"] == ClaimPhase.PROVISIONING and since is not None:
            waits.append(StepBar(name=ALLOCATE, flow="claim", host="", started_at=since, ended_at=move["created_at"],
                                 duration_s=(move["created_at"] - since).total_seconds(), status="done",
                                 message=f"a host was allocated: {move['message']}", attempt=len(waits) + 1))
            since = None
        elif move["to_state"] == ClaimPhase.PENDING and move["from_state"] not in ("", ClaimPhase.PENDING) and waits:
            ended.append(move["message"] or "")
            since = move["created_at"]
    if not waits and claim.scheduled_at:  # no phase changes recorded (older claims): its one timestamp
        end = claim.scheduled_at
        waits.append(StepBar(name=ALLOCATE, flow="claim", host="", started_at=claim.created_at, ended_at=end,
                             duration_s=(end - claim.created_at).total_seconds(), status="done",
                             message="a host was allocated"))
        since = None
    if claim.phase == ClaimPhase.PENDING and since is not None:
        waits.append(StepBar(name=ALLOCATE, flow="claim", host="", started_at=since, attempt=len(waits) + 1,
                             message=claim.message or "waiting for a host"))
    return waits, ended


def claim_timeline(claim: NodeClaim, *, now: datetime | None = None) -> Timeline:
    """Every step of the claim, in order, as bars on one time axis, grouped by attempt (one per host it was
    given). Three queries: the claim's step Events, its phase changes and, when a step is under way, its agent
    command's progress."""
    now = now or timezone.now()
    events = list(Event.objects.filter(claim_id=claim.pk, kind=EventKind.STEP).order_by("pk")
                  .values("step", "message", "duration_s", "created_at", "object_name", "data"))
    waits, ended = _allocations(claim, now)
    bars: list[StepBar] = list(waits)
    open_bars: dict[tuple, StepBar] = {("claim", ALLOCATE): b for b in waits if b.ended_at is None}
    starts = [b.ended_at for b in waits if b.ended_at is not None]  # each attempt's Scheduled

    def attempt_at(when) -> int:
        return max(1, sum(1 for at in starts if at <= when))

    for e in events:
        data = e["data"] or {}
        flow = data.get("flow") or "provision"
        key = (flow, e["step"], e["object_name"])
        message = e["message"] or ""
        if message == "started":
            bar = StepBar(name=e["step"], flow=flow, host=e["object_name"], started_at=e["created_at"],
                          attempt=attempt_at(e["created_at"]))
            bars.append(bar)
            open_bars[key] = bar
            continue
        if message.startswith("retrying: "):  # the step goes on: its error so far
            bar = open_bars.get(key)
            if bar is not None:
                bar.last_error, bar.retries = message.removeprefix("retrying: "), data.get("retries") or 0
            continue
        bar = open_bars.pop(key, None)
        if bar is None:  # no "started" seen (older events): place it by its duration
            duration = e["duration_s"] or 0.0
            bar = StepBar(name=e["step"], flow=flow, host=e["object_name"],
                          started_at=e["created_at"] - timedelta(seconds=duration))
            bar.attempt = attempt_at(bar.started_at)
            bars.append(bar)
        bar.ended_at = e["created_at"]
        bar.duration_s = e["duration_s"] if e["duration_s"] is not None else \
            (bar.ended_at - bar.started_at).total_seconds()
        bar.status = "failed" if message.startswith(("failed", "skipped")) else "done"
        bar.message = message
    for step in machine_steps(claim):  # an external provider's machine: its own steps (machines/)
        started, ended = step["started_at"], step["ended_at"]
        bars.append(StepBar(name=step["step"], flow=MACHINE_FLOW, host=step["machine"], started_at=started,
                            ended_at=ended, duration_s=(ended - started).total_seconds() if ended else None,
                            status=step["status"] if ended or step["status"] == "failed" else "running",
                            message=step["message"], attempt=attempt_at(started)))
    live = claim.phase not in (ClaimPhase.RELEASED, ClaimPhase.FAILED)
    last_attempt = max((b.attempt for b in bars), default=1)
    running = None
    for bar in bars:
        if bar.status == "running":
            if live and bar.attempt == last_attempt:
                bar.duration_s = (now - bar.started_at).total_seconds()
                running = bar
            else:
                bar.status = "abandoned"
    bars.sort(key=lambda b: (b.attempt, b.started_at))
    timeline = Timeline(bars=bars, running=running)
    if running is not None and claim.host_id and running.flow != "claim":
        command = (HostCommand.objects.filter(host_id=claim.host_id, step=running.name).defer("secret_args")
                   .order_by("-pk").first())
        if command is not None and command.progress is not None:
            running.progress = round(command.progress, 1)
            running.message = command.message or running.message
        host = claim.host if _host_loaded(claim) else None
        status = step_status(host) if host is not None else {}
        if status.get("name") == running.name:
            timeline.step = status
            running.last_error = status["last_error"] or running.last_error
            running.retries = status["retries"] or running.retries
    if bars:
        timeline.start = min(b.started_at for b in bars)
        timeline.end = max((b.ended_at or now) for b in bars)
        span = max((timeline.end - timeline.start).total_seconds(), 0.001)
        for bar in bars:
            bar.left = round(100 * (bar.started_at - timeline.start).total_seconds() / span, 3)
            bar.width = round(max(0.4, 100 * (bar.duration_s or 0) / span), 3)
            bar.width = min(bar.width, round(100 - bar.left, 3)) if bar.left < 100 else 0.4
        timeline.total_s = span
    timeline.attempts = _attempts(claim, bars, ended, last_attempt)
    timeline.seed = seed_summary(bars, last_attempt)
    timeline.boot_skipped = boot_skipped(bars, last_attempt)
    return timeline


def _host_loaded(claim: NodeClaim) -> bool:
    return NodeClaim.host.is_cached(claim) and claim.host is not None


def _attempts(claim: NodeClaim, bars: list[StepBar], ended: list[str], last: int) -> list[Attempt]:
    attempts = [Attempt(number=n) for n in range(1, last + 1)]
    for bar in bars:
        attempt = attempts[bar.attempt - 1]
        attempt.bars.append(bar)
        if bar.name != ALLOCATE:
            attempt.host = attempt.host or bar.host
            attempt.seconds += bar.duration_s or 0
    for attempt in attempts:
        if attempt.number < last:
            attempt.outcome = "failed"
            attempt.reason = ended[attempt.number - 1] if attempt.number - 1 < len(ended) else ""
        else:
            attempt.outcome = claim.phase
            attempt.host = attempt.host or claim.host_name
            if claim.phase == ClaimPhase.FAILED:
                attempt.reason = claim.message
    return attempts


BOOT_STEPS = {"power_on_pxe", "agent_lookup", "inspect"}


def boot_skipped(bars: list[StepBar], last_attempt: int = 1) -> bool:
    """The attempt's server was already on in the agent's ramdisk (a warm host: hosts/flows/warm.py): its provision
    wrote the image with no power-on, network boot or lookup. Those steps leave no trace then."""
    steps = {b.name for b in bars if b.flow == "provision" and b.attempt == last_attempt}
    return bool(steps) and not steps & BOOT_STEPS and bool(steps & {"write_image", "write_seed"})


def seed_summary(bars: list[StepBar], last_attempt: int = 1) -> list[dict]:
    """The seed's six steps with the time each took for this claim (its provisioning only): the waits for a
    host (every attempt's) as step 1, the steps of the current attempt as steps 2-6, and the time the claim
    spent on hosts that failed it, when any, as a row of its own."""
    provision = [b for b in bars if b.flow in ("provision", "claim")]
    total = sum(b.duration_s or 0 for b in provision) or 0.0
    skipped = boot_skipped(bars, last_attempt)
    rows = []
    for number, what, expectation, steps in SEED_STEPS:
        counted = [b for b in provision if b.name in steps and (b.name == ALLOCATE or b.attempt == last_attempt)]
        spent = sum(b.duration_s or 0 for b in counted)
        rows.append({"number": number, "what": what, "expectation": expectation, "steps": steps,
                     "seconds": spent if counted else None, "skipped": skipped and set(steps) <= BOOT_STEPS,
                     "share": round(100 * spent / total, 1) if total else 0})
    earlier = [b for b in provision if b.name != ALLOCATE and b.attempt < last_attempt]
    if earlier:
        hosts = ", ".join(dict.fromkeys(b.host for b in earlier if b.host))
        spent = sum(b.duration_s or 0 for b in earlier)
        rows.append({"number": "", "what": f"Earlier attempts, on hosts that failed the claim ({hosts})",
                     "expectation": "—", "steps": (), "seconds": spent, "earlier": True,
                     "share": round(100 * spent / total, 1) if total else 0})
    return rows


def claims_rows_queryset(qs):
    return qs.select_related("tenant", "node_type", "host").defer(
        "requirements", "properties", "node_labels", "taints", "host__bmc_username", "host__bmc_password",
        "host__inventory", "host__flow")


def with_progress(claims: list[NodeClaim]) -> list[NodeClaim]:
    """Each provisioning or releasing claim's current agent step and its progress (an image write, an erase), one
    query for all."""
    followed = (ClaimPhase.PROVISIONING, ClaimPhase.RELEASING)
    host_ids = [c.host_id for c in claims if c.host_id and c.phase in followed]
    progress = {}
    if host_ids:
        for cmd in (HostCommand.objects.filter(host_id__in=host_ids, status__in=["queued", "sent"])
                    .order_by("host_id", "-pk").values("host_id", "step", "progress")):
            progress.setdefault(cmd["host_id"], cmd)
    for claim in claims:
        cmd = progress.get(claim.host_id) if claim.phase in followed else None
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


# --- all-or-nothing groups, shown as one unit (the claims list, the pool page) --------------------------------

# A group's own states (Waiting: not placed; Replacing: a member waits for a new host) and the claim phases it
# shares, coloured as the phases are: state → badge colour.
GROUP_STATES = {"Waiting": "secondary", "Replacing": "warning",
                **{p: ClaimPhase.colour(p) for p in (ClaimPhase.PROVISIONING, ClaimPhase.AVAILABLE, ClaimPhase.FAILED,
                                                     ClaimPhase.RELEASING, ClaimPhase.RELEASED)}}


def claim_groups_rows(groups) -> list:
    """Groups with their members (in two queries), where they sit and one state for the whole group:
    Waiting (not placed), Provisioning, Available (every member), Replacing (a member waits for a new host),
    Failed, Releasing, Released."""
    groups = list(groups)
    members: dict[int, list] = {}
    for claim in NodeClaim.objects.filter(group_id__in=[g.pk for g in groups]).order_by("pk"):
        members.setdefault(claim.group_id, []).append(claim)
    for group in groups:
        live = [c for c in members.get(group.pk, []) if c.phase != ClaimPhase.RELEASED]
        releasing = [c for c in members.get(group.pk, []) if c.phase == ClaimPhase.RELEASING]
        current = [c for c in live if c.phase != ClaimPhase.RELEASING]
        group.shown_members = current or live
        phases = {c.phase for c in current}
        if not live:
            group.state = ClaimPhase.RELEASED
        elif not current:
            group.state = ClaimPhase.RELEASING
        elif group.placed_at is None:
            group.state = "Waiting"
        elif ClaimPhase.FAILED in phases:
            group.state = ClaimPhase.FAILED
        elif ClaimPhase.PENDING in phases:
            group.state = "Replacing"
        elif phases == {ClaimPhase.AVAILABLE}:
            group.state = ClaimPhase.AVAILABLE
        else:
            group.state = ClaimPhase.PROVISIONING
        group.state_colour = GROUP_STATES[group.state]
        group.releasing = len(releasing)
        group.where = ", ".join(f"{'rail' if key == 'rail_group' else key} {getattr(group, key)}"
                                for key in group.shares if getattr(group, key))
    return groups


def live_claim_groups(user, limit: int = 50, *, claims: QuerySet | None = None) -> list:
    """The groups the claims list shows: those with a member in the user's scope (or among `claims`) that is not
    released, newest first, each with its state (claim_groups_rows)."""
    live = (claims_visible(user) if claims is None else claims).exclude(phase=ClaimPhase.RELEASED).filter(
        group__isnull=False)
    return claim_groups_rows(ClaimGroup.objects.filter(pk__in=live.values("group_id"))
                             .order_by("-created_at", "-pk")[:limit])


def render_claim_groups_section(user, *, claims: QuerySet | None = None) -> str:
    """The claims list's group table (the section, hidden while there is none), for the page and its live view
    (which passes the claims of its scope instead of a user)."""
    return render_to_string("claims/partials/claim_groups_section.html",
                            {"groups": live_claim_groups(user, claims=claims)})
