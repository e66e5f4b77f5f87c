"""The step engine's driver: drives a host through the flow of its state, level-triggered and resumable."""
# The step engine's driver: drives a host through the flow of its state, level-triggered and resumable. It
# knows no flow: the apps register theirs (hosts.lifecycle.register_flow; hosts.flows the host's own, claims.steps
# provision and deprovision), each a list of Steps and what to do when it finishes or fails.
#
# Every event that may let a host move on (a state change, an agent lookup or result, a timer, the periodic
# re-drive) just asks for `drive(host_id)`. `drive` takes a lease on the host (one driver at a time), finds
# the first step of the state's flow not done yet, and runs it: a step either finishes (its end and
# duration go in the Event log), waits for something outside (an agent command, a node going Ready), or
# fails. The flow's progress lives on the host row, so a worker killed mid-step loses nothing: the next
# drive starts that step again, and every step is idempotent. Network I/O (BMC, tenant API) happens in the
# steps, outside any database transaction.
import logging
import threading
import time
import uuid
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from events.choices import EventKind, ObjectType
from events.services import event_record
from hosts import task_names
from hosts.boot import ramdisk as boot_path
from hosts.choices import HostState
from hosts.lifecycle import FLOW_FOR_STATE, FLOWS, ConcurrentTransition
from hosts.models import BareMetalHost, EraseCertificate, HostCommand, RamdiskBoot
from hosts.restore import world_check
from hosts.services import host_transition, publish_progress

from .flow import SKIP, Flow, Run, StepFailed, Waiting
from .load import host_for_drive

log = logging.getLogger(__name__)


# --- driving --------------------------------------------------------------------------------------

def request_drive(host_id: int, countdown: float | None = None) -> None:
    """Ask a worker to drive the host, once the current transaction (if any) commits. A later drive
    (`countdown`, a step's recheck) is not sent when one is already due no later than it would be."""
    def send():
        if countdown and not _recheck_needed(host_id, countdown):
            return
        try:
            current_app.send_task(task_names.DRIVE_HOST, kwargs={"host_id": host_id}, countdown=countdown)
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
    if not world_check():  # the database was restored: every host is held until its real state is read
        return
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
    done = None  # a step this drive finished, its record not written yet (_advance)
    try:
        for _ in range(100):
            if lease.lost:
                return
            more, done = _advance(host_id, done)
            if not more:
                return
    finally:
        if done is not None and not lease.lost:
            done.save_flow()
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


def _advance(host_id: int, done: Run | None = None) -> tuple[bool, Run | None]:
    """Run the next step of the host's flow. True when there may be more to do at once, with the run whose
    finished step is not written yet.

    A finished step's record is written with the next step's start (one UPDATE, not two), or at the drive's end:
    `done`, the run of the step this drive finished last, is carried over to the next call, which reads the host
    anew (level-triggered: whatever changed it meanwhile counts) and goes on from `done`'s record only while the
    host is still in the state that record serves; a host that left it had its record's write refused anyway
    (Run.save_flow). A worker killed between the two runs the finished step again (steps are idempotent)."""
    host = host_for_drive(host_id)
    if host is None:
        return False, None
    flow_name = FLOW_FOR_STATE.get(host.state)
    if flow_name is None:
        if host.raced_boot_id is not None:
            _raced_without_flow(host)
        return False, None
    flow = FLOWS[flow_name]
    carried = done is not None and done.flow.get("state_since") == host.state_changed_at.isoformat() \
        and done.flow.get("id") == (host.flow or {}).get("id")
    if carried:
        host.flow = done.flow
    run = Run(host, unsaved=carried)
    more = _advance_run(run, flow, flow_name)
    return more, (run if run.unsaved else None)


def _advance_run(run: Run, flow: Flow, flow_name: str) -> bool:
    host, host_id = run.host, run.host.pk
    if run.flow.get("state_since") != host.state_changed_at.isoformat() or run.flow.get("name") != flow_name:
        run.flow = {"name": flow_name, "id": str(uuid.uuid4()), "state_since": host.state_changed_at.isoformat(),
                    "done": {}, "data": {}}
        if flow.begin is not None:
            flow.begin(run)
        run.save_flow()
    if host.raced_boot_id is not None:
        run.save_unsaved()
        return _boot_raced(run, flow)
    step = next((s for s in flow.steps if s.name not in run.flow["done"] and s.applies(run)), None)
    if step is None:
        if flow.gate and _unsettled(run):  # a gate passes only on a boot that has settled
            return False
        run.save_unsaved()  # the hook moves the host on: the record is written while it still serves the state
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
        run.save_unsaved()
        flow.fail(run, step, failure)
        return True
    elapsed = (timezone.now() - run.step_started_at()).total_seconds()
    run.flow["done"][step.name] = {"at": timezone.now().isoformat(), "duration_s": round(elapsed, 3)}
    run.flow.pop("step", None)
    for kept in RETRY_KEYS:
        run.flow.pop(kept, None)
    run.unsaved = True  # written with the next step's start (drive carries the run over), or at the drive's end
    _step_event(run, step.name, "done", duration_s=elapsed, data=data)
    after = flow.after_step.get(step.name)
    if after:
        run.save_unsaved()
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

def _unsettled(run: Run) -> bool:
    """The host's ramdisk boot has not settled (hosts/boot/ramdisk.py): look again when it will have."""
    left = boot_path.boot_unsettled_s(run.host.pk)
    if left:
        request_drive(run.host.pk, countdown=min(left + 0.05, settings.AGENT_SILENCE_S))
    return bool(left)


def _boot_raced(run: Run, flow: Flow) -> bool:
    """The host's ramdisk boot was raced and voided (hosts/boot/ramdisk.py: boot_race, boot_void): the flow boots
    the host again with a new secret, no failure counted; BOOT_RACES_BEFORE_REPAIR raced boots in a row: to repair."""
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


def _raced_without_flow(host: BareMetalHost) -> None:
    """A boot raced on a host no flow drives: a warm host (hosts/flows/warm.py), on in the ramdisk and idle. No flow
    boots it again, so it is inspected and cleaned anew, with a new boot."""
    raced_id = host.raced_boot_id
    if not BareMetalHost.objects.filter(pk=host.pk, raced_boot_id=raced_id).update(raced_boot_id=None):
        return  # another drive dealt with it
    if host.state != HostState.AVAILABLE or host.warm_since is None:
        return
    boot = RamdiskBoot.objects.filter(pk=raced_id).first()
    raced = boot_path.race_text(boot) if boot is not None else f"boot {raced_id} raced"
    try:
        host_transition(host=host, to_state=HostState.INSPECTING, actor="system:agent-listener",
                        reason=f"{raced}: inspected and cleaned again with a new boot",
                        data={"boot_raced": {"boot": raced_id}})
    except ConcurrentTransition:
        pass


def _leave_raced(run: Run, flow: Flow, to_state: str, reason: str, voided: dict) -> None:
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


