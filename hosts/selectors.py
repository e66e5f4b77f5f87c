"""Reads of hosts: the failure record from the Event log (who failed, how often, with which image), the hosts
that need attention, and what each user may see."""
import json
from datetime import timedelta

from django.conf import settings
from django.db.models import (
    BooleanField,
    Case,
    IntegerField,
    JSONField,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import JSONObject
from django.utils import timezone

from core import scoping
from events.choices import EventKind, ObjectType
from events.models import Event
from pools.models import Tenant
from pools.choices import InspectionMode
from pools.selectors import node_types_selecting, sku_deviations_of

from .choices import HostState, RepairOutcome
from .gate.census import bmc_deviations, record_deviations
from .lifecycle import FREE, STATE_FAILURE
from .models import (
    BareMetalHost,
    EraseCertificate,
    HealthCheckRun,
    RepairAttempt,
    RepairCase,
)


def _failures(since=None):
    """Transitions out of provisioning that hosts.flows.host.host_flow_fail attributed (data: fault, step, message, evidence)."""
    cutoff = timezone.now() - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S)
    if since is not None and since > cutoff:
        cutoff = since
    return Event.objects.filter(kind=EventKind.TRANSITION, object_type=ObjectType.HOST,
                                from_state=HostState.PROVISIONING, created_at__gte=cutoff, data__has_key="fault")


def image_write_failures(*, name: str, url: str, checksum: str) -> dict[str, str]:
    """Hosts on which this image (this url and checksum) failed to write within the window and since it last
    wrote well anywhere (a write that works somewhere says the image is fine): {host: message}."""
    cutoff = timezone.now() - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S)
    # The step that writes it (claims.steps) records the image it wrote, and its failures the image they failed on.
    last_good = (Event.objects.filter(kind=EventKind.STEP, message="done", created_at__gte=cutoff,
                                      data__image=name, data__image_url=url, data__image_checksum=checksum)
                 .order_by("-id").values_list("created_at", flat=True).first())
    events = _failures(since=last_good).filter(data__evidence__image=name,
                                               data__evidence__image_url=url,
                                               data__evidence__image_checksum=checksum).order_by("id")
    return {e.object_name: e.data.get("message", "") for e in events}


def host_recent_failures(*, host: BareMetalHost) -> list[Event]:
    """The host's own provisioning failures within the window, since it last went to repair. A failure that
    was the claim's (fault "claim"), or an image write whose image has since failed on IMAGE_FAILURE_HOSTS
    hosts, is not the host's and does not count."""
    last_repair = (Event.objects.filter(host_id=host.pk, kind=EventKind.TRANSITION, to_state=HostState.REPAIR)
                   .order_by("-id").values_list("created_at", flat=True).first())
    events = list(_failures(since=last_repair).filter(host_id=host.pk, data__fault="host").order_by("id"))
    verdicts = {}
    counted = []
    for event in events:
        evidence = event.data.get("evidence") or {}
        key = tuple(evidence.get(k) for k in ("image", "image_url", "image_checksum"))
        if all(key):  # a failure that names the image it wrote
            if key not in verdicts:
                failed = image_write_failures(name=key[0], url=key[1], checksum=key[2])
                verdicts[key] = len(failed) >= settings.IMAGE_FAILURE_HOSTS
            if verdicts[key]:
                continue
        counted.append(event)
    return counted


# --- hosts that need attention ----------------------------------------------------------------------

# The action that fixes a host, by why it needs attention: (action slug of hosts.views.ACTIONS or "", label, hint).
FIX_ERROR = ("retry", "Retry", "register, inspect and clean it again")
FIX_REPAIR = ("retest", "Retest", "clean and check it again; only a passing retest returns it to service")
FIX_REPAIR_PASSED = ("return-to-service", "Return to service", "it passed its retest")
FIX_LADDER = ("", "", ("the repair ladder is on it: it returns the host to service when the checks pass after a "
                       "remedy, or says what it tried and waits for a person"))
FIX_BMC = ("edit", "Edit", "check the BMC address and credentials: edit")
FIX_PREFLIGHT = ("preflight", "Run preflight", "fix what its preflight names (edit the host if it is its BMC address "
                                               "or credentials), then run preflight again")
FIX_OVERDUE = ("", "", "nothing drove it past its deadline: check that the workers and the scheduler (beat) run; "
                       "the sweeper then moves it to {failure} with the reason")


