"""/metrics: the console's state and history in Prometheus' text format, read from the database (and the broker and
Redis) at scrape time, so that any web process answers for the whole console, whichever process did the work."""
# Why a collector that reads the database, not counters kept in the processes: the work happens in workers, beat,
# listeners and watchers, on several machines. prometheus-client's multiprocess mode adds up the processes of one
# machine only (files in one folder), and forgets a dead process's counts. What is counted here is already written
# down: the hosts' and claims' rows for the gauges, and the append-only Event log, erase certificates and health
# runs for the counters, which therefore never go back when a process restarts. The one figure no row records, the
# BMC requests, is counted in Redis by every process (core/counters.py).
#
# Cost: a handful of aggregate queries per scrape, none per host or claim (tests/test_metrics.py counts them). The
# counters over the Event log are kept per process: a settled prefix of the log (rows old enough that nothing adds
# to them any more) is added up once and extended at each scrape, so a scrape reads only the newest events.
import threading
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import Case, Count, F, Func, IntegerField, Max, Min, Q, Sum, TextField, Value, When
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast, Coalesce
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from rest_framework.permissions import BasePermission
from rest_framework.views import APIView

from autonodes.choices import DecisionReason
from claims.models import NodeClaim
from core import counters, scoping
from events.choices import EventKind, ObjectType
from events.models import Event
from hosts.models import AgentSession, BareMetalHost, EraseCertificate, HealthCheckRun, RamdiskBoot
from pools.matching import label_selector_q
from pools.models import NodeType
from vmetal_console.queues import KINDS, queue_name

# Step durations run from under a second (the lab) to hours (an erase, a burn-in).
STEP_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200)
# An event this old is settled: nothing counts into it any more (a security event's repeats are counted into its
# row for SECURITY_EVENT_WINDOW_S) and its transaction has long committed.
SETTLE_MARGIN_S = 120
BROKER_TIMEOUT_S = 2


class _JSONArrayLength(Func):
    output_field = IntegerField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="jsonb_array_length", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, function="json_array_length", **extra)


def _kind_only(kind: str, expression):
    """A grouping column that only events of one kind have: the others' would only multiply the groups."""
    return Case(When(kind=kind, then=expression), default=Value(""), output_field=TextField())


# --- the counters over the Event log ------------------------------------------------------------------------

@dataclass
class _Tally:
    steps: dict = field(default_factory=dict)  # (flow, step) → [count, sum_s, bucket counts...]
    security: dict = field(default_factory=dict)  # (reason, attention) → events, repeats included
    decisions: dict = field(default_factory=dict)  # reason → decisions
    launches: dict = field(default_factory=dict)  # (tenant id, pool) → claims launched

    def add(self, other: "_Tally") -> "_Tally":
        total = _Tally({k: list(v) for k, v in self.steps.items()}, dict(self.security), dict(self.decisions),
                       dict(self.launches))
        for key, row in other.steps.items():
            mine = total.steps.setdefault(key, [0] * len(row))
            total.steps[key] = [a + b for a, b in zip(mine, row)]
        for name in ("security", "decisions", "launches"):
            into = getattr(total, name)
            for key, n in getattr(other, name).items():
                into[key] = into.get(key, 0) + n
        return total


_COUNTED = (Q(kind=EventKind.STEP, message="done", duration_s__isnull=False) | Q(kind=EventKind.SECURITY)
            | (Q(kind=EventKind.DECISION) & ~Q(object_type=ObjectType.CLAIM)))  # a slow launch writes both


def _text(key: str, default: str = ""):
    return Coalesce(KeyTextTransform(key, "data"), Value(default), output_field=TextField())


