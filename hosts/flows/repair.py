"""The repair ladder: a host set aside in repair climbs, by itself, the remedies its NodeType lists for its
kind of failure, one rung at a time."""
# The repair ladder: a host the checks set aside in repair climbs, by itself, the remedies its NodeType lists for
# its kind of failure (pools.choices.DEFAULT_LADDERS unless the NodeType's `repair:` block says otherwise), one rung
# at a time, until the checks pass (back to the pool, the history kept) or the ladder ends (it waits for a person,
# with a summary of what failed and what was tried).
#
# - A move into repair opens a RepairCase (`host_moved`, called inside the transition's transaction): the failure's
#   kind, read from the failed run (`classify`), its evidence, and the ladder. On commit a task asks
#   `host_repair_advance` to start the next rung.
# - A rung is a RepairAttempt row and a move repair → repairing; the `repair` flow (on the step engine, as every
#   host flow) carries the remedy out and runs the checks again; it ends in available (the case is repaired) or
#   back in repair (the attempt failed, the next rung is asked for). The transitions are the Events.
# - An admin's retest, return to service or retirement still works as before; it takes the case out of the
#   ladder's hands (the ladder never starts a rung on a host a person is retesting).
import dataclasses
import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from core.tasks import task_send_on_commit
from events.choices import EventKind, ObjectType
from events.services import event_record
from pools.choices import FailureKind, RepairRemedy
from pools.models import NodeType

from hosts import task_names
from hosts.choices import HostState, RepairOutcome
from hosts.engine.flow import Flow, Run, Step, StepFailed, Waiting, deadline_setting
from hosts.gate import cleaning
from hosts.lifecycle import ConcurrentTransition, HostsMoved, register_flow
from hosts.models import (
    BareMetalHost,
    EraseCertificate,
    HealthCheckRun,
    RepairAttempt,
    RepairCase,
)
from hosts.services import host_transition

from .steps import (
    CLEANING_STEPS,
    INTAKE_STEPS,
    RAMDISK_STEPS,
    TIER_STEPS,
    evidence_trimmed,
    run_gate,
    step_erase,
    step_power_off,
    step_verify_erase,
)

log = logging.getLogger(__name__)

ACTOR = "system:repair"
STEP = "repair_ladder"  # the step name of the ladder's own Events
# Gate steps that run after a verified erase: a failure there leaves the disks erased and verified.
AFTER_ERASE = frozenset({"gpu_reset", "gpu_state", "health_dcgm", "health_nccl"})
# States in which a host's repair case stays open (it is being repaired, retested or waits).
IN_REPAIR = frozenset({HostState.REPAIR, HostState.REPAIRING, HostState.RETESTING})


# --- what failed ---------------------------------------------------------------------------------------

def _failed_gpus(run: HealthCheckRun | None) -> list[str]:
    gpus = run.gpus if run is not None and isinstance(run.gpus, dict) else {}
    return sorted((g for g, d in gpus.items() if isinstance(d, dict) and d.get("status") == "fail" and g != "all"),
                  key=lambda g: (len(g), g))


