"""Reads of an external provider for its console page: its NodeTypes with the kind's capacity and the live machines,
its machines, and (kind terraform) its OpenTofu workspaces with their locks, a stuck one marked."""
from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone

from pools.choices import ProviderKind

from .choices import MachineState
from .kinds import KindError, kind_of
from .models import Machine, TofuState
from .tofu.runner import TofuFailed, duration_s


def node_types_capacity(provider, node_types: list) -> dict[int, dict]:
    """{type id: {"capacity": int | None, "error": str, "live": int}}: the kind's capacity of each type (network I/O
    for some kinds, a Metal3 cluster's hosts: the caller asks outside any transaction; a failure is said, not raised)
    and the machines of that type not gone."""
    live = dict(Machine.objects.filter(node_type__in=node_types).exclude(state=MachineState.GONE).order_by()
                .values("node_type_id").annotate(n=Count("pk")).values_list("node_type_id", "n"))
    found = {}
    for node_type in node_types:
        capacity, error = None, ""
        try:
            capacity = kind_of(provider).capacity(node_type)
        except KindError as exc:
            error = exc.message
        except (TypeError, ValueError) as exc:  # a maxCapacity that is not a number
            error = f"capacity unreadable: {exc}"
        found[node_type.pk] = {"capacity": capacity, "error": error, "live": live.get(node_type.pk, 0)}
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
