"""Every write to a host. `hosts_transition_batch` is the only code that changes a host's state."""
import logging
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from core import live
from core.tasks import task_send, task_send_on_commit
from core.transitions import swap
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record, events_record, recorded_values, seconds_since
from pools.health_tiers import node_type_tiers
from pools.matching import label_selector_q
from pools.models import NodeType
from pools.selectors import labels_derived, sku_deviations_of
from pools.sku import DERIVED_LABELS, derived_labels

from . import task_names
from .bmc.client import BMCError, is_ipmi
from .bmc.factory import host_bmc
from .boot.ramdisk import agent_sessions_end
from .choices import HostState
from .gate.census import disk_text, record_deviations, record_from
from .lifecycle import (
    AGENT_STATES,
    CLAIMED,
    FLOW_FOR_STATE,
    IN_PROGRESS,
    STATE_FAILURE,
    TRANSITION_RECEIVERS,
    ConcurrentTransition,
    HostsMoved,
    IllegalTransition,
    check_transition,
    deadline_for,
)
from .models import BareMetalHost, HealthCheckRun
from .selectors import sku_deviations_text

log = logging.getLogger(__name__)



def host_transition(*, host: BareMetalHost, to_state: str, actor: str, reason: str = "", error_type: str = "",
                    step: str = "", data: dict | None = None) -> BareMetalHost:
    """One host: hosts_transition_batch of one."""
    hosts_transition_batch(hosts=[host], to_state=to_state, actor=actor, reason=reason, error_type=error_type,
                           step=step, data=data)
    return host


@transaction.atomic
def hosts_transition_batch(*, hosts: Iterable[BareMetalHost], to_state: str, actor: str, reason: str = "",
                           error_type: str = "", step: str = "", data: dict | None = None,
                           tenant_ids: dict[int, int] | None = None) -> list[BareMetalHost]:
    """Move hosts that share one state to `to_state`, by compare-and-swap on that state.

    Raises IllegalTransition when the table forbids it, ConcurrentTransition when another writer moved
    one of the hosts first (nothing is changed then). Writes one Event per host; on commit, enqueues
    the task that drives the new state and publishes the change to live views."""
    hosts = list(hosts)
    if not hosts:
        return hosts
    from_state = hosts[0].state
    if any(h.state != from_state for h in hosts):
        raise ValueError("hosts_transition_batch moves hosts that share one state")
    for host in hosts:
        check_transition(from_state, to_state, host.name)
    now = timezone.now()
    deadline = deadline_for(to_state)
    fields = {"state": to_state, "state_changed_at": now, "deadline_at": now + deadline if deadline else None}
    if to_state == HostState.ERROR:
        fields.update(error_type=error_type or f"{from_state} error", error_message=reason,
                      error_count=F("error_count") + 1)
    else:
        # Any move out of error (a Retry, maintenance) leaves the old error behind: a host that is inspecting
        # shows no error it no longer has. The count of errors in a row ends only when the host serves again.
        fields.update(error_type="", error_message="")
        if to_state in (HostState.AVAILABLE, HostState.PROVISIONED):
            fields.update(error_count=0)
    if to_state != HostState.AVAILABLE:
        # A warm host (hosts/flows/warm.py) is warm only while available; one that is allocated keeps its agent session
        # (provisioning is a ramdisk state), and its provision starts with that agent (claims.steps).
        fields.update(warm_since=None, warm_until=None)
    ids = [h.pk for h in hosts]
    swap(BareMetalHost, ids=ids, field="state", expected=from_state, values=fields, what="host")
    if to_state not in AGENT_STATES:
        # No host outside a ramdisk flow keeps an agent session (a provisioned host runs its tenant's OS), but
        # for a warm one: available, on in the ramdisk, its agent idle and heartbeating.
        ended = ids
        if to_state == HostState.AVAILABLE:
            warm = set(BareMetalHost.objects.filter(pk__in=ids, warm_since__isnull=False).values_list("pk", flat=True))
            ended = [pk for pk in ids if pk not in warm]
        agent_sessions_end(host_ids=ended)
    tenant_ids = tenant_ids or {}
    # Published on commit to the fleet, each host's group and its tenant's: {"object": "host", "ids": [...],
    # "from_state": ..., "to_state": ...}.
    events_record([
        Event(kind=EventKind.TRANSITION, object_type=ObjectType.HOST, object_name=h.name, host_id=h.pk,
              tenant_id=tenant_ids.get(h.pk), from_state=from_state, to_state=to_state, step=step,
              message=reason, duration_s=seconds_since(h.state_changed_at, now), actor=actor, data=data or {})
        for h in hosts
    ])
    for host in hosts:
        for key, value in fields.items():
            if key != "error_count":
                setattr(host, key, value)
        if to_state == HostState.ERROR:
            host.error_count += 1
    if to_state in FLOW_FOR_STATE:  # a state with a flow: drive it, on commit
        for host_id in ids:
            task_send_on_commit(task_names.DRIVE_HOST, host_id=host_id)
    moved = HostsMoved(host_ids=ids, names={h.pk: h.name for h in hosts}, from_state=from_state, to_state=to_state,
                       actor=actor, reason=reason, data=data or {})
    for receiver in TRANSITION_RECEIVERS:
        receiver(moved)
    return hosts


