"""Reads of external providers' machines: each NodeType's capacity as its kind says and the machines it holds, the
machines' timeline steps, and (kind terraform) a provider's OpenTofu workspaces with their locks, a stuck one
marked."""
import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from claims.choices import ClaimPhase
from pools.choices import ProviderKind

from .choices import MachineState
from .kinds import KindError, kind_of
from .models import Machine, TofuState
from .services import LIVE_MACHINE
from .tofu.runner import TofuFailed, duration_s

log = logging.getLogger(__name__)


def machine_capacity(node_types: list) -> dict[int, dict]:
    """{type id: {"total", "claimed", "error"}} for the external providers' types among these: total as the kind
    says (None: no limit; a provider that cannot be asked: None with the error), claimed its machines not gone
    (one query). The kinds' calls are network I/O: never call this inside a transaction."""
    external = [t for t in node_types if t.provider.external]
    if not external:
        return {}
    claimed = dict(Machine.objects.filter(LIVE_MACHINE, node_type__in=external).order_by()
                   .values_list("node_type").annotate(n=Count("pk")).values_list("node_type", "n"))
    found = {}
    for t in external:
        total, error = None, ""
        try:
            total = kind_of(t.provider).capacity(t)
        except KindError as exc:
            error = exc.message
        except (TypeError, ValueError) as exc:  # a maxCapacity that is not a number
            error = f"capacity unreadable: {exc}"
        except Exception as exc:  # a provider's answer must never take a page down: said, and logged
            log.warning("capacity of %s (provider %s): %r", t.name, t.provider.name, exc)
            error = f"the provider could not be asked ({exc.__class__.__name__})"
        found[t.pk] = {"total": total, "claimed": claimed.get(t.pk, 0), "error": error}
    return found


def machine_steps(claim) -> list[dict]:
    """The claim's machine as timeline steps (claims.providers.MACHINE_STEP_ORDER): make (made → running), join
    (running → the claim Available: its node Ready and labelled), release (released → every object gone). One
    query."""
    m = Machine.objects.filter(claim_id=claim.pk).first()
    if m is None:
        return []
    failed = m.state == MachineState.FAILED or claim.phase == ClaimPhase.FAILED

    def step(name, started, ended, what):
        status = "done" if ended else ("failed" if failed else "running")
        message = what if ended else (f"failed: {m.message or claim.message}" if failed else m.message or what)
        return {"step": name, "machine": m.name, "started_at": started, "ended_at": ended, "status": status,
                "message": message}

    steps = [step("make", m.created_at, m.running_at, f"{m.kind} machine {m.name} made and running")]
    if m.running_at:
        joined = claim.available_at if claim.available_at and claim.available_at >= m.running_at else None
        if joined or not m.released_at:
            steps.append(step("join", m.running_at, joined, f"node {claim.node_name} Ready in the tenant"))
    if m.released_at:
        steps.append(step("release", m.released_at, m.gone_at, "every object made for it is gone"))
    return steps


def machine_step_durations(recent: int) -> dict[str, list[float]]:
    """Seconds per machine step over the latest `recent` machines (one query)."""
    rows = (Machine.objects.order_by("-pk")
            .values_list("created_at", "running_at", "released_at", "gone_at", "claim__available_at")[:recent])
    found: dict[str, list[float]] = {}
    for created, running, released, gone, available in rows:
        if running:
            found.setdefault("make", []).append((running - created).total_seconds())
            if available and available >= running:
                found.setdefault("join", []).append((available - running).total_seconds())
        if released and gone:
            found.setdefault("release", []).append((gone - released).total_seconds())
    return found


def provider_machines(provider, limit: int = 200) -> list[Machine]:
    return list(Machine.objects.filter(provider=provider).select_related("claim", "node_type")
                .defer("memory", "outputs").order_by("-created_at", "-pk")[:limit])


def lock_timeout_s(provider) -> tuple[float, str]:
    """How long a run of this provider may hold its workspace's lock: its timeout (spec.terraform.timeout), else
    TOFU_TIMEOUT_S; with what says so, when the provider's value is unreadable."""
    try:
        return duration_s((provider.config or {}).get("timeout"), settings.TOFU_TIMEOUT_S), ""
    except TofuFailed as exc:
        return settings.TOFU_TIMEOUT_S, f"{exc.message}; TOFU_TIMEOUT_S is used"


def provider_workspaces(provider) -> list[TofuState]:
    """The OpenTofu workspaces of a terraform provider, never their state: each with `stuck` True when its lock is
    older than the provider's timeout (its run is over by then: it crashed or was killed holding the lock)."""
    if provider.kind != ProviderKind.TERRAFORM:
        return []
    timeout, _ = lock_timeout_s(provider)
    now = timezone.now()
    states = list(TofuState.objects.filter(provider=provider).defer("tofu_state", "password_hash").order_by("name"))
    for state in states:
        state.stuck = bool(state.lock_id and state.locked_at and now - state.locked_at > timedelta(seconds=timeout))
        info = state.lock_info or {}
        state.lock_who, state.lock_operation = str(info.get("Who") or ""), str(info.get("Operation") or "")
    return states