def hosts_needing_attention(qs: QuerySet | None = None, *, now=None) -> QuerySet:
    """One list for the fleet board and the repair page: hosts in error, in repair, and any host past its state's
    deadline (a flow nobody drives). Each row carries `overdue` and `reason_event_id`, the Event of its move into
    its state; `attention_explain` reads those Events (one query) and adds the reason and the action that fixes
    it. Errors first, then overdue hosts, then repair (and the repair ladder's hosts); newest first within each."""
    qs = BareMetalHost.objects.all() if qs is None else qs
    now = now or timezone.now()
    overdue = Q(deadline_at__lt=now)
    last = Event.objects.filter(host_id=OuterRef("pk"), to_state=OuterRef("state")).order_by("-pk")
    # A free host that cannot be allocated (hosts.capacity: "Held back") needs someone too.
    held_back = Q(state__in=list(FREE)) & (Q(bmc_ok=False) | Q(preflight_ok=False))
    return (qs.filter(Q(state__in=[HostState.ERROR, HostState.REPAIR, HostState.REPAIRING]) | overdue | held_back)
            .annotate(overdue=Case(When(overdue, then=Value(True)), default=Value(False), output_field=BooleanField()),
                      attention_rank=Case(When(state=HostState.ERROR, then=Value(0)), When(overdue, then=Value(1)),
                                          default=Value(2), output_field=IntegerField()),
                      reason_event_id=Subquery(last.values("pk")[:1]), repair_case=_open_case_json())
            .order_by("attention_rank", "-state_changed_at", "pk"))


def attention_explain(hosts: list[BareMetalHost]) -> list[BareMetalHost]:
    """For hosts read with hosts_needing_attention: set each one's `reason`, `reason_actor`, `reason_step` and
    `reason_data` (its move into its state, from the Event log), its `why` (the reason in words) and `fix`
    ({"action", "label", "hint"})."""
    ids = [h.reason_event_id for h in hosts if h.reason_event_id]
    moves = {e.pk: e for e in Event.objects.filter(pk__in=ids).only("message", "actor", "step", "data")} if ids else {}
    for host in hosts:
        case = getattr(host, "repair_case", None)
        case = json.loads(case) if isinstance(case, str) else case  # SQLite hands the JSON over as text
        host.repair_case = case if isinstance(case, dict) and case.get("kind") else None
        if host.repair_case is not None:
            case = host.repair_case
            case["what"] = f"{case['kind']} on {case['detail']}" if case.get("detail") else case["kind"]
            if isinstance(case.get("ladder"), str):  # SQLite nests a JSON column inside JSONObject as text too
                case["ladder"] = json.loads(case["ladder"])
            host.repair_position = repair_position(ladder=case.get("ladder") or [],
                                                   position=case.get("position") or 0,
                                                   outcome=case.get("outcome") or "", state=host.state)
        move = moves.get(host.reason_event_id)
        host.reason = move.message if move else None
        host.reason_actor = move.actor if move else None
        host.reason_step = move.step if move else None
        host.reason_data = move.data if move else None
        data = host.reason_data if isinstance(host.reason_data, dict) else {}
        if host.state == HostState.ERROR:
            # A retry cannot fix a BMC that does not answer (a wrong address or credentials): an edit can.
            action, label, hint = FIX_BMC if host.bmc_ok is False else FIX_ERROR
            host.why = host.reason or host.error_message or "in error (no reason recorded)"
        elif host.state == HostState.REPAIR and data.get("retest") == "passed":
            action, label, hint = FIX_REPAIR_PASSED
            host.why = host.reason or "retest passed"
        elif host.state == HostState.REPAIR:
            action, label, hint = FIX_REPAIR
            # The repair ladder's summary (what failed, what it tried) once it has nothing left to try. Between two
            # rungs the retest is offered too: a person's retest takes the host from the ladder.
            case = host.repair_case or {}
            summary = case.get("summary") if case.get("outcome") == RepairOutcome.WAITING else ""
            host.why = summary or host.reason or "in repair (no reason recorded)"
        elif host.state == HostState.REPAIRING and not host.overdue:
            action, label, hint = FIX_LADDER
            host.why = host.reason or "repair ladder under way"
        elif host.state in FREE and not host.overdue and host.bmc_ok is False:
            action, label, hint = FIX_BMC
            host.why = f"held back: its BMC does not answer ({host.bmc_error or 'no answer'})"
        elif host.state in FREE and not host.overdue and host.preflight_ok is False:
            action, label, hint = FIX_PREFLIGHT
            host.why = f"held back: its preflight is red ({host.preflight_reason or 'no reason recorded'})"
        else:
            action, label, hint = FIX_OVERDUE
            hint = hint.format(failure=STATE_FAILURE.get(host.state, HostState.ERROR))
            host.why = f"{host.state} past its deadline ({host.deadline_at:%Y-%m-%d %H:%M:%S} UTC)"
        host.fix = {"action": action, "label": label, "hint": hint}
    return hosts


# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def hosts_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see only the hosts that serve their claims now."""
    qs = BareMetalHost.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(claim__tenant_id__in=ids)


def _erases_of(ids: list[int]) -> Q:
    """The erases of these tenants' data: the previous tenant, by name, as the signed document names it."""
    return Q(previous_tenant__in=Tenant.objects.filter(pk__in=ids).values("name"))


def erase_certificates_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see the certificates of the erases of their own tenants' data: the proof they are owed, whichever
    host it was and whoever uses it now."""
    qs = EraseCertificate.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(_erases_of(ids))


def health_runs_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see the health runs of the release gates whose certificates they see (the same flow run: how the
    host was checked after their use), never those of other tenants' releases or of registrations."""
    qs = HealthCheckRun.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    if ids is None:
        return qs
    return qs.filter(flow_id__in=EraseCertificate.objects.filter(_erases_of(ids)).values("flow_id"))


# --- the repair ladder: where each host stands, its history, and the fleet's figures -------------------------

def repair_cases_open(host_ids: list[int]) -> dict[int, RepairCase]:
    """The open repair case of each of these hosts, with the host (one query, and one for their attempts)."""
    if not host_ids:
        return {}
    cases = (RepairCase.objects.filter(host_id__in=host_ids, closed_at__isnull=True).select_related("host")
             .prefetch_related(Prefetch("attempts", queryset=RepairAttempt.objects.order_by("position"))))
    return {c.host_id: c for c in cases}


def repair_position(*, ladder: list, position: int, outcome: str, state: str) -> str:
    """Where a case stands on its ladder, in words, from the case and its host's state alone (no query): which
    rung runs now and what comes next. "rung 2 of 3 running: power-cycle; next if it fails: retest",
    "rung 1 of 3 failed: gpu-reset; next: rung 2, power-cycle", "all 3 rungs tried (…): waiting for a person"."""
    ladder = ladder if isinstance(ladder, list) else []
    rungs = len(ladder)
    position = min(max(int(position or 0), 0), rungs)
    if not ladder:
        return "no automatic remedy for this failure: waiting for a person"
    if outcome == RepairOutcome.WAITING:
        if position >= rungs:
            return f"all {rungs} rung{'s' if rungs != 1 else ''} tried ({', '.join(ladder)}): waiting for a person"
        return f"{position} of {rungs} rungs tried, then taken over by a person: waiting for a person"
    if position == 0:
        return f"next: rung 1 of {rungs}, {ladder[0]}"
    current = ladder[position - 1]
    after = f"rung {position + 1}, {ladder[position]}" if position < rungs else "a person (the last rung)"
    if state == HostState.REPAIRING:
        return f"rung {position} of {rungs} running: {current}; next if it fails: {after}"
    return f"rung {position} of {rungs} failed: {current}; next: {after}"


def _open_case_json() -> Subquery:
    """The host's open repair case as one JSON value, for a list of hosts (a subquery per row shown, no join)."""
    return Subquery(RepairCase.objects.filter(host_id=OuterRef("pk"), closed_at__isnull=True).values(
        json=JSONObject(kind="kind", detail="detail", outcome="outcome", summary="summary", position="position",
                        ladder="ladder"))[:1], output_field=JSONField())


def repair_history(host: BareMetalHost, *, limit: int = 10) -> list[RepairCase]:
    """The host's latest repair cases, newest first, each with its attempts in order (two queries)."""
    cases = list(RepairCase.objects.filter(host=host).order_by("-opened_at", "-id")
                 .prefetch_related(Prefetch("attempts", queryset=RepairAttempt.objects.order_by("position")))[:limit])
    for case in cases:  # the open one says which rung runs now and what comes next
        case.position_text = ("" if case.closed_at else
                              repair_position(ladder=case.ladder, position=case.position, outcome=case.outcome,
                                              state=host.state))
    return cases


FINISHED = (RepairOutcome.REPAIRED, RepairOutcome.RETURNED, RepairOutcome.WAITING, RepairOutcome.RETIRED)
BACK_IN_SERVICE = (RepairOutcome.REPAIRED, RepairOutcome.RETURNED)


