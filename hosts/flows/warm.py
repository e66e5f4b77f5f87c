"""Warm hosts: after a passing release gate a host may stay on in the agent's ramdisk, ready for the next
claim."""
# Warm hosts: after a passing release gate a host may stay powered on in the agent's ramdisk, its agent idle
# and heartbeating, so that the next claim on it skips power-on, network boot and agent lookup and writes its
# image at once (claims.steps, the provision's `begin`). Its idle agent asks for work in a long poll that the agent
# listener holds for minutes (hosts/protocol/poll.py), so a warm host costs the console little. Per NodeType: how many hosts to keep warm
# (`warm_hosts`) and how long one may stay idle before it is powered off (`warm_idle_minutes`).
#
# - `step_keep_warm`, the release gate's last step before its power-off (inspect and deprovision): the host stays
#   on when fewer than its NodeType's `warm_hosts` are warm. The count is taken under a lock on the NodeType's
#   row, so two hosts that pass their gates together never make one warm host too many.
# - `hosts_warm_sweep` (a beat task): a warm host idle past `warm_until`, or whose agent has not been heard from
#   for warm_silence_s() (a long poll and AGENT_SILENCE_S), stops being warm and is powered off: from then on it takes the normal (cold) path.
# - `warm_session`: a host's agent session when it is open and was heard from lately; what a provision asks
#   before it skips the boot (a warm host whose agent died meanwhile is provisioned cold).
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.services import event_record
from pools.matching import label_selector_q
from pools.models import NodeType

from hosts.bmc.client import BMCError
from hosts.bmc.factory import host_bmc
from hosts.boot.ramdisk import agent_sessions_end
from hosts.choices import HostState
from hosts.engine.flow import Run
from hosts.gate.cleaning import node_type_for
from hosts.models import AgentSession, BareMetalHost
from hosts.protocol.poll import agent_wake
from hosts.selectors import host_recent_failures
from hosts.services import host_bmc_contact

log = logging.getLogger(__name__)
WARM_END_STEP = "warm_end"


def warm_q() -> Q:
    """Hosts that are warm now: available, and kept on by the gate's keep_warm step."""
    return Q(state=HostState.AVAILABLE, warm_since__isnull=False)


def warm_silence_s() -> float:
    """How long a warm host's agent may go unheard: a whole long poll (hosts/protocol/poll.py: its ask is held up
    to WARM_POLL_S, and recorded when it comes in) and AGENT_SILENCE_S on top."""
    return settings.AGENT_SILENCE_S + settings.WARM_POLL_S


def warm_session(host_id: int) -> AgentSession | None:
    """The host's open agent session, if its agent was heard from within warm_silence_s() (a heartbeat writes
    last_seen_at at most every few seconds: hosts.protocol.api.LAST_SEEN_EVERY_S)."""
    heard = timezone.now() - timedelta(seconds=warm_silence_s())
    return next(iter(AgentSession.objects.filter(host_id=host_id, active=True, last_seen_at__gte=heard)
                     .order_by("-created_at")[:1]), None)


def _node_type(run: Run) -> NodeType | None:
    return node_type_for(run.host, run.claim)


def warm_wanted(run: Run) -> bool:
    """Whether the host's NodeType keeps warm hosts at all (decided once per flow run): the keep_warm step
    appears only on the timelines of such types."""
    wanted = run.data.get("warm_wanted")
    if wanted is None:
        node_type = _node_type(run)
        wanted = run.data["warm_wanted"] = bool(node_type and node_type.warm_hosts)
    return wanted


def not_kept_warm(run: Run) -> bool:
    return not run.data.get("warm")


