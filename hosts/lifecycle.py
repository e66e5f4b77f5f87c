"""The host life cycle: the table of allowed transitions, and each in-progress state's failure state, flow and
deadline; who reacts to a move."""
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from core import transitions
from core.transitions import ConcurrentTransition, IllegalTransition  # noqa: F401 (raised from here)

from .choices import HostState as S

TRANSITIONS: dict[str, frozenset[str]] = {
    S.REGISTERING: frozenset({S.INSPECTING, S.ERROR, S.MAINTENANCE}),
    # After inspection a host is cleaned and checked once (deprovisioning) before it joins the pool.
    # Registration's initial clean and health check fail into repair, as a release's do.
    S.INSPECTING: frozenset({S.AVAILABLE, S.DEPROVISIONING, S.REPAIR, S.ERROR, S.MAINTENANCE}),
    # Deprovisioning from the pool: the full erase of a host whose hold on kept data disks ended (hosts/gate/plan.py).
    S.AVAILABLE: frozenset({S.PROVISIONING, S.INSPECTING, S.REGISTERING, S.MAINTENANCE, S.CHECKING, S.SERVICING,
                            S.DEPROVISIONING}),
    # A servicing action (a firmware update): back to the pool, or to repair with the evidence when it failed.
    S.SERVICING: frozenset({S.AVAILABLE, S.REPAIR, S.ERROR, S.MAINTENANCE}),
    # The idle check: back to the pool, to repair when it fails, or pre-empted by a claim (provisioning).
    S.CHECKING: frozenset({S.AVAILABLE, S.PROVISIONING, S.REPAIR, S.ERROR, S.MAINTENANCE}),
    # A failed handover check sends the host to repair before anything was written on it.
    S.PROVISIONING: frozenset({S.PROVISIONED, S.DEPROVISIONING, S.REPAIR, S.ERROR}),
    S.PROVISIONED: frozenset({S.DEPROVISIONING, S.ERROR}),
    S.DEPROVISIONING: frozenset({S.AVAILABLE, S.REPAIR, S.ERROR}),
    # Repair: retest (clean and check again), back to service (after a passing retest or an admin override,
    # hosts.services.host_return_to_service), retire.
    # The repair ladder (hosts/flows/repair.py): one automatic remedy at a time (repairing), back to repair when it did
    # not help, to the pool when the checks after it passed.
    S.REPAIR: frozenset({S.RETESTING, S.REPAIRING, S.DEPROVISIONING, S.AVAILABLE, S.RETIRED, S.MAINTENANCE}),
    S.RETESTING: frozenset({S.REPAIR, S.ERROR, S.MAINTENANCE}),
    S.REPAIRING: frozenset({S.REPAIR, S.AVAILABLE, S.ERROR, S.MAINTENANCE}),
    S.RETIRED: frozenset(),
    S.ERROR: frozenset({S.REGISTERING, S.DEPROVISIONING, S.REPAIR, S.RETIRED, S.MAINTENANCE}),
    S.MAINTENANCE: frozenset({S.REGISTERING, S.RETIRED}),
    # Held after a restore (hosts/restore.py): the world reconcile (claims/restore.py) sends each host where its real
    # state says: provisioned (adopted), maintenance (a node no claim matches), deprovisioning (released through the
    # gate), or back to the state the database gave it. Never to provisioning or an idle check: neither is resumed
    # blindly (a provision would write the image again).
    S.HELD: frozenset({S.REGISTERING, S.INSPECTING, S.AVAILABLE, S.PROVISIONED, S.DEPROVISIONING, S.REPAIR,
                       S.RETESTING, S.REPAIRING, S.ERROR, S.MAINTENANCE}),
}
# Every state but retired may be held after a restore (hosts.restore.hosts_hold).
HOLDABLE = frozenset(state for state in S if state not in (S.RETIRED, S.HELD))
TRANSITIONS.update({state: TRANSITIONS[state] | {S.HELD} for state in HOLDABLE})

# Each in-progress state and where its deadline sends a host (MAAS's failure states). The deadline is no
# setting of its own: it is the state's flow's step deadlines added up, with STEP_SLACK_S per step for a drive to
# notice a step's deadline (deadline_for). So it never fires while a step is within its own deadline (a step's
# own clock fails it, or skips it, with its own reason: a gate step's failure goes to repair); it catches a flow
# that nobody drives (workers gone, a lost task) or that never ends. A stuck flow is an error; a stuck retest
# leaves the host in repair, where it was, without a passing verdict.
STATE_FAILURE: dict[str, str] = {
    S.REGISTERING: S.ERROR,
    S.INSPECTING: S.ERROR,
    S.PROVISIONING: S.ERROR,
    S.DEPROVISIONING: S.ERROR,
    S.RETESTING: S.REPAIR,
    S.CHECKING: S.ERROR,
    S.REPAIRING: S.REPAIR,  # a remedy that never ends failed: the ladder goes on from repair
    S.SERVICING: S.ERROR,
}
IN_PROGRESS = frozenset(STATE_FAILURE)
# States in which a host is free for the next claim: available, or under its idle health check (which a claim
# pre-empts): the allocator and every count of free hosts use it.
FREE = frozenset({S.AVAILABLE, S.CHECKING})
# States in which a host serves (or is being made ready for) a tenant's claim.
CLAIMED = frozenset({S.PROVISIONING, S.PROVISIONED})
# States in which a host may run the agent (booted into the ramdisk by one of its flows).
AGENT_STATES = (S.INSPECTING, S.PROVISIONING, S.DEPROVISIONING, S.RETESTING, S.REPAIRING, S.CHECKING)