def classify(*, step: str, message: str, data: dict | None) -> tuple[str, str]:
    """The kind of a failure (pools.choices.FailureKind) and where it is ("GPU 3", "nvme0n1"), from the data of
    the move into repair (hosts.flows.host.host_flow_fail: step, message, evidence with the health run or the
    certificates)."""
    data = data if isinstance(data, dict) else {}
    evidence = data.get("evidence") if isinstance(data.get("evidence"), dict) else {}
    step = step or data.get("step") or ""
    if step in TIER_STEPS:  # a health tier's check (hosts.flows.steps.tier_steps): judged as the gate's own
        step = {"dcgm": "health_dcgm", "burnin": "health_dcgm", "links": "health_nccl",
                "gpus": "sku_gpus"}[step.split("_", 1)[1]]
    text = f"{message} {data.get('message') or ''}".lower()
    if "deviations" in data or "deviations" in evidence or step.startswith("sku"):
        # hosts.flows.steps.step_sku_check: {NodeType: ["GPUs: 7 of 8 NVIDIA H200", ...]}; the first difference
        # names it.
        deviations = data.get("deviations") or evidence.get("deviations") or []
        if isinstance(deviations, dict):
            deviations = [item for items in deviations.values() if isinstance(items, list) for item in items]
        return FailureKind.SKU, (str(deviations[0])[:200] if isinstance(deviations, list) and deviations else "")
    run = None
    if isinstance(evidence.get("health_run"), int):
        run = HealthCheckRun.objects.filter(pk=evidence["health_run"]).only("gpus", "reasons").first()
    gpus = _failed_gpus(run)
    where = f"GPU {', '.join(gpus)}" if gpus else ""
    if step == "health_nccl":
        return FailureKind.NCCL_SLOW, ""
    if step in ("health_dcgm", "gpu_reset", "gpu_state"):
        reasons = " ".join(run.reasons if run is not None and isinstance(run.reasons, list) else []).lower()
        return (FailureKind.GPU_XID if "xid" in text or "xid" in reasons else FailureKind.GPU_HEALTH), where
    certs = [c for c in evidence.get("certificates") or [] if isinstance(c, int)]
    disks = list(EraseCertificate.objects.filter(pk__in=certs, result="fail").values_list("disk", flat=True))
    if step == "verify_erase":
        return FailureKind.ERASE, ", ".join(disks)
    if step == "erase":
        failed = [d.get("name") for d in evidence.get("disks") or [] if isinstance(d, dict) and d.get("error")]
        return FailureKind.DISK, ", ".join(str(d) for d in (failed or disks) if d)
    return FailureKind.UNKNOWN, ""


# --- the case: opened by a move into repair, closed by a move out of it -------------------------------------

def host_moved(moved: HostsMoved) -> None:
    """What a host's move means for its repair case (hosts.lifecycle.on_host_transition: inside the move's
    transaction, so the case and the move commit together)."""
    frm, to = moved.from_state, moved.to_state
    if HostState.HELD in (frm, to):
        return  # held after a restore and let go again (hosts/restore.py): the same stay in repair, if it was one
    if to == HostState.REPAIR and frm == HostState.REPAIRING:
        for host_id in moved.host_ids:
            _attempt_end(host_id, RepairOutcome.FAILED, moved)
            task_send_on_commit(task_names.REPAIR_ADVANCE, host_id=host_id)
    elif to == HostState.REPAIR and frm == HostState.RETESTING:
        for host_id in moved.host_ids:  # a person's retest: its verdict is theirs to act on
            _case_to_person(host_id, moved)
    elif to == HostState.REPAIR:
        for host_id in moved.host_ids:
            _case_open(host_id, moved)
    elif frm == HostState.REPAIRING and to == HostState.AVAILABLE:
        for host_id in moved.host_ids:
            attempt = _attempt_end(host_id, RepairOutcome.PASSED, moved)
            _case_close(host_id, RepairOutcome.REPAIRED, moved, attempt=attempt)
    elif frm in IN_REPAIR and to not in IN_REPAIR:
        outcome = {HostState.AVAILABLE: RepairOutcome.RETURNED, HostState.RETIRED: RepairOutcome.RETIRED}.get(
            to, RepairOutcome.WITHDRAWN)
        for host_id in moved.host_ids:
            if frm == HostState.REPAIRING:
                _attempt_end(host_id, RepairOutcome.ABORTED, moved)
            _case_close(host_id, outcome, moved)
    elif frm == HostState.REPAIR and to == HostState.RETESTING:
        for host_id in moved.host_ids:
            _case_to_person(host_id, moved)


def _open_case(host_id: int) -> RepairCase | None:
    return RepairCase.objects.select_for_update().filter(host_id=host_id, closed_at__isnull=True).first()