def host_set_maintenance(*, host: BareMetalHost, on: bool, actor: str, reason: str = "") -> BareMetalHost:
    """Take a host out of service, or give it back (it registers again: its BMC is checked anew)."""
    if on:
        return host_transition(host=host, to_state=HostState.MAINTENANCE, actor=actor,
                               reason=reason or "maintenance on")
    if host.state != HostState.MAINTENANCE:
        raise IllegalTransition(f"{host.name} is not in maintenance")
    return host_transition(host=host, to_state=HostState.REGISTERING, actor=actor, reason=reason or "maintenance off")


def host_retry(*, host: BareMetalHost, actor: str, reason: str = "") -> BareMetalHost:
    """Try a host in error again from the start: register (BMC, credentials) and inspect."""
    if host.state != HostState.ERROR:
        raise IllegalTransition(f"{host.name} is {host.state}; only a host in error can be retried")
    return host_transition(host=host, to_state=HostState.REGISTERING, actor=actor,
                           reason=reason or f"retry after: {host.error_message}")


class FirmwareRequestInvalid(ValueError):
    """A firmware update asked with a bad component or image URL: refused, nothing changed."""


FIRMWARE_COMPONENT = re.compile(r"^(bios|bmc|(nic|gpu|other):[A-Za-z0-9_.\-]{1,64})$")


def host_firmware_update(*, host: BareMetalHost, component: str, image_url: str, actor: str) -> BareMetalHost:
    """A servicing action: update one firmware component of an available host from an image URL (Redfish SimpleUpdate,
    hosts/flows/firmware.py). Refused, with the reason and nothing changed, for a host that serves a tenant (or is in
    any state but available), an ipmi:// BMC, a component the host's inventory does not list, or a bad URL."""
    component, image_url = (component or "").strip(), (image_url or "").strip()
    if not FIRMWARE_COMPONENT.match(component):
        raise FirmwareRequestInvalid(f"component {component!r} is not one the console updates: bios, bmc, nic:ID, "
                                     "gpu:ID or other:ID, as the host's firmware inventory names it")
    parts = urlsplit(image_url)
    if (parts.scheme not in ("http", "https") or not parts.hostname or len(image_url) > 2000
            or any(c.isspace() or ord(c) < 32 for c in image_url)):
        raise FirmwareRequestInvalid("the image URL must be an http:// or https:// URL the BMC can download, without "
                                     "spaces")
    if is_ipmi(host.bmc_address):
        raise FirmwareRequestInvalid(f"{host.name} has an ipmi:// BMC, which cannot update firmware: give it a Redfish "
                                     "address")
    if host.state in CLAIMED:
        raise IllegalTransition(f"{host.name} is {host.state}: it serves a tenant's claim, and firmware is updated only "
                                "on an available host; release its claim first")
    if host.state != HostState.AVAILABLE:
        check_transition(host.state, HostState.SERVICING, host.name)
    known = [c.get("component") for c in (host.firmware or {}).get("components") or []]
    if known and component not in known:
        raise FirmwareRequestInvalid(f"{host.name}'s firmware inventory has no component {component} (it lists "
                                     f"{', '.join(known)})")
    request = {"component": component, "image_url": image_url, "asked_by": actor}
    return host_transition(host=host, to_state=HostState.SERVICING, actor=actor,
                           reason=f"firmware update of {component} from {image_url}",
                           data={"firmware_update": request})


def hosts_sweep_overdue(*, actor: str = "system:sweeper") -> list[str]:
    """Move every host past its state's deadline to the state's failure state (lifecycle.STATE_FAILURE), with the
    reason and the step it was stuck at (what that means for a claim it serves is the claims app's reaction).
    A host in progress stored without a deadline (by an older console, or by hand) is held to its state's
    deadline from when it entered the state."""
    swept = []
    now = timezone.now()
    undated = Q()
    driven = [state for state in STATE_FAILURE if state in FLOW_FOR_STATE]  # hosts alone: no claim's flows
    for state in driven:
        undated |= Q(state=state, deadline_at__isnull=True, state_changed_at__lt=now - deadline_for(state))
    overdue = BareMetalHost.objects.filter(Q(deadline_at__lt=now, state__in=driven) | undated)
    for host in overdue:
        limit = deadline_for(host.state)
        reason = f"deadline exceeded: {host.state} for more than {_hours_minutes(limit)}"
        flow = host.flow or {}
        stuck_at = flow.get("step", "") if flow.get("state_since") == host.state_changed_at.isoformat() else ""
        if stuck_at:
            reason += f" (at {stuck_at})"
        try:
            host_transition(host=host, to_state=STATE_FAILURE[host.state], actor=actor, reason=reason,
                            error_type=f"{host.state} timeout", step=stuck_at,
                            data={"flow": flow.get("name"), "step": stuck_at, "message": reason,
                                  **({"retest": "failed"} if host.state == HostState.RETESTING else {})})
        except ConcurrentTransition:
            continue  # it moved on by itself meanwhile
        swept.append(host.name)
    return swept


