"""Celery queues by kind of work (vmetal_console/queues.py): every task goes to its kind's queue, whoever sends it
(a service on commit, a task, beat), under the deployment's prefix; a worker without -Q takes every queue; the docs
list each queue's tasks as the code routes them; and a flood of BMC work that never answers holds up no pool
change, which a worker serving the other queues reconciles meanwhile."""
import re
import socket
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from claims.choices import ClaimPhase
from conftest import ROOT, wait_for
from events.models import Event
from hosts.models import BareMetalHost
from vmetal_console import queues
from vmetal_console.celery import app

FLOOD = 300  # hosts whose BMC never answers, powered off in one bulk action


def declared_task_names() -> set[str]:
    """Every task name an app declares in its task_names.py."""
    from autonodes import task_names as autonodes_tasks
    from claims import task_names as claims_tasks
    from events import task_names as events_tasks
    from hosts import task_names as hosts_tasks
    from machines import task_names as machines_tasks

    return {value for module in (autonodes_tasks, claims_tasks, events_tasks, hosts_tasks, machines_tasks)
            for name, value in vars(module).items()
            if name.isupper() and isinstance(value, str)}


def routed(name: str) -> str:
    """The queue Celery sends this task to, as every send path asks its router (send_task, delay, beat)."""
    return app.amqp.router.route({}, name)["queue"].name


def test_every_task_an_app_declares_is_registered_and_routed_to_its_kinds_queue(settings):
    settings.CELERY_QUEUE_PREFIX = "site-a."
    import autonodes.tasks  # noqa: F401  the apps' tasks modules, as a worker's autodiscovery loads them
    import claims.tasks  # noqa: F401
    import events.tasks  # noqa: F401
    import hosts.tasks  # noqa: F401
    import machines.tasks  # noqa: F401

    registered = {name for name in app.tasks if not name.startswith("celery.")}
    assert declared_task_names() == registered
    assert set(queues.TASK_KIND) == registered  # a new task says which kind it is
    assert routed("hosts.tasks.drive_host") == "site-a.drives"
    assert routed("hosts.tasks.power_host") == "site-a.drives"
    assert routed("hosts.tasks.drive_host_for_agent") == "site-a.agent"
    assert routed("autonodes.tasks.decide") == "site-a.autonodes"
    assert routed("claims.tasks.reconcile_pools") == "site-a.celery"
    assert {routed(name) for name in registered} == {f"site-a.{kind}" for kind in queues.KINDS}


def test_beat_sends_its_entries_by_name_through_the_routing(settings):
    # An entry's own `queue` option would bypass the routing: none has one.
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert "queue" not in entry.get("options", {}), entry
        assert entry["task"] in queues.TASK_KIND
    assert routed(settings.CELERY_BEAT_SCHEDULE["check-bmcs"]["task"]) == "drives"
    assert routed(settings.CELERY_BEAT_SCHEDULE["reconcile-pools"]["task"]) == "celery"


def test_a_worker_without_q_consumes_every_queue_as_bin_run_starts_it():
    # What `celery worker` consumes when -Q is not given: every queue of task_queues.
    assert sorted(app.amqp.queues.consume_from) == sorted(queues.KINDS)
    assert "-Q" not in (ROOT / "bin" / "run").read_text().split("celery -A vmetal_console worker", 1)[1].split("\n")[0]


def test_the_operations_guide_lists_each_queues_tasks_as_the_code_routes_them():
    body = (ROOT / "docs" / "operations.md").read_text()
    section = body.split("\n## Queues\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        documented[cells[0].strip("`")] = set(re.findall(r"`([a-z_.]+\.tasks\.[a-z_]+)`", cells[1]))
    assert set(documented) == set(queues.KINDS)
    for kind, names in documented.items():
        assert names == {name for name, of in queues.TASK_KIND.items() if of == kind}, kind


def test_the_one_queue_setting_it_replaced_is_refused_with_the_reason(subprocess_env):
    env = {**subprocess_env, "CELERY_TASK_DEFAULT_QUEUE": "old"}
    answer = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=60)
    assert answer.returncode != 0
    assert "CELERY_TASK_DEFAULT_QUEUE is no longer read" in answer.stderr
    assert "set CELERY_QUEUE_PREFIX instead" in answer.stderr


# --- the flood ---------------------------------------------------------------------------------------------------

@pytest.fixture
def worker_settings() -> dict:
    """The test worker serves the drives queue only (four threads), each BMC call waiting 2 s (and retried); the
    flood test starts a second worker for every other queue."""
    return {"QUEUE_KINDS": "drives", "BMC_TIMEOUT_S": "2"}


@pytest.fixture
def silent_bmc():
    """A BMC that takes connections and never answers: the kernel completes them into the listening socket's
    backlog, nobody accepts, so every request waits for its timeout (BMC_TIMEOUT_S, with the client's retries)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(FLOOD * 2)
    yield f"redfish+http://127.0.0.1:{listener.getsockname()[1]}/redfish/v1/Systems/1"
    listener.close()


@pytest.fixture
def flooded_fleet(db, silent_bmc):
    BareMetalHost.objects.bulk_create(
        BareMetalHost(name=f"silent-{i:03d}", state="available", boot_mac=f"52:54:01:00:{i // 256:02x}:{i % 256:02x}",
                      bmc_address=silent_bmc, bmc_username="admin", bmc_password="silent-bmc-password-3b9e")
        for i in range(FLOOD))
    return [f"silent-{i:03d}" for i in range(FLOOD)]


def answered_power_offs() -> int:
    return Event.objects.filter(step="power_off", data__has_key="request_id").count()


@pytest.mark.django_db(transaction=True)
def test_a_pool_change_is_reconciled_while_hundreds_of_bmc_calls_that_never_answer_fill_the_drives_queue(
        apply, demo_site, seed_block, flooded_fleet, celery_worker_process):
    others = celery_worker_process.another("agent,autonodes,celery")
    admin = User.objects.create_user("root-admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)

    done = client.post(reverse("fleet-bulk"), {"action": "power-off", "host": flooded_fleet, "reason": "row 9 work"})
    assert done.status_code == 302
    assert Event.objects.filter(step="power_off", message="power off requested: row 9 work").count() == FLOOD
    wait_for(lambda: "Task hosts.tasks.power_host[" in celery_worker_process.log.read_text(), timeout=30)  # taken

    apply(seed_block, tenant="one")  # tenant one's pools gpu 1 and cpu 1: a reconcile on commit

    def allocated():
        return Event.objects.filter(object_type="claim", to_state=ClaimPhase.PROVISIONING).count() == 2
    wait_for(allocated, timeout=30)
    # The flood was still there: most power-offs were not even tried yet, each waiting behind BMCs that do not answer.
    assert answered_power_offs() < FLOOD // 4
    assert "Task claims.tasks.reconcile_pools[" in others.log.read_text()  # received and run there
    assert "Task claims.tasks.reconcile_pools[" not in celery_worker_process.log.read_text()
    celery_worker_process.kill()  # its threads are in calls that never end; what is queued is purged at teardown
