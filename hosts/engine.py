"""The step engine: drives a host through the flow of its state, level-triggered and resumable. It knows no
flow: the apps register theirs (`register_flow`; hosts.flows the host's own, claims.steps provision and
deprovision), each a list of Steps and what to do when it finishes or fails.

Every event that may let a host move on (a state change, an agent lookup or result, a timer, the periodic
re-drive) just asks for `drive(host_id)`. `drive` takes a lease on the host (one driver at a time), finds
the first step of the state's flow not done yet, and runs it: a step either finishes (its end and
duration go in the Event log), waits for something outside (an agent command, a node going Ready), or
fails. The flow's progress lives on the host row, so a worker killed mid-step loses nothing: the next
drive starts that step again, and every step is idempotent. Network I/O (BMC, tenant API) happens in the
steps, outside any database transaction."""
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core import live
from events.choices import EventKind, ObjectType
from events.services import event_record

from .agent_poll import agent_wake
from .bmc import BMC
from .models import AgentSession, BareMetalHost, CommandStatus, HostCommand

log = logging.getLogger(__name__)


class Waiting(Exception):
    """The step waits for something outside; drive again after `recheck_s` (or when it happens)."""

    def __init__(self, why: str = "", recheck_s: float | None = None):
        super().__init__(why)
        self.recheck_s = recheck_s


class StepFailed(Exception):
    """The step cannot succeed. `clean`: the disks may hold a tenant's data or half an image, so the
    host is cleaned (deprovisioned) rather than parked in error. `repair`: the release gate failed (erase,
    verification, GPU reset, health suite): the host goes to the repair pool with `evidence`.
    `claim_reason`: the claim caused it (its image, its tenant), not the host: the host is cleaned and the
    failure not held against it (HOST_FAILURE_LIMIT), and the claim fails with this reason."""

    def __init__(self, message: str, *, clean: bool = False, repair: bool = False, evidence: dict | None = None,
                 claim_reason: str = ""):
        super().__init__(message)
        self.message, self.clean, self.repair, self.evidence = message, clean, repair, evidence or {}
        self.claim_reason = claim_reason


FAIL, SKIP = "fail", "skip"


@dataclass
class Step:
    """`on_deadline`: what the flow does with a step that has not finished within `deadline_s` (or failed):
    FAIL the flow (the flow's `fail` sends the host to its failure state), or SKIP it with the reason recorded
    and go on (a release's drain and delete: the tenant's API must not keep a host from its erase).
    `when`: the step runs only where when(run) is true; elsewhere it is passed over without a trace (no Event,
    nothing on the timeline): a warm host's provision has no power-on, network boot or lookup at all."""

    name: str
    run: Callable[["Run"], dict | None]
    deadline_s: Callable[[], float]
    on_deadline: str = FAIL
    when: Callable[["Run"], bool] | None = None
    boots_ramdisk: bool = False  # powers the host into the agent's ramdisk: where a void boot starts again

    def applies(self, run: "Run") -> bool:
        return self.when is None or bool(self.when(run))


@dataclass
class Flow:
    """A host's flow in one state. `finish(run)` and `fail(run, step, failure)` move the host on (hosts.flows
    gives them); `done_state`, `clean_state` and `gate` are theirs to read; `after_step` runs a function once a
    step is done; `related`: the host's relations a step reads (loaded with the host, one query); `begin(run)`
    runs once when a run of the flow starts, before its first step (what it writes in run.data is kept)."""

    name: str
    state: str
    steps: list[Step]
    finish: Callable[["Run"], None]
    fail: Callable[["Run", Step, "StepFailed"], None]
    done_state: str = ""
    clean_state: str = ""
    gate: bool = False
    after_step: dict[str, Callable[["Run"], None]] = field(default_factory=dict)
    related: tuple[str, ...] = ()
    begin: Callable[["Run"], None] | None = None


FLOWS: dict[str, Flow] = {}  # by name
FLOW_FOR_STATE: dict[str, str] = {}  # host state → flow name
RELATED: set[str] = set()  # what _advance loads with the host, for every registered flow