def _hours_minutes(delta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


# The states a host may come in with from Metal3's status (a host another Metal3 already inspected).
IMPORTABLE_STATES = (HostState.AVAILABLE, HostState.REGISTERING)


@transaction.atomic
def host_create(*, values: dict, actor: str, status: dict | None = None, adopted: str = "") -> BareMetalHost:
    """Register a new host (apply, the API and the admin all call this): validated by BareMetalHost.clean(),
    saved, its first Event a TRANSITION from nothing into its first state, and a drive asked for on commit.

    The first state is registering (the register flow checks the BMC, inspects and cleans), unless `status`
    is the Metal3 status of a host another Metal3 already inspected (the `baremetalhost.metal3.io/status`
    annotation, as `clusterctl move` writes it: {"provisioning": {"state": "available"}, "hardware": {...}}):
    then the host comes in in that state, with that hardware. This and hosts_transition_batch are the only
    writers of a host's state: the transition table has no move from nothing, so a new host's first state
    and its Event are written here, once. Raises ValidationError ({field: message}; "status" for the status).

    `adopted` (why: the node it already serves): a server that runs an OS installed outside the console comes in
    provisioned, neither powered nor re-imaged (claims.restore.host_adopt); its first release runs the full gate."""
    state, hardware = (HostState.PROVISIONED if adopted else HostState.REGISTERING), {}
    deviations = {}
    if status is not None:
        state, hardware = _imported_status(status)
        if state == HostState.AVAILABLE and hardware:
            # Another Metal3's inventory that deviates from the SKU of a NodeType selecting the host: not taken
            # as available, but registered and inspected here, where the SKU check decides (hosts.flows).
            deviations = sku_deviations_of(hardware, values.get("labels") or {})
            if deviations:
                state = HostState.REGISTERING
    host = BareMetalHost()
    for name, value in values.items():
        setattr(host, name, value)
    now = timezone.now()
    deadline = deadline_for(state)
    host.state, host.state_changed_at, host.deadline_at = state, now, now + deadline if deadline else None
    host.inventory = hardware or host.inventory
    host.full_clean()
    host.save()
    message = "created" if status is None else f"created: imported from Metal3 status as {state}"
    if adopted:
        message = f"created: adopted as provisioned, not powered and not re-imaged: {adopted}"
    if deviations:
        message = (f"created: imported from Metal3 status as available, but its hardware does not match its SKU "
                   f"({sku_deviations_text(deviations)}): registered and inspected instead")
    # Published on commit to the fleet and the host's group: {"object": "host", "ids": [id], "to_state": state}.
    event_record(kind=EventKind.TRANSITION, object_type=ObjectType.HOST, object_name=host.name, host=host,
                 to_state=state, actor=actor, message=message,
                 data={"before": {}, "after": recorded_values(host, values),
                       **({"imported": {"state": state, **({"sku_deviations": deviations} if deviations else {})}}
                          if status is not None else {"adopted": adopted} if adopted else {})})
    task_send_on_commit(task_names.DRIVE_HOST, host_id=host.pk)
    return host


def _imported_status(status) -> tuple[str, dict]:
    """The state and the hardware a new host takes from Metal3's status."""
    try:
        state = status["provisioning"]["state"]
    except (KeyError, TypeError):
        raise ValidationError({"status": "must be Metal3 status JSON with provisioning.state"}) from None
    if state not in IMPORTABLE_STATES:
        raise ValidationError({"status": f"only hosts that are available (or registering) can be imported, "
                                         f"not {state!r}"})
    hardware = status.get("hardware") or {}
    if not isinstance(hardware, dict):
        raise ValidationError({"status": "hardware must be a mapping"})
    return state, hardware


# --- inspection: labels derived from it (pools/sku.py) ------------------------------------------------------

def host_derive_labels(*, host: BareMetalHost, actor: str = "system:flow") -> dict[str, list]:
    """Write the labels an inspection implies (nvidia.com/gpu.product, .count, .memory) on the host, beside the
    labels written by hand, when a metal3 provider says `deriveLabels: true`; NodeType host selectors then match
    them like any label. A GPU label the inventory no longer supports is removed. Returns {label: [old, new]}
    (and records them as a change Event); {} when nothing changed or labels are not derived."""
    if not labels_derived():
        return {}
    with transaction.atomic():
        current = BareMetalHost.objects.select_for_update().only("labels", "inventory").get(pk=host.pk)
        derived = derived_labels(current.inventory)
        labels = {**{k: v for k, v in current.labels.items() if k not in DERIVED_LABELS}, **derived}
        changes = {k: [current.labels.get(k), labels.get(k)] for k in DERIVED_LABELS
                   if current.labels.get(k) != labels.get(k)}
        if changes:
            BareMetalHost.objects.filter(pk=host.pk).update(labels=labels, updated_at=timezone.now())
            text = ", ".join(f"{k} {old or '(none)'} → {new or '(removed)'}" for k, (old, new) in changes.items())
            event_record(kind=EventKind.CHANGE, object_type=ObjectType.HOST, object_name=host.name, host=host,
                         actor=actor, message=f"labels derived from inspection: {text}", data={"labels": changes})
    host.labels = labels
    return changes


# --- the repair pool: retest, return to service, retire ------------------------------------------------

def host_last_repair_verdict(*, host: BareMetalHost) -> dict:
    """What the latest move into repair says: {"retest": "passed"} after a passing retest, else the failure."""
    event = (Event.objects.filter(host_id=host.pk, kind=EventKind.TRANSITION, to_state=HostState.REPAIR)
             .order_by("-id").first())
    return {"message": event.message, **(event.data or {})} if event else {}


def host_retest(*, host: BareMetalHost, actor: str, reason: str = "") -> BareMetalHost:
    """Clean and check a host in repair again: power cycle into the agent, erase, verify, GPU reset, health suite.
    It comes back to repair with the verdict; only a passing retest lets it return to service."""
    if host.state != HostState.REPAIR:
        raise IllegalTransition(f"{host.name} is {host.state}; only a host in repair can be retested")
    return host_transition(host=host, to_state=HostState.RETESTING, actor=actor,
                           reason=reason or "retest: clean and health suite again")


def host_return_to_service(*, host: BareMetalHost, actor: str, override_reason: str = "") -> BareMetalHost:
    """Back to the pool of available hosts: only after a passing retest, or by an admin override that says why.
    The override and its reason are in the Event log."""
    if host.state != HostState.REPAIR:
        raise IllegalTransition(f"{host.name} is {host.state}; only a host in repair can return to service")
    verdict = host_last_repair_verdict(host=host)
    override_reason = (override_reason or "").strip()
    if verdict.get("retest") == "passed":
        data, reason = {"retest": "passed", "retest_flow_id": verdict.get("flow_id")}, "returned to service after a passing retest"
        if override_reason:
            reason += f" ({override_reason})"
    elif override_reason:
        data = {"override": True, "override_reason": override_reason, "without_passing_retest": True,
                "last_repair": {k: verdict.get(k) for k in ("message", "step", "flow_id") if verdict.get(k)}}
        reason = f"returned to service by admin override without a passing retest: {override_reason}"
    else:
        why = verdict.get("message") or "it was set aside"
        raise IllegalTransition(f"{host.name} has no passing retest since it went to repair ({why}): retest it, "
                                "or override with a reason")
    host_transition(host=host, to_state=HostState.AVAILABLE, actor=actor, reason=reason, data=data)
    return host


def host_disk_record_accept(*, host: BareMetalHost, actor: str, reason: str) -> dict:
    """An admin accepts the disks the host's last inspection found as its inventory of record (hosts/gate/census.py):
    a replaced or added disk stops being a deviation, and the release gate's census counts it from now on. Only
    for a host in repair, with a reason; the old and the new record are in the Event. Returns the new record."""
    reason = (reason or "").strip()
    if not reason:
        raise IllegalTransition(f"accepting the disks of {host.name} needs a reason")
    with transaction.atomic():
        current = BareMetalHost.objects.select_for_update().get(pk=host.pk)
        if current.state != HostState.REPAIR:
            raise IllegalTransition(f"{host.name} is {current.state}; only a host in repair may have its disks "
                                    "accepted (retest it after)")
        if not (current.inventory or {}).get("disks"):
            raise IllegalTransition(f"{host.name} has no inspected disks to accept")
        changes = record_deviations(current)
        record = record_from(current.inventory, by=actor)
        BareMetalHost.objects.filter(pk=host.pk).update(disk_record=record, updated_at=timezone.now())
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.HOST, object_name=host.name, host=host,
                     actor=actor, message=(f"disks accepted as the inventory of record ({reason}): "
                                           + ", ".join(disk_text(d) for d in record["disks"])),
                     data={"disk_record": {"before": current.disk_record or None, "after": record,
                                           "deviations": changes, "reason": reason}})
    host.disk_record = record
    return record


