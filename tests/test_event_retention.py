"""EVENT_RETENTION_DAYS: the beat's prune-events task deletes routine step events older than that many days, in
batches of EVENT_PRUNE_BATCH, and nothing else: state transitions (with their evidence), failed steps, the release
gate's steps that carry its evidence, people's changes, security events and erase certificates stay whatever their
age; 0 keeps everything; a second run finds nothing more."""
pytest_plugins = ["tests.api_conftest"]

import datetime  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402
from django.conf import settings as django_settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402
from django.utils import timezone  # noqa: E402

from events import task_names  # noqa: E402
from events.models import Event  # noqa: E402
from events.services import event_record  # noqa: E402
from events.tasks import prune_events  # noqa: E402
from hosts.models import EraseCertificate, HealthCheckRun  # noqa: E402
from tests.api_conftest import gate_evidence  # noqa: E402

pytestmark = pytest.mark.django_db


def step(host, name: str, message: str, **data) -> Event:
    """A flow's step event, as the step engine writes it (hosts.engine.drive)."""
    return event_record(kind="step", object_type="host", object_name=host.name, host=host, step=name,
                        message=message, actor="system:flow", duration_s=1.5 if message == "done" else None,
                        data={"flow": "deprovision", "flow_id": "f-1", **data})


def age(events: list[Event], days: float) -> None:
    Event.objects.filter(pk__in=[e.pk for e in events]).update(
        created_at=timezone.now() - datetime.timedelta(days=days))


@pytest.fixture
def log(world):
    """A host's release, written long ago: its routine steps, and what must outlive them."""
    host = world.host_a
    cert, run = gate_evidence(host, flow_id="release-old", tenant="alpha")
    routine = [step(host, "power_off", "started"), step(host, "power_off", "done"),
               step(host, "drain_node", "done", node="n-1"), step(host, "agent_lookup", "retrying: no agent yet")]
    kept = [
        step(host, "erase", "done", certificates=[cert.certificate_id], bytes_read=4096),  # the gate's evidence
        step(host, "health_dcgm", "done", health_run=run.pk),
        step(host, "gpu_state", "done", census={"gpus": 8}, verdict="pass"),
        step(host, "write_image", "failed: checksum mismatch"),  # a failed step
        step(host, "bmc_check", "done", bmc_ok=False),  # a check that turned red
        event_record(kind="transition", object_type="host", object_name=host.name, host=host,
                     from_state="deprovisioning", to_state="repair", actor="system:flow",
                     message="erase verification failed", data={"evidence": {"disk": "nvme0n1"}}),
        event_record(kind="transition", object_type="host", object_name=host.name, host=host,
                     from_state="provisioned", to_state="deprovisioning", actor="system:flow"),
        event_record(kind="change", object_type="pool", object_name="alpha/gpu", actor="user:alice-alpha",
                     data={"quantity": [1, 2]}),
        event_record(kind="security", object_type="host", object_name=host.name, host=host, actor="system:boot",
                     message="a boot script asked for twice"),
    ]
    age(routine + kept, days=100)
    recent = [step(host, "power_off", "done")]
    return {"routine": routine, "kept": kept, "recent": recent, "certificate": cert, "run": run}


def ids(events: list[Event]) -> set[int]:
    return {e.pk for e in events}


def existing(events: list[Event]) -> set[int]:
    return set(Event.objects.filter(pk__in=ids(events)).values_list("pk", flat=True))


def test_old_routine_steps_are_pruned_and_recent_ones_transitions_evidence_and_certificates_kept(log, settings):
    settings.EVENT_RETENTION_DAYS = 90
    certificates, runs = EraseCertificate.objects.count(), HealthCheckRun.objects.count()
    assert prune_events() == len(log["routine"])
    assert existing(log["routine"]) == set()
    assert existing(log["kept"]) == ids(log["kept"])
    assert existing(log["recent"]) == ids(log["recent"])
    assert EraseCertificate.objects.count() == certificates and HealthCheckRun.objects.count() == runs
    assert prune_events() == 0  # idempotent: nothing more to prune


def test_a_step_younger_than_the_retention_stays(log, settings):
    settings.EVENT_RETENTION_DAYS = 120
    assert prune_events() == 0
    assert existing(log["routine"]) == ids(log["routine"])


def test_zero_keeps_every_event(log, settings):
    settings.EVENT_RETENTION_DAYS = 0
    before = Event.objects.count()
    assert prune_events() == 0
    assert Event.objects.count() == before


def test_the_prune_deletes_in_batches_of_event_prune_batch(log, settings):
    settings.EVENT_RETENTION_DAYS, settings.EVENT_PRUNE_BATCH = 90, 3
    with CaptureQueriesContext(connection) as queries:
        assert prune_events() == len(log["routine"])
    deletes = [q["sql"] for q in queries.captured_queries if q["sql"].startswith('DELETE FROM "events_event"')]
    assert [len(re.search(r"IN \(([^)]*)\)", d).group(1).split(",")) for d in deletes] == [3, 1]


def test_the_beat_sends_the_prune_hourly_by_its_declared_name():
    assert {"task": task_names.PRUNE_EVENTS, "schedule": 3600.0} in django_settings.CELERY_BEAT_SCHEDULE.values()