def register_flow(flow: Flow) -> Flow:
    FLOWS[flow.name] = flow
    FLOW_FOR_STATE[flow.state] = flow.name
    RELATED.update(flow.related)
    return flow


def setting(name: str) -> Callable[[], float]:
    """A step deadline read from settings when it is checked (tests and workers may change it)."""
    return lambda: getattr(settings, name)


class Run:
    """One drive of one host: the host row, its flow record and the claim it serves, if any (the reverse
    side of the claim's link to its host; the engine only reads it for the Event log)."""

    def __init__(self, host: BareMetalHost):
        self.host = host
        self.flow = host.flow
        self.claim = getattr(host, "claim", None)

    @property
    def data(self) -> dict:
        return self.flow.setdefault("data", {})

    def step_started_at(self):
        return parse_datetime(self.flow["step_started_at"])

    def bmc(self) -> BMC:
        from .services import host_bmc

        return host_bmc(self.host, kept=True)

    def save_flow(self) -> None:
        # Only while the host is still in the state this flow serves: a drive of a flow that was pre-empted (an
        # idle check a claim took over) must not overwrite the new flow's record.
        since = self.flow.get("state_since")
        match = {"state_changed_at": parse_datetime(since)} if since else {}
        BareMetalHost.objects.filter(pk=self.host.pk, **match).update(flow=self.flow)


# --- driving --------------------------------------------------------------------------------------

def request_drive(host_id: int, countdown: float | None = None) -> None:
    """Ask a worker to drive the host, once the current transaction (if any) commits. A later drive
    (`countdown`, a step's recheck) is not sent when one is already due no later than it would be."""
    from . import tasks

    def send():
        if countdown and not _recheck_needed(host_id, countdown):
            return
        try:
            tasks.drive_host.apply_async(kwargs={"host_id": host_id}, countdown=countdown)
        except Exception:
            log.warning("could not enqueue a drive of host %s; the periodic re-drive will", host_id, exc_info=True)

    transaction.on_commit(send)


# Rechecks of a host already scheduled: its key holds the time the earliest one is due. Without it every
# event that drives a waiting host (an agent's result, a state change, a lease found taken) would start
# another chain of rechecks beside the one already polling, and a host's polls would multiply as it goes
# (measured: 176 drives per provisioned host at N = 20, 68 at N = 1). The cache only saves work: a
# recheck it wrongly thinks due is made up by the periodic re-drive (drive_stale).
RECHECK_KEY = "drive-due:{}"
RECHECK_LATE_S = 10  # a recheck this late was lost (a killed worker, a purged queue): schedule anew


def _recheck_needed(host_id: int, countdown: float) -> bool:
    key, due = RECHECK_KEY.format(host_id), time.time() + countdown
    try:
        pending = cache.get(key)
        if pending is not None and time.time() - RECHECK_LATE_S < pending <= due:
            return False
        cache.set(key, due, timeout=countdown + RECHECK_LATE_S)
    except Exception:  # no cache: every recheck goes out, as before
        log.warning("drive recheck not deduplicated: cache unavailable", exc_info=True)
    return True


def _recheck_started(host_id: int) -> None:
    """A drive starts: the recheck due by now is this one (or was overtaken by it)."""
    key = RECHECK_KEY.format(host_id)
    try:
        pending = cache.get(key)
        if pending is not None and pending <= time.time() + 0.05:
            cache.delete(key)
    except Exception:
        pass


def drive(host_id: int) -> None:
    _recheck_started(host_id)
    now = timezone.now()
    until = now + timedelta(seconds=settings.DRIVE_LEASE_S)
    taken = BareMetalHost.objects.filter(pk=host_id).filter(
        Q(drive_lease_until__isnull=True) | Q(drive_lease_until__lt=now)).update(
        drive_lease_until=until, driven_at=now)
    if not taken:
        # Another worker drives it: look again when it is done. A host that is gone (deleted) is driven no more.
        if BareMetalHost.objects.filter(pk=host_id).exists():
            request_drive(host_id, countdown=0.3)
        return
    lease = LeaseKeeper(host_id, until)
    try:
        for _ in range(100):
            if lease.lost or not _advance(host_id):
                return
    finally:
        held = lease.stop()
        BareMetalHost.objects.filter(pk=host_id, drive_lease_until=held).update(drive_lease_until=None,
                                                                                driven_at=timezone.now())