def _case_open(host_id: int, moved: HostsMoved) -> None:
    if _open_case(host_id) is not None:
        return  # still the same stay in repair (an admin's move back, say)
    host = BareMetalHost.objects.get(pk=host_id)
    data = moved.data or {}
    kind, detail = classify(step=data.get("step") or "", message=moved.reason, data=data)
    node_type = cleaning.node_type_for(host)
    ladder = node_type.repair_ladder(kind) if node_type is not None else _default_ladder(kind)
    automatic = settings.REPAIR_LADDER and moved.actor.startswith("system:")
    case = RepairCase.objects.create(
        host=host, host_name=host.name, node_type=node_type.name if node_type else "", kind=kind, detail=detail,
        failure_step=data.get("step") or "", failure=moved.reason[:4000],
        evidence=evidence_trimmed(data.get("evidence") or {}),
        ladder=ladder if automatic else [], opened_at=timezone.now())
    if not automatic:
        why = ("the repair ladder is off (REPAIR_LADDER)" if not settings.REPAIR_LADDER
               else f"set aside by {moved.actor}")
        _case_wait(case, host, why)
        return
    task_send_on_commit(task_names.REPAIR_ADVANCE, host_id=host_id)


def _default_ladder(kind: str) -> list[str]:
    return NodeType(repair={}).repair_ladder(kind)


def _case_close(host_id: int, outcome: str, moved: HostsMoved, attempt: RepairAttempt | None = None) -> None:
    case = _open_case(host_id)
    if case is None:
        return
    case.outcome, case.closed_at, case.closed_by = outcome, timezone.now(), moved.actor
    if outcome == RepairOutcome.REPAIRED and attempt is not None:
        case.summary = f"{case.what}: {_tried(case)}; repaired by {attempt.step}"
    elif not case.summary:
        case.summary = f"{case.what}: {_tried(case) or 'no remedy tried'}; {RepairOutcome(outcome).label.lower()}"
    case.save(update_fields=["outcome", "closed_at", "closed_by", "summary"])


def _case_to_person(host_id: int, moved: HostsMoved) -> None:
    """A person retests the host: the ladder stops there (it starts no rung of its own any more)."""
    case = _open_case(host_id)
    if case is not None and case.outcome == RepairOutcome.RUNNING:
        case.outcome = RepairOutcome.WAITING
        case.summary = f"{case.what}: {_tried(case) or 'no remedy tried'}; taken over by {moved.actor}"
        case.save(update_fields=["outcome", "summary"])


def _tried(case: RepairCase) -> str:
    attempts = list(case.attempts.order_by("position").values_list("step", "outcome"))
    return ("tried " + ", ".join(f"{step} ({outcome})" for step, outcome in attempts)) if attempts else ""


def _case_wait(case: RepairCase, host: BareMetalHost, why: str) -> None:
    """The ladder is over (or never started): the host waits for a person, with the summary in the Event log."""
    tried = _tried(case)
    case.outcome = RepairOutcome.WAITING
    case.summary = f"{case.what}: {tried or why}; waiting for a person"
    case.save(update_fields=["outcome", "summary"])
    if not settings.REPAIR_LADDER:
        return  # the repair pool as it was: the move into repair says it all
    event_record(kind=EventKind.ACTION, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
                 step=STEP, actor=ACTOR, message=case.summary,
                 data={"repair_case": case.pk, "kind": case.kind, "detail": case.detail, "ladder": case.ladder,
                       "position": case.position, "outcome": RepairOutcome.WAITING,
                       **({"why": why} if not tried else {})})


def _attempt_end(host_id: int, outcome: str, moved: HostsMoved) -> RepairAttempt | None:
    attempt = (RepairAttempt.objects.select_for_update().filter(host_id=host_id, outcome=RepairOutcome.RUNNING)
               .order_by("-id").first())
    if attempt is None:
        return None
    data = moved.data or {}
    evidence = {"failure": evidence_trimmed(data.get("evidence") or {})} if data.get("evidence") else {}
    if attempt.flow_id:
        evidence["health_runs"] = [{"id": pk, "suite": suite, "verdict": verdict} for pk, suite, verdict in
                                   HealthCheckRun.objects.filter(flow_id=attempt.flow_id).order_by("pk")
                                   .values_list("pk", "suite", "verdict")]
        evidence["certificates"] = list(EraseCertificate.objects.filter(flow_id=attempt.flow_id).order_by("pk")
                                        .values_list("pk", flat=True))
    attempt.outcome, attempt.finished_at = outcome, timezone.now()
    attempt.message = moved.reason[:4000]
    attempt.failed_step = (data.get("step") or "") if outcome != RepairOutcome.PASSED else ""
    attempt.evidence = evidence
    attempt.save(update_fields=["outcome", "finished_at", "message", "failed_step", "evidence"])
    return attempt