def host_retire(*, host: BareMetalHost, actor: str, reason: str) -> BareMetalHost:
    """Take a host out of the fleet for good (from repair, error or maintenance). The reason is required."""
    if not (reason or "").strip():
        raise IllegalTransition(f"retiring {host.name} needs a reason")
    return host_transition(host=host, to_state=HostState.RETIRED, actor=actor, reason=f"retired: {reason.strip()}")


# --- removal: a host deleted for good, its history kept -----------------------------------------------

# A host may go only where no flow drives it and no tenant uses it. Its erase certificates and health runs
# stay (their host link is emptied; they keep the host's name), and so do its Events (plain ids).
REMOVABLE_STATES = frozenset({HostState.AVAILABLE, HostState.MAINTENANCE, HostState.ERROR, HostState.REPAIR,
                              HostState.RETIRED})


def host_removal_refusal(host: BareMetalHost, *, state: str | None = None, claim: str | None = None) -> str:
    """Why the host may not be deleted now; "" when it may. `state` and `claim` (the name of the claim it
    serves) as read under a lock; by default read now."""
    if state is None:
        found = BareMetalHost.objects.filter(pk=host.pk).values("state", "claim__name").first()
        if found is None:
            return "it no longer exists"
        state, claim = found["state"], found["claim__name"]
    if claim:
        return (f"it serves claim {claim}: a host serving a tenant must be released first "
                "(shrink or delete its pool, or release the claim)")
    if state in REMOVABLE_STATES:
        return ""
    if state in IN_PROGRESS:
        return (f"the host is {state}: a flow drives it now; wait until it is done, or put the host in "
                "maintenance first")
    return f"the host is {state}: it serves a tenant and must be released first"


