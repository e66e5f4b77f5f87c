"""Probes: /healthz and /readyz on the public and the agent listener, unauthenticated and under any Host (a kubelet
names the pod's address), 503 with the reason when a dependency is missing; `manage.py probe` for the processes
without a port: a worker answers a ping, beat ticks."""
import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command

from conftest import wait_for
from vmetal_console import probes
from vmetal_console.celery import app

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[1]
POD_ADDRESS = "10.244.3.17:8000"  # in no ALLOWED_HOSTS


@pytest.fixture(params=["public", "agent"])
def listener(request, client, agent_client):
    return client if request.param == "public" else agent_client


def test_healthz_answers_without_a_login_under_any_host_on_both_listeners(listener):
    response = listener.get("/healthz", HTTP_HOST=POD_ADDRESS)
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_says_ready_when_the_database_migrations_broker_and_keys_are_there(listener):
    response = listener.get("/readyz", HTTP_HOST=POD_ADDRESS)
    assert response.status_code == 200, response.content
    assert response.json()["checks"] == {"database": "ok", "migrations": "ok", "broker": "ok", "keys": "ok"}


def test_readyz_is_503_naming_a_migration_this_code_has_and_the_database_not(client, monkeypatch):
    probes.readiness()  # reads the migrations on disk once
    monkeypatch.setattr(probes, "_expected_migrations", {*probes._expected_migrations, ("hosts", "9999_next")})
    response = client.get("/readyz", HTTP_HOST=POD_ADDRESS)
    assert response.status_code == 503
    assert response.json()["reason"] == "migrations not applied: hosts.9999_next (manage.py migrate)"


def test_readyz_is_503_when_the_broker_does_not_answer(client, monkeypatch, settings):
    from vmetal_console.celery import app

    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    # Celery read its broker at start (the embedded mode's file-system transport too): a Redis broker now
    monkeypatch.setenv("CELERY_BROKER_URL", settings.CELERY_BROKER_URL)  # Celery's conf reads the environment first
    monkeypatch.setitem(app.conf, "CELERY_BROKER_URL", settings.CELERY_BROKER_URL)
    monkeypatch.setitem(app.conf, "CELERY_BROKER_TRANSPORT", None)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["broker"] == "broker unreachable"
    assert "127.0.0.1:1" not in response.content.decode()  # no address, no exception text


def test_readyz_is_503_when_the_field_keys_cannot_read_this_database(client, settings):
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode()]
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["keys"].startswith("keys check failed (vmetal.E002")


def test_only_get_and_head_are_probes(client):
    assert client.head("/readyz").status_code == 200
    assert client.post("/healthz").status_code != 200


def test_probe_ready_says_ok_and_exits_1_with_the_reason_when_not(monkeypatch):
    out = io.StringIO()
    call_command("probe", "ready", stdout=out)
    assert out.getvalue().strip() == "ok: ready"
    probes.readiness()
    monkeypatch.setattr(probes, "_expected_migrations", {*probes._expected_migrations, ("hosts", "9999_next")})
    with pytest.raises(CommandError, match="not ok: migrations not applied: hosts.9999_next") as refused:
        call_command("probe", "ready")
    assert refused.value.returncode == 1


def probe(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "probe", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.django_db(transaction=True)
def test_probe_worker_is_ok_while_the_worker_answers_pings_and_not_once_it_is_killed(spawn, subprocess_env, tmp_path):
    node = f"probe-{uuid.uuid4().hex[:8]}@localhost"
    log = tmp_path / "worker.log"
    worker = spawn([sys.executable, "-m", "celery", "-A", "vmetal_console", "worker", "-n", node, "-P", "threads",
                    "-c", "1", "-Q", f"probe-{uuid.uuid4().hex[:8]}", "--without-gossip", "--without-mingle",
                    "--without-heartbeat", "-l", "info"],
                   cwd=ROOT, env=subprocess_env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: "ready." in log.read_text() or worker.poll() is not None, timeout=60)
    answered = probe("worker", "--node", node, env=subprocess_env)
    assert answered.returncode == 0 and answered.stdout.strip() == f"ok: {node} answers", answered.stderr
    os.killpg(worker.pid, 9)
    worker.wait(10)
    silent = probe("worker", "--node", node, "--timeout", "1", env=subprocess_env)
    assert silent.returncode == 1
    assert f"not ok: worker {node} did not answer a ping within 1s" in silent.stderr


@pytest.mark.django_db(transaction=True)
def test_probe_beat_is_ok_while_beat_ticks_and_not_once_it_stopped(spawn, subprocess_env, tmp_path):
    queue = f"probe-beat-{uuid.uuid4().hex[:8]}"  # what it sends goes nowhere any worker reads
    env = {**subprocess_env, "BEAT_HEARTBEAT_FILE": str(tmp_path / "beat-heartbeat"),
           "CELERY_BEAT_SCHEDULE_FILENAME": str(tmp_path / "schedule"), "CELERY_QUEUE_PREFIX": queue + "."}
    assert probe("beat", env=env).returncode == 1  # never ticked
    beat = spawn([sys.executable, "-m", "celery", "-A", "vmetal_console", "beat", "-l", "info"], cwd=ROOT, env=env,
                 stdout=open(tmp_path / "beat.log", "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: (tmp_path / "beat-heartbeat").exists() or beat.poll() is not None, timeout=60)
    ticking = probe("beat", "--max-age", "30", env=env)
    assert ticking.returncode == 0 and ticking.stdout.strip() == "ok: beat ticks", ticking.stderr
    os.killpg(beat.pid, 9)
    beat.wait(10)
    stale = wait_for(lambda: (lambda p: p if p.returncode == 1 else None)(probe("beat", "--max-age", "1", env=env)),
                     timeout=30)
    assert "not ok: beat last ticked" in stale.stderr
    with app.connection_for_write() as connection:  # what beat sent, gone
        connection.default_channel.queue_purge(queue)
