"""The host's own flows on the step engine (register, inspect, retest, idle check) and where a host goes when
one finishes or fails. The flows that serve a claim are composed by claims.steps from the same steps."""
from django.conf import settings
from django.db import transaction

from hosts.choices import HostState
from hosts.engine.agent import disk_written
from hosts.engine.flow import Flow, Run, Step, StepFailed, deadline_setting
from hosts.lifecycle import FLOWS, ConcurrentTransition, register_flow
from hosts.selectors import host_recent_failures
from hosts.services import host_transition

from .firmware import (
    BIOS_APPLY,
    BIOS_VERIFY,
    FIRMWARE_INVENTORY,
    FIRMWARE_UPDATE_STEPS,
    TO_REPAIR_STEPS,
    firmware_update_begin,
)
from .steps import (
    CLEANING_STEPS,
    GATE_STEPS,
    IDLE_STEPS,
    INTAKE_STEPS,
    KEEP_WARM,
    NOTHING_WRITTEN,
    RAMDISK_STEPS,
    TIER_STEPS,
    UNTOUCHED,
    bmc_event_log,
    evidence_trimmed,
    power_off_unless_warm,
    step_bmc_check,
    step_power_off,
    untouched,
)

# --- outcomes -------------------------------------------------------------------------------------
# A flow's end moves the host on through host_transition; what that means for a claim the host serves is the
# claims app's business (its reactions to host transitions: claims.reactions).

def host_flow_finish(run: Run) -> None:
    """The flow's last step is done: the host goes to the flow's done state (to repair instead when it failed
    HOST_FAILURE_LIMIT times lately and would otherwise rejoin the pool)."""
    flow = FLOWS[run.flow["name"]]
    target, reason, data = flow.done_state, f"{flow.name} done", {}
    if untouched(run):
        spared = run.data[UNTOUCHED]
        reason = (f"{flow.name} done: {NOTHING_WRITTEN} ({spared['flow']} failed at {spared['step']} before "
                  f"anything was written; the last erase certificate stands)")
        data = {"untouched": spared}
    if target == HostState.AVAILABLE:
        target, reason, data = _repeat_offender(run, flow.name) or (target, reason, data)
    _move_on(run, target, reason, data)


def retest_finish(run: Run) -> None:
    """Back in the repair pool, now with a passing retest: it may return to service."""
    _move_on(run, FLOWS[run.flow["name"]].done_state,
             "retest passed: erase verified, GPU reset and health suite passed",
             {"retest": "passed", "flow_id": run.flow["id"]})


def _move_on(run: Run, target: str, reason: str, data: dict) -> None:
    try:
        host_transition(host=run.host, to_state=target, actor="system:flow", reason=reason, data=data)
    except ConcurrentTransition:
        return


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
                                      "message": reason, "evidence": evidence_trimmed(evidence)}


def host_flow_fail(run: Run, step: Step, failure: StepFailed) -> None:
    """A step failed: disks that may hold a tenant's data or half an image are cleaned (the flow's
    clean_state); a failed release gate goes to repair with the evidence; anything else to error. Who failed
    (the host or the claim it serves) is written on the transition, for HOST_FAILURE_LIMIT,
    IMAGE_FAILURE_HOSTS (hosts.selectors) and the claim's reaction.

    The claim's failure in a run that wrote nothing (no disk-writing command queued: engine.disk_written) is
    marked `untouched` on the move to clean_state: that flow returns the host without the ramdisk boot and
    the release gate (untouched_begin). A host's own failure, or one after a write was queued, cleans in full."""
    _fail(run, step, failure)


def retest_fail(run: Run, step: Step, failure: StepFailed) -> None:
    """A retest's step failed: as any host flow's, its move to repair marked a failed retest."""
    _fail(run, step, failure, repair_marks={"retest": "failed"})


