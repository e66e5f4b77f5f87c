"""/metrics: Prometheus' text format, read from the database; an admin's or an auditor's token only; a few
queries whatever the fleet's size; promtool accepts the scrape and the alert rules."""
import os
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from claims.models import NodeClaim
from core import counters
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record
from hosts.boot.ramdisk import RACE_REASON, security_event
from hosts.models import BareMetalHost, EraseCertificate
from vmetal_console import metrics

from .factories import make_hosts

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMTOOL = shutil.which("promtool")


@pytest.fixture(autouse=True)
def fresh_event_counters(monkeypatch):
    """Each test's own Event log: the process's settled counts start from nothing (a test's rows are rolled back,
    which a restored database aside never happens in production)."""
    monkeypatch.setattr(metrics, "event_counters", metrics._EventCounters())


def scrape(client) -> dict[str, dict[tuple, float]]:
    """{sample name: {sorted label items: value}} of one scrape."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def by(samples: dict[tuple, float], label: str) -> dict[str, float]:
    summed: dict[str, float] = {}
    for labels, value in samples.items():
        key = dict(labels)[label]
        summed[key] = summed.get(key, 0) + value
    return summed


def promtool(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    if PROMTOOL is None:
        missing = pytest.fail if os.environ.get("CI") else pytest.skip  # CI installs it: there it must run
        missing("promtool is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, timeout=60)


def test_an_auditor_reads_hosts_by_state_summing_to_the_host_count_and_claims_as_the_database_has_them(evidence):
    found = scrape(evidence.client("auditor"))
    assert sum(found["vmetal_hosts"].values()) == BareMetalHost.objects.count() > 0
    assert by(found["vmetal_hosts"], "state") == {
        row["state"]: row["n"] for row in BareMetalHost.objects.values("state").annotate(n=Count("pk"))}
    assert {dict(k)["node_type"] for k in found["vmetal_hosts"]} <= {"gpu-server", "cpu-server", ""}
    claims = {(row["phase"], row["tenant__name"], row["pool_name"]): row["n"]
              for row in NodeClaim.objects.values("phase", "tenant__name", "pool_name").annotate(n=Count("pk"))}
    assert {(dict(k)["phase"], dict(k)["tenant"], dict(k)["pool"]): v
            for k, v in found["vmetal_nodeclaims"].items()} == claims
    # The gate's evidence: two passing certificates and runs, one failing run (the fixture's).
    assert by(found["vmetal_erase_certificates_total"], "result") == {"pass": EraseCertificate.objects.count()}
    assert by(found["vmetal_health_runs_total"], "result") == {"pass": 2, "fail": 1}
    assert found["vmetal_broker_up"][()] == 1
    assert sum(found["vmetal_hosts_bmc"].values()) == BareMetalHost.objects.count()


def test_an_admin_reads_them_a_tenant_member_and_an_anonymous_caller_do_not(world):
    assert world.client("admin").get("/metrics").status_code == 200
    member = world.client("member_a").get("/metrics")
    assert member.status_code == 403 and b"vmetal_" not in member.content
    anonymous = world.client("anonymous").get("/metrics")
    assert anonymous.status_code == 401 and anonymous["WWW-Authenticate"] == "Token"


def test_a_scrape_takes_the_same_few_queries_whatever_the_number_of_hosts_claims_and_events(world):
    from prometheus_client import generate_latest

    def queries() -> list[str]:  # the collector's: the view adds the token's and its user's role
        with CaptureQueriesContext(connection) as captured:
            generate_latest(metrics.registry)
        return [q["sql"] for q in captured.captured_queries]

    queries()
    before = queries()
    make_hosts(40, start=500)
    for i in range(30):
        event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=f"gpu-{i:05d}", actor="system:flow",
                     step="write_image", message="done", duration_s=i, data={"flow": "provision"})
    Event.objects.filter(step="write_image").update(created_at=timezone.now() - timedelta(hours=1))
    settling = queries()  # the newly settled events: one more aggregate over them
    after = queries()
    assert len(settling) <= len(before) + 1, "\n".join(settling)
    assert len(after) == len(before), "\n".join(after)
    assert len(after) <= 12
    assert scrape(world.client("auditor"))["vmetal_flow_step_duration_seconds_count"][
        (("flow", "provision"), ("step", "write_image"))] == 30


def steps(found: dict, flow: str, step: str) -> dict[str, float]:
    return {dict(k)["le"]: v for k, v in found["vmetal_flow_step_duration_seconds_bucket"].items()
            if dict(k)["flow"] == flow and dict(k)["step"] == step}


def test_step_durations_and_security_events_count_the_log_once_whether_settled_or_new(world):
    client = world.client("auditor")
    host = world.host_a
    for seconds in (0.5, 20, 20, 4000):
        event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host=host,
                     actor="system:flow", step="erase", message="done", duration_s=seconds, data={"flow": "release"})
    event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host=host,
                 actor="system:flow", step="erase", message="retrying: BMC away", data={"flow": "release"})
    for _ in range(3):  # one row, counted three times
        security_event(host=host, message="boot configuration asked for again", reason=RACE_REASON)
    # Half of it old enough to be settled at the first scrape, half new.
    mine = Event.objects.filter(host=host, kind__in=[EventKind.STEP, EventKind.SECURITY]).order_by("pk")
    Event.objects.filter(pk__in=list(mine.values_list("pk", flat=True)[:3])).update(
        created_at=timezone.now() - timedelta(hours=2))

    for _ in range(2):  # the first scrape settles the old part, the second reads it from the process's tally
        found = scrape(client)
        buckets = steps(found, "release", "erase")
        assert [buckets[le] for le in ("1.0", "30.0", "3600.0", "7200.0", "+Inf")] == [1, 3, 3, 4, 4]
        assert found["vmetal_flow_step_duration_seconds_count"][(("flow", "release"), ("step", "erase"))] == 4
        assert found["vmetal_flow_step_duration_seconds_sum"][(("flow", "release"), ("step", "erase"))] == 4040.5
        assert found["vmetal_security_events_total"] == {(("attention", "true"), ("reason", RACE_REASON)): 3}
    assert metrics.event_counters.settled_to > 0


def test_auto_nodes_decisions_and_launches_are_counted_from_the_decision_events(world):
    for reason, claims in (("Launched", ["alpha-a", "alpha-b"]), ("Launched", ["alpha-c"]), ("NoCapacity", [])):
        event_record(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name="gpu", tenant=world.alpha,
                     actor="system:autonodes", data={"reason": reason, "pool": "gpu", "claims": claims})
    # A slow launch is written on the claim and on its pool: one decision.
    for object_type in (ObjectType.CLAIM, ObjectType.POOL):
        event_record(kind=EventKind.DECISION, object_type=object_type, object_name="gpu", tenant=world.alpha,
                     actor="system:autonodes", data={"reason": "LaunchSlow", "pool": "gpu", "claims": ["alpha-a"]})
    found = scrape(world.client("auditor"))
    assert found["vmetal_autonodes_decisions_total"] == {
        (("reason", "Launched"),): 2, (("reason", "NoCapacity"),): 1, (("reason", "LaunchSlow"),): 1}
    assert found["vmetal_autonodes_nodeclaims_launched_total"] == {(("pool", "gpu"), ("tenant", "alpha")): 3}


def test_bmc_requests_are_counted_by_result_across_processes_through_redis(world, settings):
    if not settings.REDIS_URL:
        pytest.skip("BMC requests are counted in Redis (REDIS_URL)")
    from hosts.bmc.client import BMC, BMCError

    before = counters.counters_read(counters.BMC_REQUESTS)
    bmc = BMC("redfish://127.0.0.1:1/redfish/v1/Systems/1", "u", "p", timeout=0.5, retries=0)
    with pytest.raises(BMCError):
        bmc.power_state()
    found = scrape(world.client("auditor"))["vmetal_bmc_requests_total"]
    assert found[(("result", "unreachable"),)] == before.get("unreachable", 0) + 1


def test_promtool_accepts_a_scrape_of_the_console(evidence):
    response = evidence.client("auditor").get("/metrics")
    checked = promtool("check", "metrics", stdin=response.content)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), checked


def test_promtool_accepts_the_alert_rules_and_they_name_only_metrics_the_console_serves(evidence):
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Its unit tests: a host past its deadline, a raced boot, a BMC red share, a security event that needs a person.
    tested = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=RULES.parent, capture_output=True,
                            text=True, timeout=60)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    served = set(scrape(evidence.client("auditor"))) | {"up"}
    import re

    import yaml
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    named = {name for rule in rules for name in re.findall(r"\b(vmetal_[a-z_]+|up)\b", rule["expr"])}
    # Families with no sample yet (no BMC request, no security event) are declared all the same.
    declared = served | {"vmetal_bmc_requests_total", "vmetal_security_events_total", "vmetal_boots_raced_total"}
    assert named <= declared, named - declared


def test_queue_lengths_are_read_from_the_broker_for_every_kind_of_work(world, settings):
    # A prefix of this test's own: its queues are read by no worker, so what is sent stays there.
    import uuid

    from core.tasks import task_send
    from hosts import task_names
    from vmetal_console.celery import app

    settings.CELERY_QUEUE_PREFIX = f"metrics-{uuid.uuid4().hex[:8]}."
    for _ in range(3):
        task_send(task_names.DRIVE_HOST, host_id=0)
    try:
        found = scrape(world.client("auditor"))["vmetal_queue_messages"]
        queues = {dict(labels)["queue"]: value for labels, value in found.items()}
        assert queues == {settings.CELERY_QUEUE_PREFIX + kind: (3 if kind == "drives" else 0)
                          for kind in ("drives", "agent", "autonodes", "celery")}
    finally:
        with app.connection_for_write() as connection:
            connection.default_channel.queue_purge(settings.CELERY_QUEUE_PREFIX + "drives")