# What a person can do about a host in each state when the move they asked for is not possible from it: (why, what
# to do). Every refusal of the table says it (check_transition), so the host page, the fleet's bulk actions, the
# API and the admin all say the same words.
WHAT_TO_DO: dict[str, tuple[str, str]] = {
    S.REGISTERING: ("its BMC is being checked", "wait until it is inspected, or put it in maintenance"),
    S.INSPECTING: ("it is being inspected", "wait until it is available, or put it in maintenance"),
    S.AVAILABLE: ("it is free for the next claim", "put it in maintenance first"),
    S.CHECKING: ("its idle health check runs", "wait until the check ends, or put it in maintenance"),
    S.PROVISIONING: ("it is being installed for a claim", "release its claim first"),
    S.PROVISIONED: ("it serves a claim", "release its claim first"),
    S.DEPROVISIONING: ("it is being drained, erased and checked after a release",
                       "wait until it is available again (or in repair, with the reason)"),
    S.REPAIR: ("it waits in the repair pool", "retest it, return it to service, or retire it"),
    S.RETESTING: ("it is being retested", "wait for the retest's verdict, or put it in maintenance"),
    S.REPAIRING: ("the repair ladder runs a remedy on it", "wait for the remedy's checks, or put it in maintenance"),
    S.SERVICING: ("an admin's servicing action (a firmware update) runs on it",
                  "wait until it is available again (or in repair, with the reason)"),
    S.RETIRED: ("it is out of the fleet for good", "nothing brings it back; register it anew under another name"),
    S.ERROR: ("it failed", "retry it, put it in maintenance, or retire it"),
    S.MAINTENANCE: ("it is out of service", "turn maintenance off first, or retire it"),
    S.HELD: ("it is held after a restore until the world reconcile has read its real state",
             "wait for the reconcile (manage.py reconcile-world runs it now)"),
}


# The moves a person asks for (maintenance on and off, retry, retest, return to service, retire): their refusal
# says what to do; a flow's own moves say only why.
PERSON_MOVES = frozenset({S.MAINTENANCE, S.REGISTERING, S.RETESTING, S.AVAILABLE, S.RETIRED})


def check_transition(from_state: str, to_state: str, name: str = "host") -> None:
    why, do = WHAT_TO_DO.get(from_state, ("", ""))
    transitions.check_transition(TRANSITIONS, from_state, to_state, name,
                                 advice={from_state: (why, do if to_state in PERSON_MOVES else "")})


def refusal(from_state: str, to_state: str, name: str = "host") -> str:
    """Why a host in from_state may not go to to_state and what to do, in words; "" when it may."""
    try:
        check_transition(from_state, to_state, name)
    except IllegalTransition as exc:
        return str(exc)
    return ""


# --- the flow that drives each in-progress state -------------------------------------------------------
# Filled at start: hosts.flows registers the host's own flows, claims.steps provision and deprovision
# (hosts.engine.flow.Flow, each with its state and steps). Kept here, below the engine and the services, so that a
# state's deadline (its flow's steps) is read where a host is moved.
FLOWS: dict = {}  # flow name → Flow
FLOW_FOR_STATE: dict[str, str] = {}  # host state → flow name
RELATED: set[str] = set()  # the host's relations the registered flows read (the engine loads them with the host)


class FlowMissing(LookupError):
    """An in-progress state whose flow no app registered (the app that offers it is not installed)."""


def register_flow(flow):
    FLOWS[flow.name] = flow
    FLOW_FOR_STATE[flow.state] = flow.name
    RELATED.update(flow.related)
    return flow


def deadline_for(state: str) -> timedelta | None:
    """How long a host may stay in `state`: its flow's step deadlines added up, plus STEP_SLACK_S each."""
    if state not in STATE_FAILURE:
        return None
    name = FLOW_FOR_STATE.get(state)
    if name is None:
        raise FlowMissing(f"no flow drives the host state {str(state)!r}: the app that registers it (claims.steps for "
                          f"provisioning and deprovisioning) is not installed, or not ready yet")
    return timedelta(seconds=sum(step.deadline_s() + settings.STEP_SLACK_S for step in FLOWS[name].steps))


# --- who reacts to a host's move ---------------------------------------------------------------------
# hosts_transition_batch calls each receiver once per move, synchronously, inside the transaction that moves the
# hosts: what a receiver writes commits or rolls back with the move. Receivers register at app start
# (claims.reactions: the host provisioned → its claim is Available; the host lost → its claim is Pending or
# Failed; the host freed → allocate soon). A plain list rather than a Django signal: what runs, and in which
# order, is what was registered, with one typed argument, and an exception rolls the move back.

@dataclass(frozen=True)
class HostsMoved:
    host_ids: list[int]
    names: dict[int, str]  # host id → name
    from_state: str
    to_state: str
    actor: str
    reason: str
    data: dict


TRANSITION_RECEIVERS: list[Callable[[HostsMoved], None]] = []


def on_host_transition(receiver: Callable[[HostsMoved], None]) -> Callable[[HostsMoved], None]:
    if receiver not in TRANSITION_RECEIVERS:
        TRANSITION_RECEIVERS.append(receiver)
    return receiver