def _fail(run: Run, step: Step, failure: StepFailed, repair_marks: dict | None = None) -> None:
    flow = FLOWS[run.flow["name"]]
    reason = f"{flow.name} failed at {step.name}: {failure.message}"
    blame = {"fault": "claim" if failure.claim_reason else "host", "claim_reason": failure.claim_reason,
             "step": step.name, "message": failure.message, "claim": run.claim.name if run.claim else None,
             "evidence": evidence_trimmed(failure.evidence)}
    if failure.claim_reason and not failure.clean and not disk_written(run):
        blame[UNTOUCHED] = {"flow": flow.name, "flow_id": run.flow["id"], "step": step.name}
    cleans = bool((failure.clean or failure.claim_reason) and flow.clean_state)
    to_repair = not cleans and ((flow.gate and (failure.repair or step.name in GATE_STEPS)) or step.name in TIER_STEPS
                                or (failure.repair and step.name in TO_REPAIR_STEPS))
    # The BMC's event log joins the repair evidence (what the hardware itself logged); read before the transaction.
    event_log = bmc_event_log(run) if to_repair else None
    try:
        with transaction.atomic():
            if cleans:
                host_transition(host=run.host, to_state=flow.clean_state, actor="system:flow", reason=reason,
                                step=step.name, data=blame)
            elif to_repair:
                # The release gate or a health tier failed: never back to the pool; to repair, with the evidence.
                # (A handover failure happens before anything is written: the claim takes another host.)
                evidence = {"flow": flow.name, "flow_id": run.flow["id"], "step": step.name,
                            "message": failure.message, **(repair_marks or {}),
                            **({"tier": TIER_STEPS[step.name]} if step.name in TIER_STEPS else {}),
                            "evidence": evidence_trimmed(failure.evidence),
                            **({"bmc_event_log": evidence_trimmed(event_log)} if event_log else {})}
                host_transition(host=run.host, to_state=HostState.REPAIR, actor="system:flow", reason=reason,
                                step=step.name, data=evidence)
            else:
                host_transition(host=run.host, to_state=HostState.ERROR, actor="system:flow", reason=reason,
                                error_type=f"{flow.name} error", step=step.name,
                                data=blame if flow.clean_state else None)
    except ConcurrentTransition:
        return


def host_flow(name: str, state: str, steps: list[Step], *, done_state: str, clean_state: str = "",
              gate: bool = False, after_step: dict | None = None, related: tuple[str, ...] = (),
              begin=None, finish=host_flow_finish, fail=host_flow_fail) -> Flow:
    """Register a flow that ends, and fails, as every host flow does (host_flow_finish, host_flow_fail above)
    unless it gives its own hooks."""
    return register_flow(Flow(name=name, state=state, steps=steps, finish=finish, fail=fail, done_state=done_state,
                              clean_state=clean_state, gate=gate, after_step=after_step or {}, related=related,
                              begin=begin))


host_flow("register", HostState.REGISTERING, [Step("bmc_check", step_bmc_check, deadline_setting("POWER_DEADLINE_S"))],
          done_state=HostState.INSPECTING)
host_flow("inspect", HostState.INSPECTING, [
    BIOS_APPLY,  # the NodeType's BIOS settings, applied by the power-on that follows and verified after it
    *RAMDISK_STEPS[:2],
    BIOS_VERIFY,
    FIRMWARE_INVENTORY,
    *RAMDISK_STEPS[2:],
    *CLEANING_STEPS,  # the initial clean and health check, as on every release
    *INTAKE_STEPS,  # and the intake tier (burn-in), when the NodeType declares it
    KEEP_WARM,
    power_off_unless_warm("power_off"),
], done_state=HostState.AVAILABLE, gate=True)
# A host in repair, cleaned and checked again; it stays in repair (with the verdict) until an admin returns it
# to service (hosts.services.host_return_to_service).
host_flow("retest", HostState.RETESTING, [
    Step("power_off", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
    BIOS_APPLY,  # a host in repair for a setting that did not stick is checked for it again
    *RAMDISK_STEPS[:2],
    BIOS_VERIFY,
    *RAMDISK_STEPS[2:],
    *CLEANING_STEPS,
    *INTAKE_STEPS,  # after repair, the intake tier again
    Step("power_off_after_clean", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
], done_state=HostState.REPAIR, gate=True, finish=retest_finish, fail=retest_fail)
# The idle tier: an available host checked now and then (hosts.services.hosts_idle_check_start); a claim
# pre-empts it (the allocator takes a host in this state; the provision flow powers it off and boots it anew).
host_flow("idle_check", HostState.CHECKING, [
    *RAMDISK_STEPS[:2],
    *IDLE_STEPS,
    Step("power_off", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
], done_state=HostState.AVAILABLE, gate=True)
# A servicing action an admin asked for on an available host (hosts.services.host_firmware_update): the update, the
# power-off after it and the inventory read again; back to the pool, or to repair with the task's evidence.
host_flow("firmware_update", HostState.SERVICING, FIRMWARE_UPDATE_STEPS, done_state=HostState.AVAILABLE,
          begin=firmware_update_begin)