class LeaseKeeper:
    """Keeps a drive's lease short and alive: DRIVE_LEASE_S (30 s), renewed every third of it by a thread
    while the drive runs, so a worker killed mid-step holds its host for at most one lease, and a slow step
    of a live worker keeps it. The lease's end as this drive last wrote it is the drive's token: a renewal,
    and the release at the end, change the row only while it still holds that value, so a worker whose
    lease ran out (and was taken by another) never extends or clears the other's."""

    def __init__(self, host_id: int, until):
        self.host_id, self.until, self.lost = host_id, until, False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"drive-lease-{host_id}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        from django.db import connection

        lease_s = settings.DRIVE_LEASE_S
        try:
            while not self._stopped.wait(lease_s / 3):
                until = timezone.now() + timedelta(seconds=lease_s)
                try:
                    renewed = BareMetalHost.objects.filter(pk=self.host_id, drive_lease_until=self.until).update(
                        drive_lease_until=until)
                except Exception:  # the database away for a moment: the lease has two more thirds to go
                    log.warning("host %s: drive lease not renewed", self.host_id, exc_info=True)
                    continue
                if not renewed:
                    self.lost = True  # the drive stops after this step
                    log.warning("host %s: drive lease lost (ran out and taken?)", self.host_id)
                    return
                self.until = until
        finally:
            connection.close()  # this thread's own connection, if it opened one

    def stop(self):
        """Stop renewing; the lease's end as this drive last wrote it."""
        self._stopped.set()
        self._thread.join()
        return self.until


def _advance(host_id: int) -> bool:
    """Run the next step of the host's flow. True when there may be more to do at once."""
    # Not .first(), and no ORDER BY at all (the model's default ordering): compiling the ordering was a third
    # of this query's cost, and this query the largest single cost of a drive (py-spy).
    host = next(iter(BareMetalHost.objects.select_related(*sorted(RELATED)).filter(pk=host_id).order_by()), None)
    if host is None:
        return False
    flow_name = FLOW_FOR_STATE.get(host.state)
    if flow_name is None:
        return False
    flow = FLOWS[flow_name]
    run = Run(host)
    if run.flow.get("state_since") != host.state_changed_at.isoformat() or run.flow.get("name") != flow_name:
        run.flow = {"name": flow_name, "id": str(uuid.uuid4()), "state_since": host.state_changed_at.isoformat(),
                    "done": {}, "data": {}}
        if flow.begin is not None:
            flow.begin(run)
        run.save_flow()
    if host.raced_boot_id is not None:
        return _boot_raced(run, flow)
    step = next((s for s in flow.steps if s.name not in run.flow["done"] and s.applies(run)), None)
    if step is None:
        if flow.gate and _unsettled(run):  # a gate passes only on a boot that has settled
            return False
        flow.finish(run)
        return True
    if run.flow.get("step") != step.name:
        for kept in RETRY_KEYS:
            run.flow.pop(kept, None)
        run.flow.update(step=step.name, step_started_at=timezone.now().isoformat())
        run.save_flow()
        _step_event(run, step.name, "started")
    elapsed = (timezone.now() - run.step_started_at()).total_seconds()
    try:
        if elapsed > step.deadline_s():
            last = run.flow.get("last_error")
            raise StepFailed(f"{step.name} did not finish within {int(step.deadline_s())}s"
                             + (f"; last error: {last}" if last else ""))
        data = step.run(run) or {}
    except Waiting as wait:
        if wait.recheck_s is not None:
            request_drive(host_id, countdown=wait.recheck_s)
        return False
    except StepFailed as failure:
        if _unsettled(run):
            # An agent's failure is its word: on a boot that may still turn out raced it decides nothing yet.
            return False
        if step.on_deadline == SKIP:
            _skip(run, step.name, failure.message, elapsed)
            return True
        _step_event(run, step.name, f"failed: {failure.message}", duration_s=elapsed)
        flow.fail(run, step, failure)
        return True
    elapsed = (timezone.now() - run.step_started_at()).total_seconds()
    run.flow["done"][step.name] = {"at": timezone.now().isoformat(), "duration_s": round(elapsed, 3)}
    run.flow.pop("step", None)
    for kept in RETRY_KEYS:
        run.flow.pop(kept, None)
    run.save_flow()
    _step_event(run, step.name, "done", duration_s=elapsed, data=data)
    after = flow.after_step.get(step.name)
    if after:
        after(run)
    return True