def host_delete(*, host: BareMetalHost, actor: str) -> None:
    """Delete a host for good (the API, `manage.py delete -f` and the admin call this): only in
    REMOVABLE_STATES and serving no claim, checked under the row's lock. Its certificates, health runs and
    Events are kept; an Event "deleted" records who removed it and from which state. Raises
    IllegalTransition (409 over the API) with the reason when it may not go."""
    with transaction.atomic():
        # Locked until commit: no claim can take the host, nor a flow start on it, between the check and the delete.
        locked = (BareMetalHost.objects.select_for_update(of=("self",)).filter(pk=host.pk)
                  .values("state", "claim__name").first())
        if locked is None:
            raise IllegalTransition(f"{host.name} no longer exists")
        refusal = host_removal_refusal(host, state=locked["state"], claim=locked["claim__name"] or "")
        if refusal:
            raise IllegalTransition(f"{host.name} cannot be deleted: {refusal}")
        BareMetalHost.objects.filter(pk=host.pk).delete()
        # Published on commit to the fleet and the host's group: the host's page and the board drop it.
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
                     from_state=locked["state"], actor=actor, message="deleted",
                     data={"deleted": True, "state": locked["state"]})


# --- power cycle: a BMC reset asked for by an admin, sent by a worker ------------------------------------

# A host's power is the operator's to cycle only where no flow drives it: in registering, inspecting,
# provisioning, deprovisioning and retesting the flow's steps switch power and boot targets themselves, and a
# reset under them would break a step (an erase, an image write) or race its own power request.
POWER_CYCLE_STATES = frozenset({HostState.AVAILABLE, HostState.PROVISIONED, HostState.ERROR, HostState.REPAIR,
                                HostState.MAINTENANCE})
POWER_CYCLE_STEP = "power_cycle"
# The operator's power actions: the step their request and outcome Events carry, and their name in messages.
POWER_STEPS = {"power-cycle": POWER_CYCLE_STEP, "power-on": "power_on", "power-off": "power_off"}
POWER_WORDS = {"power-cycle": "power cycle", "power-on": "power on", "power-off": "power off"}


def power_cycle_refusal(state: str) -> str:
    """Why a host in `state` may not be power cycled (nor powered on or off); "" when it may."""
    if state in POWER_CYCLE_STATES:
        return ""
    if state == HostState.HELD:
        return ("the host is held after a restore: no power action until the world reconcile has read its real state; "
                "it runs at each worker's start and again until the host's BMC and the tenants' APIs answer "
                "(manage.py reconcile-world runs it now), then act on the host where it went")
    if state in IN_PROGRESS:
        return (f"the host is {state}: a flow drives its power now; wait until it is done, or put the host in "
                "maintenance first")
    return f"the host is {state}: it is out of the fleet"


def host_power_cycle(*, host: BareMetalHost, actor: str, reason: str = "") -> Event:
    """Ask for a power cycle (a BMC reset; power on when it is off): host_power_request's "power-cycle"."""
    return host_power_request(host=host, action="power-cycle", actor=actor, reason=reason)


def host_power_request(*, host: BareMetalHost, action: str, actor: str, reason: str = "") -> Event:
    """Ask for a power action (`action`: power-cycle, power-on or power-off). Writes the request to the Event
    log with the actor; on commit a worker sends it (task_names.POWER_HOST), outside any transaction, and
    records the BMC's answer. Raises IllegalTransition in a state where a flow drives the power."""
    words = POWER_WORDS[action]
    with transaction.atomic():
        # Locked until commit: a flow cannot start on the host (its state change waits) between this check
        # and the request's Event. The worker checks the state again before it sends the request.
        locked = (BareMetalHost.objects.select_for_update(of=("self",)).filter(pk=host.pk)
                  .values("state", "claim__tenant_id", "claim__id").first())
        if locked is None:
            raise IllegalTransition(f"{host.name} no longer exists")
        refusal = power_cycle_refusal(locked["state"])
        if refusal:
            verb = {"power-cycle": "power cycled", "power-on": "powered on", "power-off": "powered off"}[action]
            raise IllegalTransition(f"{host.name} cannot be {verb} now: {refusal}")
        reason = (reason or "").strip()
        event = event_record(
            kind=EventKind.ACTION, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
            # With the claim it serves: the claim's page lists its node's power requests and their outcomes.
            tenant_id=locked["claim__tenant_id"], claim_id=locked["claim__id"], step=POWER_STEPS[action], actor=actor,
            message=f"{words} requested" + (f": {reason}" if reason else ""),
            data={"action": action, "state": locked["state"], "reason": reason})
        request_id = event.pk
        transaction.on_commit(lambda: task_send(task_names.POWER_HOST, host_id=host.pk,
                                                request_id=request_id))
    return event


