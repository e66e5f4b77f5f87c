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
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from events.choices import EventKind
from events.models import Event
from vmetal_console import live

from .bmc import BMC, BMCError
from .choices import HostState
from .lifecycle import ConcurrentTransition
from .models import AgentSession, BareMetalHost, CommandStatus, HostCommand

log = logging.getLogger(__name__)
LEASE = timedelta(seconds=120)


class Waiting(Exception):
    """The step waits for something outside; drive again after `recheck_s` (or when it happens)."""

    def __init__(self, why: str = "", recheck_s: float | None = None):
        super().__init__(why)
        self.recheck_s = recheck_s


class StepFailed(Exception):
    """The step cannot succeed. `clean`: the disks may hold a tenant's data or half an image, so the
    host is cleaned (deprovisioned) rather than parked in error."""

    def __init__(self, message: str, *, clean: bool = False):
        super().__init__(message)
        self.message, self.clean = message, clean


@dataclass
class Step:
    name: str
    run: Callable[["Run"], dict | None]
    deadline_s: Callable[[], float]


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
        return BMC(self.host.bmc_address, self.host.bmc_username, self.host.bmc_password,
                   verify_tls=not self.host.bmc_disable_certificate_verification,
                   timeout=settings.BMC_TIMEOUT_S, boot_mac=self.host.boot_mac)

    def save_flow(self) -> None:
        BareMetalHost.objects.filter(pk=self.host.pk).update(flow=self.flow)


# --- driving --------------------------------------------------------------------------------------

def request_drive(host_id: int, countdown: float | None = None) -> None:
    """Ask a worker to drive the host, once the current transaction (if any) commits."""
    from . import tasks

    def send():
        try:
            tasks.drive_host.apply_async(kwargs={"host_id": host_id}, countdown=countdown)
        except Exception:
            log.warning("could not enqueue a drive of host %s; the periodic re-drive will", host_id, exc_info=True)

    transaction.on_commit(send)


def drive(host_id: int) -> None:
    now = timezone.now()
    taken = BareMetalHost.objects.filter(pk=host_id).filter(
        Q(drive_lease_until__isnull=True) | Q(drive_lease_until__lt=now)).update(
        drive_lease_until=now + LEASE, driven_at=now)
    if not taken:
        request_drive(host_id, countdown=0.3)  # another worker drives it; look again when it is done
        return
    try:
        for _ in range(100):
            if not _advance(host_id):
                return
    finally:
        BareMetalHost.objects.filter(pk=host_id).update(drive_lease_until=None, driven_at=timezone.now())


def _advance(host_id: int) -> bool:
    """Run the next step of the host's flow. True when there may be more to do at once."""
    host = BareMetalHost.objects.select_related("claim__tenant", "claim__node_type").filter(pk=host_id).first()
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
        try:
            data = step.run(run) or {}
        except SoftTimeLimitExceeded:
            raise StepFailed(f"{step.name} ran past the worker's time limit") from None
    except Waiting as wait:
        if wait.recheck_s is not None:
            request_drive(host_id, countdown=wait.recheck_s)
        return False
    except StepFailed as failure:
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

    target = {"register": HostState.INSPECTING, "inspect": HostState.AVAILABLE,
              "provision": HostState.PROVISIONED, "deprovision": HostState.AVAILABLE}[flow_name]
    with transaction.atomic():
        try:
            host_transition(host=run.host, to_state=target, actor="system:flow", reason=f"{flow_name} done")
        except ConcurrentTransition:
            return
        claim_flows.host_flow_finished(run, flow_name)
        if target == HostState.AVAILABLE:
            from claims.services import host_freed

            host_freed()


def _fail(run: Run, flow_name: str, step: str, failure: StepFailed) -> None:
    from claims.services import claim_host_lost
    from .services import host_transition

    reason = f"{flow_name} failed at {step}: {failure.message}"
    with transaction.atomic():
        try:
            if failure.clean and flow_name == "provision":
                host_transition(host=run.host, to_state=HostState.DEPROVISIONING, actor="system:flow", reason=reason)
            else:
                host_transition(host=run.host, to_state=HostState.ERROR, actor="system:flow", reason=reason,
                                error_type=f"{flow_name} error")
        except ConcurrentTransition:
            return
        if run.claim is not None:
            claim_host_lost(claim=run.claim, reason=f"host {run.host.name}: {reason}", actor="system:flow")


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
            if want == "off":
                bmc.power_off()
                return
            if bmc.virtual_media_boot and boot != "disk":
                bmc.insert_virtual_media(settings.AGENT_ISO_URL)
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
        raise Waiting(f"{name} queued for the agent")
    if command.status == CommandStatus.DONE:
        return command.result
    if command.status == CommandStatus.FAILED:
        raise StepFailed(f"agent: {command.error}", clean=name in ("write_image", "write_seed"))
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


def step_reboot_to_disk(run: Run) -> dict:
    agent_command(run, "reboot_to_disk")
    AgentSession.objects.filter(host=run.host, active=True).update(active=False)  # that boot is over
    return {}


def _claim_steps(name: str):
    def run_step(run: Run):
        from claims import flows as claim_flows

        return getattr(claim_flows, name)(run)

    return run_step


def _s(name: str) -> Callable[[], float]:
    return lambda: getattr(settings, name)


# Cleaning is pluggable: the steps a release (and a first registration) runs between the agent's boot
# and the host's return to the pool.
CLEANING_STEPS = [Step("erase_metadata", step_erase_metadata, _s("AGENT_COMMAND_DEADLINE_S"))]

FLOW_FOR_STATE = {HostState.REGISTERING: "register", HostState.INSPECTING: "inspect",
                  HostState.PROVISIONING: "provision", HostState.DEPROVISIONING: "deprovision"}
FLOWS: dict[str, list[Step]] = {
    "register": [Step("bmc_check", step_bmc_check, _s("POWER_DEADLINE_S"))],
    "inspect": [
        Step("power_on_pxe", step_power_on_ramdisk, _s("POWER_STEP_DEADLINE_S")),
        Step("agent_lookup", step_agent_lookup, _s("AGENT_LOOKUP_DEADLINE_S")),
        Step("inspect", step_inspect, _s("AGENT_COMMAND_DEADLINE_S")),
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
        Step("drain_node", _claim_steps("step_drain_node"), _s("DRAIN_DEADLINE_S")),
        Step("delete_node", _claim_steps("step_delete_node"), _s("DRAIN_DEADLINE_S")),
        Step("power_off", step_power_off, _s("POWER_STEP_DEADLINE_S")),
        Step("power_on_pxe", step_power_on_ramdisk, _s("POWER_STEP_DEADLINE_S")),
        Step("agent_lookup", step_agent_lookup, _s("AGENT_LOOKUP_DEADLINE_S")),
        *CLEANING_STEPS,
        Step("power_off_after_clean", step_power_off, _s("POWER_STEP_DEADLINE_S")),
    ],
}


def _after_boot_from_disk(run: Run) -> None:
    from claims import flows as claim_flows

    claim_flows.claim_joining(run)


AFTER_STEP = {("provision", "boot_from_disk"): _after_boot_from_disk}