def _skip(run: Run, step: str, reason: str, elapsed: float) -> None:
    """A SKIP step that could not finish: recorded as skipped, with the reason, and the flow goes on."""
    run.flow["done"][step] = {"at": timezone.now().isoformat(), "skipped": reason, "duration_s": round(elapsed, 3)}
    run.flow.pop("step", None)
    for kept in RETRY_KEYS:
        run.flow.pop(kept, None)
    run.save_flow()
    _step_event(run, step, f"skipped: {reason}", duration_s=elapsed, data={"skipped": reason})


RETRY_KEYS = ("last_error", "last_error_at", "retries")  # a step's retries, on the flow row while it runs


# --- a void ramdisk boot: boot again -------------------------------------------------------------------

def boot_settled(run: Run, what: str) -> None:
    """Wait (raise Waiting) until the host's ramdisk boot has settled: nothing a race could steal or forge is
    acted on before (hosts/boot.py)."""
    from . import boot as boot_path

    left = boot_path.boot_unsettled_s(run.host.pk)
    if left:
        raise Waiting(f"{what} for the boot to settle ({left:.1f}s)", recheck_s=left + 0.05)


def _unsettled(run: Run) -> bool:
    """The host's ramdisk boot has not settled (hosts/boot.py): look again when it will have."""
    from . import boot as boot_path

    left = boot_path.boot_unsettled_s(run.host.pk)
    if left:
        request_drive(run.host.pk, countdown=min(left + 0.05, settings.AGENT_SILENCE_S))
    return bool(left)


def _boot_raced(run: Run, flow: Flow) -> bool:
    """The host's ramdisk boot was raced and voided (hosts/boot.py: boot_race, boot_void): the flow boots the host
    again with a new secret, no failure counted; BOOT_RACES_BEFORE_REPAIR raced boots in a row: to repair."""
    from . import boot as boot_path
    from .choices import HostState
    from .models import EraseCertificate, RamdiskBoot

    raced_id = run.host.raced_boot_id
    if not BareMetalHost.objects.filter(pk=run.host.pk, raced_boot_id=raced_id).update(raced_boot_id=None):
        return True  # another drive dealt with it
    boot = RamdiskBoot.objects.filter(pk=raced_id).first()
    if boot is not None:  # a certificate a drive signed while the race was being voided
        boot_path.certificates_revoke(host=run.host, boot=boot)
    voided = {"boot": raced_id}
    races = boot_path.boot_races_in_a_row(run.host.pk)
    if races >= settings.BOOT_RACES_BEFORE_REPAIR:
        _leave_raced(run, flow, HostState.REPAIR, f"boot raced {races} times: the provisioning network is not trusted",
                     voided)
        return False
    signed = boot is not None and EraseCertificate.objects.filter(
        host=run.host, created_at__gte=boot.created_at, revoked_at__isnull=False).exists()
    if signed and not flow.gate and flow.clean_state:
        # The race voided the gate this host passed before its flow (a warm host's boot): cleaned again, by the
        # flow's cleaning state; no failure of the host or its claim (claims.reactions reads boot_raced).
        _leave_raced(run, flow, flow.clean_state,
                     f"boot {raced_id} raced after its release gate: its certificates are revoked; cleaned again", voided)
        return False
    boot_again(run, flow, f"boot {raced_id} raced (its configuration was fetched twice): booting again with a "
                          "new secret")
    return True