def _figures(name: str, rows: list[tuple]) -> dict:
    """rows: (outcome, opened_at, closed_at) of one group's cases."""
    count = {o: 0 for o in RepairOutcome.values}
    durations = []
    for outcome, opened_at, closed_at in rows:
        count[outcome] = count.get(outcome, 0) + 1
        if outcome in BACK_IN_SERVICE and closed_at is not None:
            durations.append((closed_at - opened_at).total_seconds())
    finished = sum(count[o] for o in FINISHED)
    return {"name": name, "cases": len(rows), "running": count[RepairOutcome.RUNNING],
            "repaired": count[RepairOutcome.REPAIRED], "returned": count[RepairOutcome.RETURNED],
            "waiting": count[RepairOutcome.WAITING], "retired": count[RepairOutcome.RETIRED],
            "finished": finished,
            # The share of the cases whose ladder is over that it repaired without a person.
            "repair_rate": round(count[RepairOutcome.REPAIRED] / finished, 4) if finished else None,
            # Mean time from the failure to the return to service (automatic or by a person).
            "mttr_s": round(sum(durations) / len(durations), 1) if durations else None}


def repair_stats(*, days: float = 30, node_type: str = "", kind: str = "", now=None) -> dict:
    """Mean time to repair and repair rate over the repair cases opened within the last `days` days, for the
    fleet, per NodeType and per failure kind (optionally only one NodeType or kind). Computed from the
    RepairCase rows (one query)."""
    now = now or timezone.now()
    qs = RepairCase.objects.filter(opened_at__gte=now - timedelta(days=days))
    if node_type:
        qs = qs.filter(node_type=node_type)
    if kind:
        qs = qs.filter(kind=kind)
    rows = list(qs.values_list("node_type", "kind", "outcome", "opened_at", "closed_at"))
    by_type: dict[str, list] = {}
    by_kind: dict[str, list] = {}
    for type_name, kind_name, *rest in rows:
        by_type.setdefault(type_name or "(none)", []).append(rest)
        by_kind.setdefault(kind_name, []).append(rest)
    return {"window_days": days, "node_type": node_type, "kind": kind,
            "fleet": _figures("fleet", [r[2:] for r in rows]),
            "by_node_type": [_figures(n, r) for n, r in sorted(by_type.items())],
            "by_kind": [_figures(n, r) for n, r in sorted(by_kind.items())]}


RECORD = "inventory of record"  # the key of the disk record's deviations beside the NodeTypes' own
BMC_DRIVES = "BMC's drives"  # the key of the BMC's drive census's deviations from the agent's inventory


def host_sku_deviations(host: BareMetalHost, node_types=None) -> dict[str, list[str]]:
    """{NodeType: deviations} of the host's last inventory from the SKU of each NodeType that selects it
    (pools/sku.py), under RECORD its disks that are not the inventory of record's (hosts/gate/census.py: the
    release gate's census rests on the record until an admin accepts the disks found), and under BMC_DRIVES the
    drives its BMC lists that the agent's inventory does not (census.bmc_deviations); {} when it conforms or
    was never inspected. `node_types`: already read, for lists."""
    if not host.inventory:
        return {}
    out = sku_deviations_of(host.inventory, host.labels, node_types)
    disks, bmc = record_deviations(host), bmc_deviations(host)
    return {**out, **({RECORD: disks} if disks else {}), **({BMC_DRIVES: bmc} if bmc else {})}


def sku_deviations_text(deviations: dict[str, list[str]]) -> str:
    """One line for an error and a page: "gpu-server: GPUs: 7 of 8 NVIDIA H200; nvme0n1: 128 MiB < 256 MiB"."""
    return "; ".join(f"{name}: {'; '.join(items)}" for name, items in sorted(deviations.items()))


def host_inspection_mode(host: BareMetalHost, node_types=None) -> tuple[str, str]:
    """(mode, where it comes from) of the host's inspection (pools.choices.InspectionMode): its own, else that of
    the NodeTypes selecting it when they agree, else agent (the thorough one, also where they disagree)."""
    if host.inspection_mode:
        return host.inspection_mode, "the host"
    types = node_types if node_types is not None else node_types_selecting(host.labels)
    modes = {t.name: t.inspection_mode for t in types if t.inspection_mode}
    if len(set(modes.values())) == 1:
        return next(iter(modes.values())), f"NodeType {', '.join(sorted(modes))}"
    if modes:
        return InspectionMode.AGENT, f"the default: its NodeTypes disagree ({', '.join(sorted(modes))})"
    return InspectionMode.AGENT, "the default"