# --- the next rung -------------------------------------------------------------------------------------------

def host_repair_advance(*, host_id: int) -> str:
    """Start the next rung of the host's ladder, or, when none is left, let it wait for a person with the
    summary. Idempotent (the task may come twice): only a host in repair whose case the ladder still drives, and
    no attempt under way, moves; under the host's row lock. Returns what it did, in words."""
    with transaction.atomic():
        host = BareMetalHost.objects.select_for_update(of=("self",)).filter(pk=host_id).first()
        if host is None or host.state != HostState.REPAIR:
            return "not in repair"
        case = _open_case(host_id)
        if case is None or case.outcome != RepairOutcome.RUNNING:
            return "no ladder to climb"
        if case.attempts.filter(outcome=RepairOutcome.RUNNING).exists():
            return "a remedy is under way"
        if case.position >= len(case.ladder):
            _case_wait(case, host, "no automatic remedy for this kind of failure")
            return "waiting for a person"
        remedy = case.ladder[case.position]
        case.position += 1
        case.save(update_fields=["position"])
        attempt = RepairAttempt.objects.create(case=case, host=host, host_name=host.name, kind=case.kind,
                                               position=case.position, step=remedy, started_at=timezone.now())
        words = RepairRemedy(remedy).label if remedy in RepairRemedy.values else remedy
        try:
            host_transition(host=host, to_state=HostState.REPAIRING, actor=ACTOR, step=STEP,
                            reason=f"repair ladder {case.position}/{len(case.ladder)} for {case.what}: {words}",
                            data={"repair_case": case.pk, "attempt": attempt.pk, "remedy": remedy,
                                  "position": case.position, "of": len(case.ladder), "kind": case.kind})
        except ConcurrentTransition:
            transaction.set_rollback(True)
            return "moved meanwhile"
    return f"started {remedy}"


def hosts_repair_due() -> list[int]:
    """The periodic catch-up: hosts in repair whose case the ladder still drives and that no rung holds (a lost
    task, a broker away when the move committed)."""
    ids = list(RepairCase.objects.filter(closed_at__isnull=True, outcome=RepairOutcome.RUNNING,
                                         host__state=HostState.REPAIR).values_list("host_id", flat=True)[:500])
    for host_id in ids:
        host_repair_advance(host_id=host_id)
    return ids


# --- the repair flow: the remedy, then the checks again ------------------------------------------------------

def _remedy(run: Run) -> dict:
    """This run's rung ({"remedy", "attempt", "erase"}), read once from its RepairAttempt and kept on the flow."""
    found = run.data.get("remedy")
    if found is None:
        attempt = (RepairAttempt.objects.select_related("case")
                   .filter(host=run.host, outcome=RepairOutcome.RUNNING).order_by("-id").first())
        if attempt is None:
            raise StepFailed("no repair attempt under way for this host")
        RepairAttempt.objects.filter(pk=attempt.pk).update(flow_id=run.flow["id"])
        # The erase runs again unless the failed run had verified it (a GPU check failed after it) and the remedy
        # does not erase: a host never returns to the pool without a verified erase since its last tenant.
        erase = attempt.step in (RepairRemedy.RETEST, RepairRemedy.REIMAGE) or \
            attempt.case.failure_step not in AFTER_ERASE
        found = {"remedy": attempt.step, "attempt": attempt.pk, "case": attempt.case_id, "erase": erase}
        run.data["remedy"] = found
        run.save_flow()
    return found


def step_repair_begin(run: Run) -> dict:
    return dict(_remedy(run))


