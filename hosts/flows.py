"""Flows: the steps that drive a host through each in-progress state, level-triggered and resumable.

Every event that may let a host move on (a state change, an agent lookup or result, a timer, the periodic
re-drive) just asks for `drive(host_id)`. `drive` takes a lease on the host (one driver at a time), finds
the first step of the state's flow not done yet, and runs it: a step either finishes (its end and
duration go in the Event log), waits for something outside (an agent command, a node going Ready), or
fails. The flow's progress lives on the host row, so a worker killed mid-step loses nothing: the next
drive starts that step again, and every step is idempotent. Network I/O (BMC, tenant API) happens here,
outside any database transaction."""
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from events.choices import EventKind
from events.models import Event
from vmetal_console import live

from . import boot as boot_path
from .bmc import BMC, BMCError
from .choices import HostState
from .lifecycle import ConcurrentTransition
from .models import AgentSession, BareMetalHost, CommandStatus, HostCommand
from .selectors import host_recent_failures

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
    FAIL the flow (the host to its failure state), or SKIP it with the reason recorded and go on (a release's
    drain and delete: the tenant's API must not keep a host from its erase)."""
    name: str
    run: Callable[["Run"], dict | None]
    deadline_s: Callable[[], float]
    on_deadline: str = FAIL


class Run:
    """One drive of one host: the host row, its flow record and the claim it serves."""

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
        BareMetalHost.objects.filter(pk=self.host.pk).update(flow=self.flow)


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
        request_drive(host_id, countdown=0.3)  # another worker drives it; look again when it is done
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
    host = next(iter(BareMetalHost.objects.select_related("claim__tenant", "claim__node_type").filter(pk=host_id)
                     .order_by()), None)
    if host is None:
        return False
    flow_name = FLOW_FOR_STATE.get(host.state)
    if flow_name is None:
        return False
    run = Run(host)
    if run.flow.get("state_since") != host.state_changed_at.isoformat() or run.flow.get("name") != flow_name:
        run.flow = {"name": flow_name, "id": str(uuid.uuid4()), "state_since": host.state_changed_at.isoformat(),
                    "done": {}, "data": {}}
        run.save_flow()
    step = next((s for s in FLOWS[flow_name] if s.name not in run.flow["done"]), None)
    if step is None:
        _finish(run, flow_name)
        return True
    if run.flow.get("step") != step.name:
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
        if step.on_deadline == SKIP:
            _skip(run, step.name, failure.message, elapsed)
            return True
        _step_event(run, step.name, f"failed: {failure.message}", duration_s=elapsed)
        _fail(run, flow_name, step.name, failure)
        return True
    elapsed = (timezone.now() - run.step_started_at()).total_seconds()
    run.flow["done"][step.name] = {"at": timezone.now().isoformat(), "duration_s": round(elapsed, 3)}
    run.flow.pop("step", None)
    run.flow.pop("last_error", None)
    run.save_flow()
    _step_event(run, step.name, "done", duration_s=elapsed, data=data)
    after = AFTER_STEP.get((flow_name, step.name))
    if after:
        after(run)
    return True


def _step_event(run: Run, step: str, message: str, duration_s: float | None = None, data: dict | None = None):
    claim = run.claim
    Event.objects.create(kind=EventKind.STEP, object_type="host", object_name=run.host.name, host=run.host,
                         claim=claim, tenant_id=claim.tenant_id if claim else None, step=step,
                         message=message, duration_s=duration_s, actor="system:flow",
                         data={"flow": run.flow.get("name"), **(data or {})})
    transaction.on_commit(lambda: live.publish([f"host-{run.host.pk}", "fleet"],
                                               {"object": "host", "ids": [run.host.pk], "step": step,
                                                "message": message}))


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


# --- outcomes -------------------------------------------------------------------------------------

def _finish(run: Run, flow_name: str) -> None:
    from claims import flows as claim_flows
    from .services import host_transition

    target = {"register": HostState.INSPECTING, "inspect": HostState.AVAILABLE, "provision": HostState.PROVISIONED,
              "deprovision": HostState.AVAILABLE, "retest": HostState.REPAIR}[flow_name]
    reason, data = f"{flow_name} done", {}
    if flow_name == "retest":  # back in the repair pool, now with a passing retest: it may return to service
        reason = "retest passed: erase verified, GPU reset and health suite passed"
        data = {"retest": "passed", "flow_id": run.flow["id"]}
    if target == HostState.AVAILABLE:
        target, reason, data = _repeat_offender(run, flow_name) or (target, reason, data)
    with transaction.atomic():
        try:
            host_transition(host=run.host, to_state=target, actor="system:flow", reason=reason, data=data)
        except ConcurrentTransition:
            return
        claim_flows.host_flow_finished(run, flow_name)
        if target == HostState.AVAILABLE:
            from claims.services import host_freed

            host_freed()


def _repeat_offender(run: Run, flow_name: str) -> tuple[str, str, dict] | None:
    """A host cleaned after HOST_FAILURE_LIMIT failures of its own within the window: to repair, not the pool."""
    failures = host_recent_failures(host=run.host)
    if len(failures) < settings.HOST_FAILURE_LIMIT:
        return None
    hours = settings.HOST_FAILURE_WINDOW_S / 3600
    reason = (f"{len(failures)} provisioning failures within {hours:g}h, the last at {failures[-1].step}: "
              f"{failures[-1].data.get('message', '')}")
    evidence = {"failures": [{"at": e.created_at.isoformat(), "step": e.step, "claim": e.data.get("claim"),
                              "message": e.data.get("message")} for e in failures]}
    return HostState.REPAIR, reason, {"flow": flow_name, "flow_id": run.flow["id"], "step": "host_failures",
                                      "message": reason, "evidence": _trim(evidence)}


def _skip(run: Run, step: str, reason: str, elapsed: float) -> None:
    """A SKIP step that could not finish: recorded as skipped, with the reason, and the flow goes on."""
    run.flow["done"][step] = {"at": timezone.now().isoformat(), "skipped": reason, "duration_s": round(elapsed, 3)}
    run.flow.pop("step", None)
    run.flow.pop("last_error", None)
    run.save_flow()
    _step_event(run, step, f"skipped: {reason}", duration_s=elapsed, data={"skipped": reason})


def _fail(run: Run, flow_name: str, step: str, failure: StepFailed) -> None:
    from claims.services import claim_host_lost
    from .services import host_transition

    reason = f"{flow_name} failed at {step}: {failure.message}"
    # Who failed, for HOST_FAILURE_LIMIT and IMAGE_FAILURE_HOSTS (hosts.selectors), on the transition's Event.
    blame = {"fault": "claim" if failure.claim_reason else "host", "step": step, "message": failure.message,
             "claim": run.claim.name if run.claim else None, "evidence": _trim(failure.evidence)}
    with transaction.atomic():
        try:
            if (failure.clean or failure.claim_reason) and flow_name == "provision":
                host_transition(host=run.host, to_state=HostState.DEPROVISIONING, actor="system:flow", reason=reason,
                                step=step, data=blame)
            elif flow_name in GATE_FLOWS and (failure.repair or step in GATE_STEPS):
                # The release gate failed: never back to the pool; to repair, with the evidence.
                evidence = {"flow": flow_name, "flow_id": run.flow["id"], "step": step, "message": failure.message,
                            **({"retest": "failed"} if flow_name == "retest" else {}),
                            "evidence": _trim(failure.evidence)}
                host_transition(host=run.host, to_state=HostState.REPAIR, actor="system:flow", reason=reason,
                                step=step, data=evidence)
            else:
                host_transition(host=run.host, to_state=HostState.ERROR, actor="system:flow", reason=reason,
                                error_type=f"{flow_name} error", step=step,
                                data=blame if flow_name == "provision" else None)
        except ConcurrentTransition:
            return
        if run.claim is not None:
            claim_host_lost(claim=run.claim, reason=f"host {run.host.name}: {reason}", actor="system:flow",
                            claim_reason=failure.claim_reason)


# --- steps ----------------------------------------------------------------------------------------

TRANSIENT_BMC_ERRORS = ("unreachable", "timeout", "server_error")


def _bmc_call(fn, run: "Run | None" = None):
    """A BMC call from a step. Transient failures (the BMC down, slow or answering 5xx, after the BMC
    client's own retries) make the step wait and try again until its deadline; the rest fail it."""
    try:
        return fn()
    except BMCError as exc:
        if run is not None and exc.kind in TRANSIENT_BMC_ERRORS:
            run.flow["last_error"] = str(exc)
            run.save_flow()
            raise Waiting(str(exc), recheck_s=settings.BMC_RETRY_S) from None
        raise StepFailed(str(exc)) from None


def step_bmc_check(run: Run) -> dict:
    """Registration: the BMC answers, the credentials work, the system exists and has the boot MAC."""
    if not run.host.bmc_password:
        raise StepFailed("no BMC credentials: apply the host's Secret")
    with run.bmc() as bmc:
        found = _bmc_call(lambda: bmc.check(run.host.boot_mac), run)
    power = found.get("power_state", "unknown")
    BareMetalHost.objects.filter(pk=run.host.pk).update(power_state=power)
    return {"system": found.get("system_id"), "power": power}


def _power(run: Run, want: str, boot: str | None = None) -> dict | None:
    """Bring the host's power to `want` ("off", or "on" booting `boot` once) without holding a worker:
    send the change once, then poll on later drives (power lands seconds to minutes later). On the way
    to "on" the host is first powered off, so it really boots what was asked. Returns None when done."""
    scratch = run.data.setdefault(run.flow["step"], {})
    with run.bmc() as bmc:
        state = _bmc_call(bmc.power_state, run)
        if want == "on" and not scratch.get("was_off"):
            if state != "off":
                _send_once(run, scratch, "off", bmc.power_off)
                raise Waiting("powering off first", recheck_s=settings.POWER_POLL_S)
            scratch["was_off"] = True
            run.save_flow()
        if state == want and (want == "off" or "on" in scratch):
            BareMetalHost.objects.filter(pk=run.host.pk).update(power_state=want)
            return None

        def switch():
            # Whatever boots next, the agent session of the boot that ends here ends with it.
            boot_path.agent_sessions_end(host_ids=[run.host.pk])
            if want == "off":
                bmc.power_off()
                return
            if boot != "disk":
                # A new ramdisk boot: its secret reaches the server only through the boot path (hosts/boot.py).
                boot_path.ramdisk_boot_start(host=run.host, flow_id=run.flow["id"])
            if bmc.virtual_media_boot and boot != "disk":
                bmc.insert_virtual_media(boot_path.virtual_media_url(run.host))
                bmc.set_boot_once("cd")
            else:
                if bmc.virtual_media_boot:
                    bmc.eject_virtual_media()
                bmc.set_boot_once(boot)
            if boot != "disk":
                run.data["ramdisk_boot_at"] = timezone.now().isoformat()  # an agent calling after this is ours
            bmc.power_on()

        _send_once(run, scratch, want, switch)
    raise Waiting(f"waiting for power {want}", recheck_s=settings.POWER_POLL_S)


def _send_once(run: Run, scratch: dict, key: str, fn) -> None:
    """A power request, sent once; again only if it has not landed within POWER_DEADLINE_S."""
    sent = scratch.get(key)
    if sent and (timezone.now() - parse_datetime(sent)).total_seconds() < settings.POWER_DEADLINE_S:
        return
    if sent:
        run.flow["last_error"] = f"power {key} not reached within {int(settings.POWER_DEADLINE_S)}s; asked again"
    _bmc_call(fn, run)
    scratch[key] = timezone.now().isoformat()
    run.save_flow()


def step_power_on_ramdisk(run: Run) -> dict:
    """One-time boot into the agent's ramdisk (PXE, or virtual media for redfish-virtualmedia://)."""
    _power(run, "on", boot="pxe")
    return {"boot": "ramdisk"}


def step_power_off(run: Run) -> dict:
    _power(run, "off")
    return {}


def step_boot_from_disk(run: Run) -> dict:
    _power(run, "on", boot="disk")
    return {}


def step_agent_lookup(run: Run) -> dict:
    since = parse_datetime(run.data.get("ramdisk_boot_at") or run.flow["step_started_at"])
    session = AgentSession.objects.filter(host=run.host, active=True, created_at__gte=since).first()
    if session is None:
        raise Waiting("the agent has not called back yet")
    return {"boot_id": session.boot_id}


def agent_command(run: Run, name: str, args: dict | None = None, secret_args: dict | None = None,
                  make_args: Callable[[], tuple[dict, dict]] | None = None) -> dict:
    """Queue `name` for the agent once per flow step; finish with its result, fail with its error."""
    step = run.flow["step"]
    command = HostCommand.objects.filter(host=run.host, flow_id=run.flow["id"], step=step).first()
    if command is None:
        if make_args is not None:
            args, secret_args = make_args()
        HostCommand.objects.get_or_create(
            host=run.host, flow_id=run.flow["id"], step=step,
            defaults={"name": name, "args": args or {}, "secret_args": json.dumps(secret_args) if secret_args else ""})
        # Look again even if nothing calls back: an agent that dies with the command is noticed by its silence.
        raise Waiting(f"{name} queued for the agent", recheck_s=settings.AGENT_SILENCE_S / 2)
    if command.status == CommandStatus.DONE:
        return command.result
    if command.status == CommandStatus.FAILED:
        raise StepFailed(f"agent: {command.error}", clean=name in ("write_image", "write_seed"),
                         evidence=command.result or {})
    session = AgentSession.objects.filter(host=run.host, active=True).first()
    silence = settings.AGENT_SILENCE_S
    if session and (timezone.now() - session.last_seen_at).total_seconds() > silence:
        raise StepFailed(f"the agent stopped answering (no heartbeat for more than {silence}s)")
    raise Waiting(f"{name}: {command.status}", recheck_s=silence / 2)


def step_inspect(run: Run) -> dict:
    if run.flow["name"] == "provision" and run.host.inventory:
        return {"skipped": "inventory known"}
    inventory = agent_command(run, "inspect")
    BareMetalHost.objects.filter(pk=run.host.pk).update(inventory=inventory)
    return {"disks": len(inventory.get("disks", [])), "gpus": len(inventory.get("gpus", []))}


def step_erase_metadata(run: Run) -> dict:
    result = agent_command(run, "erase_metadata", {"mib": 2})
    return {"disks": [d.get("name") for d in result.get("disks", [])]}


# --- the release gate: erase → verify → GPU reset → health suite (hosts/cleaning.py decides) ---------

GATE_FLOWS = ("deprovision", "inspect", "retest")
GATE_STEPS = frozenset({"erase", "verify_erase", "gpu_reset", "health_dcgm", "health_nccl"})


def _trim(value, limit: int = 4000):
    """Evidence for the Event log: the structure, with long strings (raw tool output) shortened."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:200] + f" … ({len(value)} characters) … " + value[-limit:]
    if isinstance(value, dict):
        return {k: _trim(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_trim(v, limit) for v in value[:64]]
    return value


def _gate(run: Run) -> dict:
    """The policy and health suite of this flow run, decided at its first gate step and kept."""
    from . import cleaning

    gate = run.data.get("gate")
    if gate is None:
        gate = cleaning.gate_for(run.host, run.claim)
        gate["previous"] = cleaning.previous_use(run.host, run.claim)
        run.data["gate"] = gate
        run.save_flow()
    return gate


def _boot_id(run: Run) -> str:
    session = AgentSession.objects.filter(host=run.host, active=True).first()
    return session.boot_id if session else ""


def _issue_certificates(run: Run, gate: dict, *, erase: dict | None, verify: dict | None) -> list:
    """The signed certificates of this erase; a console that cannot sign fails the gate step with the reason."""
    from . import certificates, cleaning

    try:
        return cleaning.issue_certificates(host=run.host, flow_id=run.flow["id"], gate=gate,
                                           previous=gate["previous"], erase=erase, verify=verify,
                                           boot_id=_boot_id(run))
    except certificates.SigningUnavailable as exc:
        raise StepFailed(str(exc), repair=True, evidence={"verify": verify} if verify else {}) from None


def step_erase(run: Run) -> dict:
    """Plant canaries, fingerprint a sample, erase every disk by the policy (agent: `erase`)."""
    from . import cleaning

    gate = _gate(run)
    policy = gate["policy"]
    args = {"erase_id": run.flow["id"], "method": policy["method"], "fallback": policy["fallback"],
            "concurrency": policy["concurrency"], "verify": {"share": policy["verify_share"]}}
    try:
        result = agent_command(run, "erase", args, secret_args={"key": cleaning.canary_key(run.flow["id"])})
    except StepFailed as failure:
        if failure.evidence.get("disks"):
            try:
                certs = _issue_certificates(run, gate, erase=failure.evidence, verify=None)
                failure.evidence = {**failure.evidence, "certificates": [c.pk for c in certs]}
            except StepFailed as unsigned:
                failure.message = f"{failure.message}; {unsigned.message}"
        failure.repair = True
        raise
    run.data["erase"] = result
    run.save_flow()
    return {"policy": policy, "disks": [{k: d.get(k) for k in ("name", "method", "method_type", "fallback_from",
                                                                "bytes_written", "canaries_planted")}
                                        for d in result.get("disks", [])]}


def step_verify_erase(run: Run) -> dict:
    """Read the canaries and the sample back (agent: `verify_erase`); judge; one certificate per disk."""
    from . import cleaning

    gate = _gate(run)
    key = cleaning.canary_key(run.flow["id"])
    args = {"erase_id": run.flow["id"], "mode": gate["policy"]["verify_mode"],
            "concurrency": gate["policy"]["concurrency"]}
    try:
        result = agent_command(run, "verify_erase", args, secret_args={"key": key})
    except StepFailed as failure:
        failure.repair = True
        raise
    certs = _issue_certificates(run, gate, erase=run.data.get("erase"), verify=result)
    failed = [c for c in certs if c.result != "pass"]
    if failed or not certs:
        why = "; ".join(f"{c.disk}: {', '.join(c.document['verification']['findings'][:2])}" for c in failed)
        raise StepFailed(f"erase verification failed: {why or 'no disk was verified'}", repair=True,
                         evidence={"certificates": [c.pk for c in certs], "verify": result})
    return {"certificates": [str(c.certificate_id) for c in certs],
            "bytes_read": sum(d.get("bytes_read") or 0 for d in result.get("disks", []))}


def _gpus(run: Run) -> int:
    return _gate(run)["health"]["expected_gpus"]


def step_gpu_reset(run: Run) -> dict:
    """`nvidia-smi --gpu-reset -i N` for each GPU; refused (and failed) while a process holds one."""
    from . import cleaning

    gate = _gate(run)
    expected = _gpus(run)
    if not expected:
        return {"skipped": "no GPU on this host or its NodeType"}
    try:
        result = agent_command(run, "gpu_reset", {"expected_gpus": expected})
    except StepFailed as failure:
        raw = _joined_runs(failure.evidence.get("runs"))
        listed = [g for g in failure.evidence.get("gpus") or [] if "index" in g]
        gpus = {str(g["index"]): {"status": "fail" if g.get("exit_code") else "pass", "reset": g.get("reset"),
                                  "bus": g.get("pci_bus")} for g in listed}
        index_of = {g.get("uuid"): str(g["index"]) for g in listed}
        for proc in failure.evidence.get("processes") or []:
            held = index_of.get(proc.get("gpu_uuid"))
            if held is not None:
                gpus[held].update(status="fail", held_by=f"pid {proc.get('pid')} ({proc.get('process_name')})")
        row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="gpu-reset", gate=gate,
                                     parsed={"verdict": "fail", "reasons": [failure.message.removeprefix("agent: ")],
                                             "gpus": gpus}, raw=raw, thresholds={"expected_gpus": expected})
        failure.repair = True
        failure.evidence = {"health_run": row.pk, **failure.evidence}
        raise
    gpus = {str(g["index"]): {"status": "pass", "reset": g.get("reset"), "bus": g.get("pci_bus")}
            for g in result.get("gpus", [])}
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="gpu-reset", gate=gate,
                                 parsed={"verdict": "pass", "reasons": [], "gpus": gpus},
                                 raw=_joined_runs(result.get("runs")), thresholds={"expected_gpus": expected})
    return {"gpus": len(gpus), "health_run": row.pk}


def _joined_runs(runs) -> dict:
    runs = runs or []
    return {"command": "; ".join(r.get("command", "") for r in runs),
            "exit_code": next((r.get("exit_code") for r in runs if r.get("exit_code")), 0 if runs else None),
            "stdout": "\n".join(f"$ {r.get('command')}\n{r.get('stdout', '')}{r.get('stderr', '')}" for r in runs)}


def step_health_dcgm(run: Run) -> dict:
    """`dcgmi diag -r N -j`, judged by hosts.health.parse_dcgmi."""
    from . import cleaning, health

    gate = _gate(run)
    level = gate["health"]["dcgm_level"]
    if not _gpus(run) or not level:
        return {"skipped": "no GPU" if not _gpus(run) else "the NodeType runs no DCGM diagnostic"}
    try:
        raw = agent_command(run, "health_check", {"suite": "dcgm", "level": level})
    except StepFailed as failure:
        failure.repair = True
        raise
    text = raw.get("stdout") or ""
    parsed = health.parse_dcgmi(text if "{" in text else text + "\n" + (raw.get("stderr") or ""), raw.get("exit_code"))
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="dcgmi", gate=gate, parsed=parsed,
                                 raw=raw, thresholds={"dcgm_level": level})
    if parsed["verdict"] != "pass":
        raise StepFailed(f"dcgmi diag -r {level}: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"health_run": row.pk, "reasons": parsed["reasons"], "gpus": parsed["gpus"]})
    return {"health_run": row.pk, "verdict": "pass", "tests": len(parsed["tests"]), "version": parsed.get("version")}


def step_health_nccl(run: Run) -> dict:
    """`all_reduce_perf` over every GPU, judged on large-message busbw against the NodeType's threshold."""
    from . import cleaning, health

    gate = _gate(run)
    threshold = gate["health"]["nccl_min_busbw_gbps"]
    gpus = _gpus(run)
    if not gpus or threshold is None:
        return {"skipped": "no GPU" if not gpus else "the NodeType sets no NCCL threshold"}
    try:
        raw = agent_command(run, "health_check", {"suite": "nccl", "gpus": gpus, "min_bytes": "1G", "max_bytes": "8G"})
    except StepFailed as failure:
        failure.repair = True
        raise
    parsed = health.parse_nccl((raw.get("stdout") or "") + (raw.get("stderr") or ""), json_text=raw.get("json"),
                               exit_code=raw.get("exit_code"), min_busbw=threshold)
    row = cleaning.record_health(host=run.host, flow_id=run.flow["id"], suite="nccl", gate=gate, parsed=parsed,
                                 raw=raw, thresholds={"min_busbw_gbps": threshold})
    if parsed["verdict"] != "pass":
        raise StepFailed("all_reduce_perf: " + "; ".join(parsed["reasons"][:3]), repair=True,
                         evidence={"health_run": row.pk, "reasons": parsed["reasons"], "busbw_gbps": parsed["busbw_gbps"]})
    return {"health_run": row.pk, "busbw_gbps": parsed["busbw_gbps"], "message_bytes": parsed["message_bytes"]}


def step_reboot_to_disk(run: Run) -> dict:
    agent_command(run, "reboot_to_disk")
    boot_path.agent_sessions_end(host_ids=[run.host.pk])  # that boot is over
    return {}


def _claim_steps(name: str):
    def run_step(run: Run):
        from claims import flows as claim_flows

        return getattr(claim_flows, name)(run)

    return run_step


def _s(name: str) -> Callable[[], float]:
    return lambda: getattr(settings, name)


# The release gate: what a release, a first registration and a retest run between the agent's boot and the
# host's return to the pool. A failure of any of these steps sends the host to repair with the evidence.
CLEANING_STEPS = [
    Step("erase", step_erase, _s("ERASE_DEADLINE_S")),
    Step("verify_erase", step_verify_erase, _s("VERIFY_DEADLINE_S")),
    Step("gpu_reset", step_gpu_reset, _s("AGENT_COMMAND_DEADLINE_S")),
    Step("health_dcgm", step_health_dcgm, _s("HEALTH_DEADLINE_S")),
    Step("health_nccl", step_health_nccl, _s("HEALTH_DEADLINE_S")),
]

FLOW_FOR_STATE = {HostState.REGISTERING: "register", HostState.INSPECTING: "inspect",
                  HostState.PROVISIONING: "provision", HostState.DEPROVISIONING: "deprovision",
                  HostState.RETESTING: "retest"}
FLOWS: dict[str, list[Step]] = {
    "register": [Step("bmc_check", step_bmc_check, _s("POWER_DEADLINE_S"))],
    "inspect": [
        Step("power_on_pxe", step_power_on_ramdisk, _s("POWER_STEP_DEADLINE_S")),
        Step("agent_lookup", step_agent_lookup, _s("AGENT_LOOKUP_DEADLINE_S")),
        Step("inspect", step_inspect, _s("AGENT_COMMAND_DEADLINE_S")),
        *CLEANING_STEPS,  # the initial clean and health check, as on every release
        Step("power_off", step_power_off, _s("POWER_STEP_DEADLINE_S")),
    ],
    "provision": [
        Step("power_on_pxe", step_power_on_ramdisk, _s("POWER_STEP_DEADLINE_S")),
        Step("agent_lookup", step_agent_lookup, _s("AGENT_LOOKUP_DEADLINE_S")),
        Step("inspect", step_inspect, _s("AGENT_COMMAND_DEADLINE_S")),
        Step("write_image", _claim_steps("step_write_image"), _s("IMAGE_WRITE_DEADLINE_S")),
        Step("write_seed", _claim_steps("step_write_seed"), _s("AGENT_COMMAND_DEADLINE_S")),
        Step("reboot_to_disk", step_reboot_to_disk, _s("AGENT_COMMAND_DEADLINE_S")),
        Step("boot_from_disk", step_boot_from_disk, _s("POWER_STEP_DEADLINE_S")),
        Step("node_ready", _claim_steps("step_node_ready"), _s("NODE_READY_DEADLINE_S")),
        Step("node_labels", _claim_steps("step_node_labels"), _s("AGENT_COMMAND_DEADLINE_S")),
    ],
    "deprovision": [
        Step("drain_node", _claim_steps("step_drain_node"), _s("DRAIN_DEADLINE_S"), on_deadline=SKIP),
        Step("delete_node", _claim_steps("step_delete_node"), _s("DRAIN_DEADLINE_S"), on_deadline=SKIP),
        Step("power_off", step_power_off, _s("POWER_STEP_DEADLINE_S")),
        Step("power_on_pxe", step_power_on_ramdisk, _s("POWER_STEP_DEADLINE_S")),
        Step("agent_lookup", step_agent_lookup, _s("AGENT_LOOKUP_DEADLINE_S")),
        *CLEANING_STEPS,
        Step("power_off_after_clean", step_power_off, _s("POWER_STEP_DEADLINE_S")),
    ],
    # A host in repair, cleaned and checked again; it stays in repair (with the verdict) until an admin
    # returns it to service (hosts.services.host_return_to_service).
    "retest": [
        Step("power_off", step_power_off, _s("POWER_STEP_DEADLINE_S")),
        Step("power_on_pxe", step_power_on_ramdisk, _s("POWER_STEP_DEADLINE_S")),
        Step("agent_lookup", step_agent_lookup, _s("AGENT_LOOKUP_DEADLINE_S")),
        Step("inspect", step_inspect, _s("AGENT_COMMAND_DEADLINE_S")),
        *CLEANING_STEPS,
        Step("power_off_after_clean", step_power_off, _s("POWER_STEP_DEADLINE_S")),
    ],
}


def _after_boot_from_disk(run: Run) -> None:
    from claims import flows as claim_flows

    claim_flows.claim_joining(run)


AFTER_STEP = {("provision", "boot_from_disk"): _after_boot_from_disk}