def step_keep_warm(run: Run) -> dict:
    """After a passing gate: keep the host on in the ramdisk, warm, when its NodeType has fewer warm hosts than
    it asks for; else the next step powers it off, as always."""
    node_type = _node_type(run)
    if node_type is None or not node_type.warm_hosts:
        return {"warm": False, "reason": "its NodeType keeps no warm hosts"}
    if len(host_recent_failures(host=run.host)) >= settings.HOST_FAILURE_LIMIT:
        return {"warm": False, "reason": "it failed too often lately: it goes to repair"}
    if warm_session(run.host.pk) is None:
        return {"warm": False, "reason": f"its agent was not heard from within {warm_silence_s():g}s"}
    with transaction.atomic():
        # The lock order (core/transactions.py): pools before hosts. One keep-warm decision per type at a time.
        NodeType.objects.select_for_update(no_key=True).filter(pk=node_type.pk).exists()
        warm = (BareMetalHost.objects.filter(label_selector_q(node_type.host_selector), warm_since__isnull=False)
                .exclude(pk=run.host.pk).count())
        if warm >= node_type.warm_hosts:
            return {"warm": False, "reason": f"{warm} of {node_type.warm_hosts} {node_type.name} hosts are warm already"}
        now = timezone.now()
        until = now + timedelta(minutes=node_type.warm_idle_minutes)
        BareMetalHost.objects.filter(pk=run.host.pk).update(warm_since=now, warm_until=until)
    run.data["warm"] = True
    return {"warm": True, "node_type": node_type.name, "warm_hosts": f"{warm + 1} of {node_type.warm_hosts}",
            "idle_minutes": node_type.warm_idle_minutes, "until": until.isoformat()}


# --- the end of warmth: idle too long, or the agent silent ------------------------------------------------

def hosts_warm_sweep(*, actor: str = "system:warm") -> list[str]:
    """Every warm host idle past its warm_until, or whose agent is silent, stops being warm and is powered off.
    Returns the names of the hosts it ended."""
    now = timezone.now()
    silence = warm_silence_s()
    heard = now - timedelta(seconds=silence)
    ended = []
    fresh = set(AgentSession.objects.filter(host__in=BareMetalHost.objects.filter(warm_q()), active=True,
                                            last_seen_at__gte=heard).values_list("host_id", flat=True))
    for host in BareMetalHost.objects.filter(warm_q()).order_by("pk"):
        if host.pk not in fresh:
            reason = f"its agent was not heard from for more than {silence:g}s"
        elif host.warm_until is not None and host.warm_until <= now:
            reason = f"idle since {host.warm_since:%Y-%m-%d %H:%M:%S} UTC"
        else:
            continue
        if host_warm_end(host=host, reason=reason, actor=actor):
            ended.append(host.name)
    return ended


def host_warm_end(*, host: BareMetalHost, reason: str, actor: str) -> bool:
    """The host is no longer warm: its agent session ends and it is powered off (the cold path from now on).
    While the BMC call is made the host's drive lease is held, so a claim that takes the host meanwhile starts
    its flow only after the power-off was sent (its power-on must come after, not before). False when the host
    was not warm any more (allocated, or ended by another sweep)."""
    now = timezone.now()
    lease = now + timedelta(seconds=settings.DRIVE_LEASE_S)
    with transaction.atomic():
        taken = (BareMetalHost.objects.filter(pk=host.pk, state=HostState.AVAILABLE, warm_since=host.warm_since)
                 .filter(Q(drive_lease_until__isnull=True) | Q(drive_lease_until__lt=now))
                 .update(warm_since=None, warm_until=None, drive_lease_until=lease))
        if not taken:
            return False
        agent_sessions_end(host_ids=[host.pk])
        agent_wake(host.pk)  # its held ask (hosts/protocol/poll.py) ends with a refusal, not minutes later
        event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
                     step=WARM_END_STEP, actor=actor, message=f"no longer warm: {reason}; powering off",
                     data={"warm_since": host.warm_since.isoformat() if host.warm_since else None,
                           "reason": reason})
    try:
        _power_off(host)
    finally:
        BareMetalHost.objects.filter(pk=host.pk, drive_lease_until=lease).update(drive_lease_until=None)
    return True


def _power_off(host: BareMetalHost) -> None:
    """Send the power-off (it lands seconds later; the next flow's power step reads the BMC again)."""
    if not host.bmc_password:
        return
    try:
        with host_bmc(host) as bmc:
            bmc.power_off()
    except BMCError as exc:
        # Left on: the next claim's power step switches it off first; the BMC's colour says why.
        log.warning("%s: power-off after warm: %s", host.name, exc)
        host_bmc_contact(host=host, ok=False, error=str(exc), actor="system:warm")
        return
    host_bmc_contact(host=host, ok=True, actor="system:warm")
