"""Reads of hosts: the failure record from the Event log (who failed, how often, with which image), the hosts
that need attention, and what each user may see."""
from datetime import timedelta

from django.conf import settings
from django.db.models import BooleanField, Case, IntegerField, OuterRef, Q, QuerySet, Subquery, Value, When
from django.utils import timezone

from core import scoping
from events.choices import EventKind, ObjectType
from events.models import Event
from pools.models import Tenant
from pools.selectors import sku_deviations_of

from .choices import HostState
from .lifecycle import STATE_FAILURE
from .models import BareMetalHost, EraseCertificate, HealthCheckRun


def _failures(since=None):
    """Transitions out of provisioning that hosts.flows.fail attributed (data: fault, step, message, evidence)."""
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
FIX_OVERDUE = ("", "", "nothing drove it past its deadline: check that the workers and the scheduler (beat) run; "
                       "the sweeper then moves it to {failure} with the reason")


def hosts_needing_attention(qs: QuerySet | None = None, *, now=None) -> QuerySet:
    """One list for the fleet board and the repair page: hosts in error, in repair, and any host past its state's
    deadline (a flow nobody drives). Each row carries `overdue` and `reason_event_id`, the Event of its move into
    its state; `attention_explain` reads those Events (one query) and adds the reason and the action that fixes
    it. Errors first, then overdue hosts, then repair; newest first within each."""
    qs = BareMetalHost.objects.all() if qs is None else qs
    now = now or timezone.now()
    overdue = Q(deadline_at__lt=now)
    last = Event.objects.filter(host_id=OuterRef("pk"), to_state=OuterRef("state")).order_by("-pk")
    return (qs.filter(Q(state__in=[HostState.ERROR, HostState.REPAIR]) | overdue)
            .annotate(overdue=Case(When(overdue, then=Value(True)), default=Value(False), output_field=BooleanField()),
                      attention_rank=Case(When(state=HostState.ERROR, then=Value(0)), When(overdue, then=Value(1)),
                                          default=Value(2), output_field=IntegerField()),
                      reason_event_id=Subquery(last.values("pk")[:1]))
            .order_by("attention_rank", "-state_changed_at", "pk"))


def attention_explain(hosts: list[BareMetalHost]) -> list[BareMetalHost]:
    """For hosts read with hosts_needing_attention: set each one's `reason`, `reason_actor`, `reason_step` and
    `reason_data` (its move into its state, from the Event log), its `why` (the reason in words) and `fix`
    ({"action", "label", "hint"})."""
    ids = [h.reason_event_id for h in hosts if h.reason_event_id]
    moves = {e.pk: e for e in Event.objects.filter(pk__in=ids).only("message", "actor", "step", "data")} if ids else {}
    for host in hosts:
        move = moves.get(host.reason_event_id)
        host.reason = move.message if move else None
        host.reason_actor = move.actor if move else None
        host.reason_step = move.step if move else None
        host.reason_data = move.data if move else None
        data = host.reason_data if isinstance(host.reason_data, dict) else {}
        if host.state == HostState.ERROR:
            action, label, hint = FIX_ERROR
            host.why = host.reason or host.error_message or "in error (no reason recorded)"
        elif host.state == HostState.REPAIR and data.get("retest") == "passed":
            action, label, hint = FIX_REPAIR_PASSED
            host.why = host.reason or "retest passed"
        elif host.state == HostState.REPAIR:
            action, label, hint = FIX_REPAIR
            host.why = host.reason or "in repair (no reason recorded)"
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


def host_sku_deviations(host: BareMetalHost, node_types=None) -> dict[str, list[str]]:
    """{NodeType: deviations} of the host's last inventory from the SKU of each NodeType that selects it
    (pools/sku.py); {} when it conforms or was never inspected. `node_types`: already read, for lists."""
    if not host.inventory:
        return {}
    return sku_deviations_of(host.inventory, host.labels, node_types)


def sku_deviations_text(deviations: dict[str, list[str]]) -> str:
    """One line for an error and a page: "gpu-server: GPUs: 7 of 8 NVIDIA H200; nvme0n1: 128 MiB < 256 MiB"."""
    return "; ".join(f"{name}: {'; '.join(items)}" for name, items in sorted(deviations.items()))