def _leave_raced(run: Run, flow: Flow, to_state: str, reason: str, voided: dict) -> None:
    from .lifecycle import ConcurrentTransition
    from .services import host_transition

    try:
        host_transition(host=run.host, to_state=to_state, actor="system:flow", reason=reason,
                        step=run.flow.get("step") or "", data={"flow": flow.name, "flow_id": run.flow["id"],
                                                               "message": reason, "boot_raced": voided})
    except ConcurrentTransition:
        pass


def boot_again(run: Run, flow: Flow, reason: str) -> None:
    """Start the flow's ramdisk boot over: its power-on step and every step after it are undone (their agent
    commands of this run dropped, their results unread), and the next drive powers the host off and on into the
    ramdisk with a new secret. No failure: the step's Event says why ("retrying: ...")."""
    names = [s.name for s in flow.steps]
    starts = [i for i, s in enumerate(flow.steps) if s.boots_ramdisk]
    if not starts:
        return
    done = [i for i in starts if names[i] in run.flow["done"]]
    first = done[-1] if done else starts[0]
    again = names[first:]
    current = run.flow.get("step") or names[first]
    for name in again:
        run.flow["done"].pop(name, None)
        run.data.pop(name, None)  # a power step's record of what it sent
    if run.data.get("warm"):
        run.data["warm"] = False  # a warm host's provision goes on by the cold path, as when its agent is lost
    HostCommand.objects.filter(host=run.host, flow_id=run.flow["id"], step__in=again).delete()
    for kept in RETRY_KEYS:
        run.flow.pop(kept, None)
    run.flow.pop("step", None)
    run.save_flow()
    _step_event(run, current, f"retrying: {reason}", data={"boot_again": True})


def step_retry(run: Run, error: str, *, recheck_s: float | None) -> Waiting:
    """A step that failed for now and will try again (the BMC down, a drain not done): the error, when and how
    many tries so far are kept on the host's flow row (the host and claim pages show them, with the step's
    deadline). The first error and each new one go in the Event log ("retrying: …", the timelines); a repeat
    only tells the live views. Raise what it returns."""
    new = run.flow.get("last_error") != error
    run.flow.update(last_error=error, last_error_at=timezone.now().isoformat(),
                    retries=int(run.flow.get("retries") or 0) + 1)
    run.save_flow()
    if new:
        _step_event(run, run.flow["step"], f"retrying: {error}", data={"retries": run.flow["retries"]})
    else:
        publish_progress(run.host.pk)
    return Waiting(error, recheck_s=recheck_s)


def step_status(host: BareMetalHost) -> dict:
    """The step the host's flow runs now, as the pages show it: name, start, deadline (the step's own), tries
    and the last error. Empty when no step runs (a flow left on the row by a state that is over says nothing)."""
    flow = host.flow or {}
    name, started = flow.get("step"), parse_datetime(flow.get("step_started_at") or "")
    if not name or started is None or FLOW_FOR_STATE.get(host.state) != flow.get("name"):
        return {}
    if flow.get("state_since") and host.state_changed_at and flow["state_since"] != host.state_changed_at.isoformat():
        return {}
    step = next((s for s in FLOWS[flow["name"]].steps if s.name == name), None) if flow.get("name") in FLOWS else None
    return {"name": name, "started_at": started, "retries": int(flow.get("retries") or 0),
            "deadline_at": started + timedelta(seconds=step.deadline_s()) if step else None,
            "last_error": flow.get("last_error") or "", "last_error_at": parse_datetime(flow.get("last_error_at") or "")}


def _step_event(run: Run, step: str, message: str, duration_s: float | None = None, data: dict | None = None):
    claim = run.claim
    event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=run.host.name, host=run.host,
                 claim=claim, tenant_id=claim.tenant_id if claim else None, step=step, message=message,
                 duration_s=duration_s, actor="system:flow",
                 data={"flow": run.flow.get("name"), "flow_id": run.flow.get("id"), **(data or {})})