def host_power_send(*, host_id: int, request_id: int) -> Event | None:
    """The worker's half of a power action: the request through the BMC, then its outcome in the Event log (by
    the actor who asked for it). Idempotent: a request already answered is not sent again. No transaction
    is open around the BMC call."""
    request = Event.objects.filter(pk=request_id, host_id=host_id, step__in=POWER_STEPS.values()).first()
    if request is None or Event.objects.filter(host_id=host_id, step=request.step,
                                               data__request_id=request_id).exists():
        return None
    action = (request.data or {}).get("action") or "power-cycle"
    words = POWER_WORDS.get(action, "power cycle")
    host = BareMetalHost.objects.filter(pk=host_id).select_related("claim").first()
    if host is None:
        return None
    refusal = power_cycle_refusal(host.state)
    outcome: dict = {"request_id": request_id}
    if refusal:  # the host moved on between the request and now
        return _power_cycle_outcome(host, request, ok=False, message=f"{words} not sent: {refusal}",
                                    data={**outcome, "error": "state", "state": host.state})
    if not host.bmc_password:
        return _power_cycle_outcome(host, request, ok=False,
                                    message=f"{words} failed: no BMC credentials (apply the host's Secret)",
                                    data={**outcome, "error": "auth"})
    started = timezone.now()
    want = "off" if action == "power-off" else "on"
    try:
        with host_bmc(host) as bmc:
            before = bmc.power_state()
            if action == "power-cycle" and before == "off":
                bmc.power_on()  # nothing to reset: a cycle of a host that is off is switching it on
                how = "powered on (it was off)"
            elif action == "power-cycle":
                bmc.reset()
                how = "reset"
            elif before == want:
                how = f"it was {want} already"
            elif want == "on":
                bmc.power_on()
                how = "powered on"
            else:
                bmc.power_off()
                how = "powered off"
            try:
                # Evidence that it got there: the power is on again (a reset lands in seconds), or off.
                bmc.wait_power(want, deadline_s=settings.POWER_DEADLINE_S, poll_s=min(1.0, settings.POWER_POLL_S))
                after = want
            except BMCError as exc:
                if exc.kind != "timeout":
                    raise
                after = "unknown"
    except BMCError as exc:
        host_bmc_contact(host=host, ok=False, error=str(exc), actor=request.actor)
        return _power_cycle_outcome(host, request, ok=False, message=f"{words} failed: {exc}",
                                    data={**outcome, "error": exc.kind})
    host_bmc_contact(host=host, ok=True, actor=request.actor)
    BareMetalHost.objects.filter(pk=host.pk).update(power_state=after)
    if action == "power-cycle":
        message = f"power cycle done: {how}; power {'on again' if after == 'on' else 'not seen on yet'}"
    else:
        message = f"{words} done: {how}; power {after if after == want else f'not seen {want} yet'}"
    return _power_cycle_outcome(host, request, ok=True, message=message, started=started,
                                data={**outcome, "how": how, "power_before": before, "power_after": after})




def _power_cycle_outcome(host: BareMetalHost, request: Event, *, ok: bool, message: str, data: dict,
                         started=None) -> Event:
    now = timezone.now()
    # Its live groups (the fleet, the host's, its tenant's) show its power and timeline.
    event = event_record(
        kind=EventKind.ACTION, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
        tenant_id=request.tenant_id, claim_id=request.claim_id, step=request.step, actor=request.actor,
        message=message,
        duration_s=seconds_since(started, now) if started else None, data={**data, "ok": ok})
    if not ok:
        log.warning("host %s: %s", host.name, message)
    return event


# --- BMC contact: the record behind "BMC red" (hosts/capacity.py counts such hosts as not allocatable) ---------

BMC_CONTACT_STEP = "bmc_contact"