def _tally(events) -> _Tally:
    """One grouped query over `events` (a range of the Event log)."""
    buckets = {f"le{i}": Count("pk", filter=Q(duration_s__lte=b)) for i, b in enumerate(STEP_BUCKETS_S)}
    rows = (events.filter(_COUNTED)
            .values("kind")
            .annotate(flow=_kind_only(EventKind.STEP, _text("flow")),
                      step_name=_kind_only(EventKind.STEP, F("step")),
                      reason=Case(When(kind__in=[EventKind.SECURITY, EventKind.DECISION], then=_text("reason")),
                                  default=Value(""), output_field=TextField()),
                      attention=_kind_only(EventKind.SECURITY, _text("attention", "true")),
                      pool=_kind_only(EventKind.DECISION, _text("pool")),
                      tenant=Case(When(kind=EventKind.DECISION, then=F("tenant_id")), default=None,
                                  output_field=IntegerField()))
            .values("kind", "flow", "step_name", "reason", "attention", "pool", "tenant")
            .annotate(n=Count("pk"), seconds=Sum("duration_s"),
                      repeats=Sum(Coalesce(Cast(KeyTextTransform("count", "data"), IntegerField()), Value(1))),
                      claims=Sum(_JSONArrayLength(KeyTransform("claims", "data"))), **buckets)
            .order_by())
    tally = _Tally()
    for row in rows:
        if row["kind"] == EventKind.STEP:
            tally.steps[(row["flow"], row["step_name"])] = [
                row["n"], row["seconds"] or 0.0, *(row[f"le{i}"] for i in range(len(STEP_BUCKETS_S)))]
        elif row["kind"] == EventKind.SECURITY:
            key = (row["reason"], "false" if row["attention"] in ("false", "False", "0") else "true")
            tally.security[key] = tally.security.get(key, 0) + row["repeats"]
        else:
            tally.decisions[row["reason"]] = tally.decisions.get(row["reason"], 0) + row["n"]
            if row["reason"] == DecisionReason.LAUNCHED and row["claims"]:
                key = (row["tenant"], row["pool"])
                tally.launches[key] = tally.launches.get(key, 0) + row["claims"]
    return tally


class _EventCounters:
    """The settled prefix of the Event log, added up (this process's), and its last id."""

    def __init__(self):
        self.lock = threading.Lock()
        self.settled_to = 0
        self.settled = _Tally()

    def read(self) -> _Tally:
        with self.lock:
            cutoff = timezone.now() - timedelta(seconds=settings.SECURITY_EVENT_WINDOW_S + SETTLE_MARGIN_S)
            if (Event.objects.aggregate(top=Max("pk"))["top"] or 0) < self.settled_to:
                self.settled_to, self.settled = 0, _Tally()  # a database restored from before: count it anew
            newer = Event.objects.filter(pk__gt=self.settled_to)
            ends = newer.filter(_COUNTED).aggregate(unsettled=Min("pk", filter=Q(created_at__gte=cutoff)),
                                                    last=Max("pk"))
            # Settle up to the first event that is not settled yet: ids are handed out in order, so what lies
            # before it is final.
            upto = ends["unsettled"] - 1 if ends["unsettled"] else ends["last"]
            if upto and upto > self.settled_to:
                self.settled = self.settled.add(_tally(newer.filter(pk__lte=upto)))
                self.settled_to = upto
            return self.settled.add(_tally(Event.objects.filter(pk__gt=self.settled_to)))


event_counters = _EventCounters()


# --- the collector -------------------------------------------------------------------------------------------