def publish_progress(host_id: int) -> None:
    transaction.on_commit(lambda: live.publish([f"host-{host_id}"], {"object": "host", "ids": [host_id],
                                                                      "progress": True}))


def drive_stale(*, older_than_s: float = 20) -> list[int]:
    """The periodic re-drive: hosts in a flow that nobody drove lately (a lost task, a killed worker)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    ids = list(BareMetalHost.objects.filter(state__in=list(FLOW_FOR_STATE))
               .filter(Q(driven_at__isnull=True) | Q(driven_at__lt=cutoff))
               .filter(Q(drive_lease_until__isnull=True) | Q(drive_lease_until__lt=timezone.now()))
               .values_list("pk", flat=True)[:1000])
    for host_id in ids:
        request_drive(host_id)
    return ids


# --- the agent: a command per step ----------------------------------------------------------------

# run.data's record of whether the flow run queued a command that writes the disk: False where the flow says at its
# start that nothing is written yet (the provision's begin: its host passed its last gate); the first disk-writing
# command (agent_command's dirties_disk) replaces it with {"step", "command", "at"}.
DISK_WRITTEN = "disk_written"


def disk_written(run: Run) -> bool:
    """Whether this flow run may have written the disk. A run that never said it started with nothing written
    (no DISK_WRITTEN: any flow but the provision, or a run begun by an older console) counts as written."""
    return run.data.get(DISK_WRITTEN, True) is not False


def agent_command(run: Run, name: str, args: dict | None = None, secret_args: dict | None = None,
                  make_args: Callable[[], tuple[dict, dict]] | None = None, dirties_disk: bool = False,
                  tenant_secret: bool = False) -> dict:
    """Queue `name` for the agent once per flow step; finish with its result, fail with its error.
    `dirties_disk`: the command writes the disk (an image, a seed). The flow run records that before the command
    is queued (disk_written), and a failed one asks for the host to be cleaned (StepFailed.clean): it may have
    left part of its work on the disk. `tenant_secret`: the command carries a tenant's secret (a join token, its
    CA): it is queued only once the agent's boot has settled (hosts/boot.py), so a raced boot never gets it."""
    step = run.flow["step"]
    command = HostCommand.objects.filter(host=run.host, flow_id=run.flow["id"], step=step).first()
    if command is None:
        if tenant_secret:
            boot_settled(run, f"{name} waits")
        if make_args is not None:
            args, secret_args = make_args()
        if dirties_disk and not run.data.get(DISK_WRITTEN):
            # Saved before the command exists: no agent can write the disk in a run that says it wrote nothing.
            run.data[DISK_WRITTEN] = {"step": step, "command": name, "at": timezone.now().isoformat()}
            run.save_flow()
        HostCommand.objects.get_or_create(
            host=run.host, flow_id=run.flow["id"], step=step,
            defaults={"name": name, "args": args or {}, "secret_args": json.dumps(secret_args) if secret_args else ""})
        agent_wake(run.host.pk)  # a warm host's agent waits in a long poll (hosts/agent_poll.py)
        # Look again even if nothing calls back: an agent that dies with the command is noticed by its silence.
        raise Waiting(f"{name} queued for the agent", recheck_s=settings.AGENT_SILENCE_S / 2)
    if command.status == CommandStatus.DONE:
        return command.result
    if command.status == CommandStatus.FAILED:
        raise StepFailed(f"agent: {command.error}", clean=dirties_disk,
                         evidence=command.result or {})
    session = AgentSession.objects.filter(host=run.host, active=True).first()
    silence = settings.AGENT_SILENCE_S
    if session and (timezone.now() - session.last_seen_at).total_seconds() > silence:
        raise StepFailed(f"the agent stopped answering (no heartbeat for more than {silence}s)")
    raise Waiting(f"{name}: {command.status}", recheck_s=silence / 2)