def host_bmc_contact(*, host: BareMetalHost, ok: bool, error: str = "", actor: str = "system:flow") -> bool:
    """Record the outcome of a contact with the host's BMC (no transaction is open around the call that made it).
    A BMC that stops answering, or answers again, is written to the Event log (the fleet board's capacity card
    follows it live); a repeat only refreshes the time, and a success at most every BMC_CONTACT_REFRESH_S (a
    power step polls every few seconds). Returns True when the BMC's colour changed."""
    now = timezone.now()
    error = "" if ok else (error or "no answer")[:500]
    if (ok and host.bmc_ok is True and host.bmc_checked_at is not None
            and (now - host.bmc_checked_at).total_seconds() < settings.BMC_CONTACT_REFRESH_S):
        return False
    values = {"bmc_ok": ok, "bmc_checked_at": now, "bmc_error": error}
    with transaction.atomic():
        # Compare-and-swap on the colour: of two workers seeing the same change, one writes the Event. A first
        # answer (never asked before) is no change: only turning red, and green again after red, are.
        changing = (BareMetalHost.objects.filter(pk=host.pk, bmc_ok=False) if ok
                    else BareMetalHost.objects.filter(pk=host.pk).exclude(bmc_ok=False))
        flipped = changing.update(**values) == 1
        if flipped:
            event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
                         step=BMC_CONTACT_STEP, actor=actor,
                         message="BMC answers" if ok else f"BMC does not answer: {error}",
                         data={"bmc_ok": ok, **({"error": error} if error else {})})
        else:
            BareMetalHost.objects.filter(pk=host.pk).update(**values)
    for name, value in values.items():
        setattr(host, name, value)
    return flipped


def hosts_bmc_check_due(*, limit: int = 200) -> list[str]:
    """The periodic low-cost check: one power-state read (no retries, a short timeout) from each available host
    whose BMC was last heard from more than BMC_CHECK_EVERY_S ago, a few at a time. Returns the names of the
    hosts whose BMC changed colour."""
    cutoff = timezone.now() - timedelta(seconds=settings.BMC_CHECK_EVERY_S)
    hosts = list(BareMetalHost.objects.filter(state=HostState.AVAILABLE)
                 .filter(Q(bmc_checked_at__isnull=True) | Q(bmc_checked_at__lt=cutoff))
                 .order_by(F("bmc_checked_at").asc(nulls_first=True), "pk")[:limit])

    def ask(host: BareMetalHost) -> tuple[str | None, str]:
        """The BMC's power state, or None and why not. Network only: the rows are written by the caller's thread."""
        if not host.bmc_password:
            return None, "no BMC credentials (apply the host's Secret)"
        try:
            with host_bmc(host, timeout=settings.BMC_CHECK_TIMEOUT_S, retries=0) as bmc:
                return bmc.power_state(), ""
        except BMCError as exc:
            return None, str(exc)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, hosts))
    flipped = []
    for host, (power, error) in zip(hosts, answers):
        if power in ("on", "off") and power != host.power_state:
            BareMetalHost.objects.filter(pk=host.pk).update(power_state=power)
        host.bmc_checked_at = None  # a periodic check always refreshes the time
        flipped.append(host_bmc_contact(host=host, ok=power is not None, error=error, actor="system:bmc-check"))
    return [h.name for h, changed in zip(hosts, flipped) if changed]


# What holds the idle tier back on a NodeType: claims waiting for a host it could give. Hosts know nothing of
# claims: claims registers the source at app start (claims.selectors.node_types_waited_for); none registered
# (hosts alone), nothing holds it back.
_idle_check_holds: Callable[[list], dict[int, str]] | None = None


def idle_check_hold_source(fn: Callable[[list], dict[int, str]]) -> None:
    """fn(node_types) → {node type id: why its idle checks wait}."""
    global _idle_check_holds
    _idle_check_holds = fn


@dataclass
class IdleCheckTick:
    """One tick of the idle tier: the hosts it sent to `checking`, and why it started none, or fewer than
    hostsAtOnce allows, on a NodeType ({type name: why}). The beat task returns it (Celery logs it)."""
    started: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def hosts_idle_check_start(*, actor: str = "system:idle-check") -> IdleCheckTick:
    """The idle health tier (pools/health_tiers.py): for each NodeType that declares it, the available hosts it
    selects that are due (never checked first, then the longest unchecked), at most hostsAtOnce of them under a
    check at a time, go to `checking` (the idle_check flow).

    Low priority, so it backs off: a claim takes a host under its check all the same (claims.selectors.free_hosts);
    no check starts on a NodeType while claims it could serve wait for a host (_idle_check_holds); and a host is
    due only when its last health run AND the start of its last idle check are both older than the tier's
    interval: a check that was started counts, whatever became of it, so a check pre-empted by a claim or ended
    without a result is not tried again before an interval has passed. Skips are logged (INFO) and returned,
    never an Event: the tick runs every IDLE_CHECK_EVERY_S."""
    tick = IdleCheckTick()
    now = timezone.now()
    tiers = {t: tier for t in NodeType.objects.exclude(health={}).select_related("provider").order_by("name")
             if (tier := node_type_tiers(t).get("idle")) is not None and t.host_selector}
    holds = _idle_check_holds(list(tiers)) if _idle_check_holds and tiers else {}
    last_run = HealthCheckRun.objects.filter(host=OuterRef("pk")).order_by("-created_at").values("created_at")[:1]
    last_try = (Event.objects.filter(host=OuterRef("pk"), kind=EventKind.TRANSITION, to_state=HostState.CHECKING)
                .order_by("-created_at").values("created_at")[:1])
    for node_type, tier in tiers.items():
        if node_type.pk in holds:
            tick.skipped[node_type.name] = f"held back: {holds[node_type.pk]}"
            continue
        selected = BareMetalHost.objects.filter(label_selector_q(node_type.host_selector))
        room = tier["hostsAtOnce"] - selected.filter(state=HostState.CHECKING).count()
        if room <= 0:
            continue
        since = now - timedelta(seconds=tier["interval_s"])
        # Not a warm host (hosts/flows/warm.py): it is on in the ramdisk and heartbeating, ready for the next claim.
        unchecked = (selected.filter(state=HostState.AVAILABLE, warm_since__isnull=True)
                     .annotate(checked=Subquery(last_run), tried=Subquery(last_try))
                     .filter(Q(checked__isnull=True) | Q(checked__lt=since)))
        due = (unchecked.filter(Q(tried__isnull=True) | Q(tried__lt=since))
               .order_by(F("checked").asc(nulls_first=True), "pk"))
        with transaction.atomic():
            hosts = list(due.select_for_update(skip_locked=True, of=("self",))[:room])
            if hosts:
                hosts_transition_batch(hosts=hosts, to_state=HostState.CHECKING, actor=actor,
                                       reason=f"idle health check of {node_type.name} (every {tier['interval']})")
        tick.started += [h.name for h in hosts]
        if len(hosts) < room and (backing_off := unchecked.filter(tried__gte=since).count()):
            tick.skipped[node_type.name] = (f"{backing_off} host(s) not tried again within {tier['interval']} of an "
                                            "idle check that was pre-empted or ended without a result")
    for name, why in tick.skipped.items():
        log.info("idle health checks of %s: %s", name, why)
    return tick