def step_cold_off(run: Run) -> dict:
    """power-cycle: the host stays off REPAIR_COLD_OFF_S (a cold cycle drains the GPUs, NVLink switches and
    NICs, which a warm reboot does not); other remedies go on at once."""
    if _remedy(run)["remedy"] != RepairRemedy.POWER_CYCLE:
        return {"skipped": "not a power cycle"}
    off_at = parse_datetime((run.flow["done"].get("power_off") or {}).get("at") or "") or run.step_started_at()
    held = (timezone.now() - off_at).total_seconds()
    if held < settings.REPAIR_COLD_OFF_S:
        raise Waiting("held off", recheck_s=settings.REPAIR_COLD_OFF_S - held)
    return {"held_off_s": round(held, 1)}


def _erase_skipped(run: Run) -> dict | None:
    if not _remedy(run)["erase"]:
        return {"skipped": "the failed run's erase was verified; this remedy does not erase"}
    if _remedy(run)["remedy"] == RepairRemedy.REIMAGE:
        gate = run_gate(run)
        if gate["policy"].get("source") != "repair: reimage":
            # A re-image: every block overwritten and every byte read back, whatever the NodeType's policy says.
            gate["policy"].update(method="full", fallback="", verify_mode="full", source="repair: reimage")
            run.save_flow()
    return None


def step_repair_erase(run: Run) -> dict:
    return _erase_skipped(run) or step_erase(run)


def step_repair_verify_erase(run: Run) -> dict:
    return _erase_skipped(run) or step_verify_erase(run)


def repair_finish(run: Run) -> None:
    """The checks after the remedy passed: back to the pool, the case repaired (host_moved)."""
    remedy = run.data.get("remedy") or {}
    try:
        host_transition(host=run.host, to_state=HostState.AVAILABLE, actor=ACTOR, step=STEP,
                        reason=f"repaired by {remedy.get('remedy')}: the checks passed",
                        data={"repair_case": remedy.get("case"), "attempt": remedy.get("attempt"),
                              "remedy": remedy.get("remedy"), "flow": "repair", "flow_id": run.flow["id"]})
    except ConcurrentTransition:
        return


def repair_fail(run: Run, step: Step, failure: StepFailed) -> None:
    """The remedy or the checks after it failed, wherever: back to repair with the evidence; the next rung next."""
    remedy = run.data.get("remedy") or {}
    reason = f"repair {remedy.get('remedy', '')} failed at {step.name}: {failure.message}"
    try:
        host_transition(host=run.host, to_state=HostState.REPAIR, actor="system:flow", step=step.name, reason=reason,
                        data={"flow": "repair", "flow_id": run.flow["id"], "step": step.name,
                              "message": failure.message, "repair_case": remedy.get("case"),
                              "attempt": remedy.get("attempt"), "remedy": remedy.get("remedy"),
                              "evidence": evidence_trimmed(failure.evidence)})
    except ConcurrentTransition:
        return


# The release gate's steps, the erase and its verification as the remedy asks (_erase_skipped).
REPAIR_RUNS = {"erase": step_repair_erase, "verify_erase": step_repair_verify_erase}
REPAIR_STEPS = [
    Step("repair_begin", step_repair_begin, deadline_setting("POWER_STEP_DEADLINE_S")),
    Step("power_off", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
    Step("cold_off", step_cold_off, lambda: settings.REPAIR_COLD_OFF_S + settings.POWER_STEP_DEADLINE_S),
    *RAMDISK_STEPS,  # inspected again: the hardware may have changed (a missing GPU or disk back, or still gone)
    *[dataclasses.replace(step, run=REPAIR_RUNS.get(step.name, step.run)) for step in CLEANING_STEPS],
    *INTAKE_STEPS,  # after repair, the intake tier again (when the NodeType declares it)
    Step("power_off_after_clean", step_power_off, deadline_setting("POWER_STEP_DEADLINE_S")),
]
register_flow(Flow(name="repair", state=HostState.REPAIRING, steps=REPAIR_STEPS, finish=repair_finish, fail=repair_fail,
                   gate=True))