def _hosts() -> list:
    types = list(NodeType.objects.order_by("name").values_list("name", "host_selector"))
    # A host counts under the first NodeType (by name) whose selector takes it, "" under none: each host once.
    # An empty selector takes every host (an empty Q cannot be a When's condition).
    node_type = Case(*[When(label_selector_q(selector or {}) or Q(pk__isnull=False), then=Value(name))
                       for name, selector in types],
                     default=Value(""), output_field=TextField()) if types else Value("", output_field=TextField())
    now = timezone.now()
    rows = list(BareMetalHost.objects.annotate(node_type=node_type)
                .values("state", "node_type", "power_state", "bmc_ok")
                .annotate(n=Count("pk"), past_deadline=Count("pk", filter=Q(deadline_at__lt=now)),
                          warm=Count("pk", filter=Q(warm_since__isnull=False)))
                .order_by())
    hosts = GaugeMetricFamily("vmetal_hosts", "BareMetalHosts by state and NodeType (the first whose selector "
                              "takes the host; '' for none)", labels=["state", "node_type"])
    power = GaugeMetricFamily("vmetal_hosts_power", "BareMetalHosts by power state as last read",
                              labels=["power_state"])
    bmc = GaugeMetricFamily("vmetal_hosts_bmc", "BareMetalHosts by their BMC's last answer: ok, red (it did not "
                            "answer) or unknown (never asked)", labels=["status"])
    late = GaugeMetricFamily("vmetal_hosts_past_deadline", "BareMetalHosts past their state's deadline",
                             labels=["state"])
    warm = GaugeMetricFamily("vmetal_hosts_warm", "available hosts kept on in the agent's ramdisk")
    sums = {"hosts": {}, "power": {}, "bmc": {}, "late": {}}
    warm_n = 0
    for row in rows:
        for name, key, value in (("hosts", (row["state"], row["node_type"]), row["n"]),
                                 ("power", (row["power_state"],), row["n"]),
                                 ("bmc", ({True: "ok", False: "red"}.get(row["bmc_ok"], "unknown"),), row["n"]),
                                 ("late", (row["state"],), row["past_deadline"])):
            sums[name][key] = sums[name].get(key, 0) + value
        warm_n += row["warm"]
    for family, name in ((hosts, "hosts"), (power, "power"), (bmc, "bmc"), (late, "late")):
        for key, value in sorted(sums[name].items()):
            family.add_metric(list(key), value)
    warm.add_metric([], warm_n)
    return [hosts, power, bmc, late, warm]


def _claims() -> list:
    claims = GaugeMetricFamily("vmetal_nodeclaims", "NodeClaims by phase, tenant and pool (Released claims are "
                               "kept)", labels=["phase", "tenant", "pool"])
    for row in (NodeClaim.objects.values("phase", "tenant__name", "pool_name").annotate(n=Count("pk"))
                .order_by("phase", "tenant__name", "pool_name")):
        claims.add_metric([row["phase"], row["tenant__name"], row["pool_name"]], row["n"])
    return [claims]


def _evidence() -> list:
    certificates = CounterMetricFamily("vmetal_erase_certificates", "erase certificates signed, by result and "
                                       "method (one per disk per erase)", labels=["result", "method"])
    for row in EraseCertificate.objects.values("result", "method").annotate(n=Count("pk")).order_by("result", "method"):
        certificates.add_metric([row["result"], row["method"]], row["n"])
    runs = CounterMetricFamily("vmetal_health_runs", "health check runs, by tier and result", labels=["tier", "result"])
    for row in HealthCheckRun.objects.values("tier", "verdict").annotate(n=Count("pk")).order_by("tier", "verdict"):
        runs.add_metric([row["tier"], row["verdict"]], row["n"])
    raced = CounterMetricFamily("vmetal_boots_raced", "ramdisk boots whose configuration went out twice (voided)")
    raced.add_metric([], RamdiskBoot.objects.filter(raced_at__isnull=False).count())
    silent_since = timezone.now() - timedelta(seconds=settings.AGENT_SILENCE_S)
    heard = Q(last_seen_at__gte=silent_since)
    live = AgentSession.objects.filter(active=True).aggregate(live=Count("pk", filter=heard),
                                                             silent=Count("pk", filter=~heard))
    sessions = GaugeMetricFamily("vmetal_agent_sessions", "active agent sessions: live (heard from within "
                                 "AGENT_SILENCE_S) or silent", labels=["status"])
    for status in ("live", "silent"):
        sessions.add_metric([status], live[status])
    return [certificates, runs, raced, sessions]