def publish_progress(host_id: int) -> None:
    """Tell the host's live views that its flow's progress changed (a retry, a heartbeat): no Event."""
    transaction.on_commit(lambda: live.publish([f"host-{host_id}"], {"object": "host", "ids": [host_id],
                                                                      "progress": True}))


# --- data kept by a re-image: the host held for its pool (hosts/gate/plan.py) ------------------------------

def hosts_kept_set(*, host: BareMetalHost, pool, disks: list[dict], actor: str) -> None:
    """Before an erase that keeps data disks: the host is `pool`'s alone until KEPT_DISKS_HOLD_S from now (the
    allocator gives it to no other pool's claim: claims.selectors.free_hosts). Idempotent per pool."""
    until = timezone.now() + timedelta(seconds=settings.KEPT_DISKS_HOLD_S)
    with transaction.atomic():
        if BareMetalHost.objects.filter(pk=host.pk, kept_for_pool=pool, kept_until__isnull=False).exists():
            return
        BareMetalHost.objects.filter(pk=host.pk).update(kept_for_pool=pool, kept_until=until, kept_disks=disks,
                                                        updated_at=timezone.now())
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.HOST, object_name=host.name, host=host,
                     actor=actor, message=(f"held for pool {pool} until {until:%Y-%m-%d %H:%M} UTC: its data disks "
                                           f"{', '.join(d['disk'] for d in disks)} are kept for a re-image of that "
                                           "pool; no other pool's claim gets it"),
                     data={"kept": {"pool": str(pool), "until": until.isoformat(), "disks": disks}})
    host.kept_for_pool, host.kept_until, host.kept_disks = pool, until, disks


def hosts_kept_clear(*, host: BareMetalHost, actor: str, reason: str) -> bool:
    """The hold ends because no kept data is left to hold it for (every disk erased, or the pool's own claim took
    the host back). True when there was one."""
    with transaction.atomic():
        changed = BareMetalHost.objects.filter(pk=host.pk, kept_until__isnull=False).update(
            kept_for_pool=None, kept_until=None, kept_disks=[], updated_at=timezone.now())
        if changed:
            event_record(kind=EventKind.CHANGE, object_type=ObjectType.HOST, object_name=host.name, host=host,
                         actor=actor, message=f"no longer held for a pool: {reason}", data={"kept": None})
    host.kept_for_pool, host.kept_until, host.kept_disks = None, None, []
    return bool(changed)


def hosts_kept_release(*, ended: dict[int, str], actor: str) -> list[str]:
    """Free held hosts whose hold ended ({host id: why}; claims.kept decides, or an admin's action) go through the
    full erase of a release to another tenant (deprovisioning with no claim: hosts/gate/plan.py) before anyone has
    them. Returns the names of the hosts sent."""
    sent = []
    for host in BareMetalHost.objects.filter(pk__in=list(ended), kept_until__isnull=False,
                                             state=HostState.AVAILABLE).select_related("kept_for_pool"):
        why = ended[host.pk]
        try:
            host_transition(host=host, to_state=HostState.DEPROVISIONING, actor=actor,
                            reason=f"the hold on its kept data disks ended ({why}): every disk erased at the "
                                   "strongest level before another tenant has it",
                            data={"kept": {"pool": str(host.kept_for_pool) if host.kept_for_pool else None,
                                           "disks": host.kept_disks, "ended": why}})
        except (ConcurrentTransition, IllegalTransition):
            continue  # a claim of its pool took it meanwhile, or another writer moved it
        sent.append(host.name)
    return sent