def _from_events(tenant_names: dict[int, str]) -> list:
    tally = event_counters.read()
    steps = HistogramMetricFamily("vmetal_flow_step_duration_seconds", "completed steps of the hosts' flows, by "
                                  "flow and step", labels=["flow", "step"])
    for (flow, step), row in sorted(tally.steps.items()):
        count, total, cumulative = row[0], row[1], row[2:]
        buckets = [(str(float(b)) if b != int(b) else f"{b:.1f}", n) for b, n in zip(STEP_BUCKETS_S, cumulative)]
        steps.add_metric([flow, step], buckets + [("+Inf", count)], sum_value=total)
    security = CounterMetricFamily("vmetal_security_events", "security events, repeats included, by reason and "
                                   "whether a person must look", labels=["reason", "attention"])
    for (reason, attention), n in sorted(tally.security.items()):
        security.add_metric([reason, attention], n)
    decisions = CounterMetricFamily("vmetal_autonodes_decisions", "Auto Nodes decisions, by reason", labels=["reason"])
    for reason, n in sorted(tally.decisions.items()):
        decisions.add_metric([reason], n)
    launches = CounterMetricFamily("vmetal_autonodes_nodeclaims_launched", "NodeClaims Auto Nodes launched, by "
                                   "tenant and pool", labels=["tenant", "pool"])
    for (tenant, pool), n in sorted(tally.launches.items(), key=lambda kv: (tenant_names.get(kv[0][0], ""), kv[0][1])):
        launches.add_metric([tenant_names.get(tenant, ""), pool], n)
    return [steps, security, decisions, launches]


def _queue_names() -> list[str]:
    return [queue_name(settings.CELERY_QUEUE_PREFIX, kind) for kind in KINDS]


def _broker() -> list:
    from vmetal_console.celery import app

    up = GaugeMetricFamily("vmetal_broker_up", "1 when the broker answered this scrape")
    queues = GaugeMetricFamily("vmetal_queue_messages", "messages waiting in each Celery queue (not those a worker "
                               "holds)", labels=["queue"])
    try:
        with app.connection_for_read(connect_timeout=BROKER_TIMEOUT_S) as connection:
            connection.ensure_connection(max_retries=0, timeout=BROKER_TIMEOUT_S)
            channel = connection.default_channel
            for name in _queue_names():
                try:
                    n = channel.queue_declare(queue=name, passive=True).message_count
                except connection.channel_errors:  # never declared, or empty and so gone (Redis)
                    n = 0
                    channel = connection.channel()  # a refused passive declare closes the channel (AMQP)
                queues.add_metric([name], n)
    except Exception:  # the transport's own errors
        up.add_metric([], 0)
        return [up]
    up.add_metric([], 1)
    return [up, queues]


def _bmc() -> list:
    requests = CounterMetricFamily("vmetal_bmc_requests", "BMC (Redfish) operations by result: ok, or the error's "
                                   "kind (timeout, unreachable, auth, tls, server_error, ...); kept in Redis",
                                   labels=["result"])
    for result, n in sorted(counters.counters_read(counters.BMC_REQUESTS).items()):
        requests.add_metric([result], n)
    return [requests]


class ConsoleCollector:
    def collect(self):
        from pools.models import Tenant

        tenant_names = dict(Tenant.objects.values_list("pk", "name"))
        yield from _hosts()
        yield from _claims()
        yield from _evidence()
        yield from _from_events(tenant_names)
        yield from _broker()
        yield from _bmc()


registry = CollectorRegistry(auto_describe=False)
registry.register(ConsoleCollector())


class SeesEverything(BasePermission):
    message = "the metrics count every tenant's claims and hosts: an admin's or an auditor's token only"

    def has_permission(self, request, view):
        return scoping.sees_everything(request.user)


class MetricsView(APIView):
    """GET /metrics with `Authorization: Token <key>` of an admin or an auditor (a service user made with
    `manage.py token create prometheus --service-user auditor`): tenant members get 403."""

    permission_classes = [SeesEverything]

    @extend_schema(exclude=True)
    def get(self, request):
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
