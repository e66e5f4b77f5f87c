"""`./bin/run` keeps every process's log in var/log/, the web server's included, rotated over the last five
starts; and a web server that cannot start (its port taken) ends the run with exit 1 and web.log's tail."""
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = ("web", "worker", "beat", "agent-listener", "lab", "watch-pods")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_a_start_rotates_the_logs_and_a_taken_port_ends_the_run_with_the_web_log(subprocess_env, tmp_path):
    var = tmp_path / "var"
    logs = var / "log"
    logs.mkdir(parents=True)
    for name in PROCESSES:
        (logs / f"{name}.log").write_text(f"{name} run 0\n")
        for i in range(1, 6):
            (logs / f"{name}.log.{i}").write_text(f"{name} run -{i}\n")
    env = {k: v for k, v in subprocess_env.items() if k not in {"CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(VMETAL_VAR_DIR=str(var), AGENT_PORT=str(free_port()), LAB_HOSTS="1")
    with socket.socket() as taken:  # someone else has the web server's port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["PORT"] = str(taken.getsockname()[1])
        run = subprocess.Popen([str(ROOT / "bin" / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
        try:
            _, stderr = run.communicate(timeout=240)
        finally:
            try:
                os.killpg(run.pid, signal.SIGTERM)  # whatever it left behind, had it not stopped it all itself
            except ProcessLookupError:
                pass

    assert run.returncode == 1
    web_log = (logs / "web.log").read_text()
    assert "already in use" in web_log  # the web server's own words, in its log
    assert "the web server stopped" in stderr and "already in use" in stderr
    for name in PROCESSES:
        assert (logs / f"{name}.log").exists(), f"{name} logs to var/log/{name}.log"
        assert (logs / f"{name}.log.1").read_text() == f"{name} run 0\n"
        assert [(logs / f"{name}.log.{i}").read_text() for i in range(2, 6)] == [
            f"{name} run -{i}\n" for i in range(1, 5)]  # the oldest, run -5, is gone
        assert not (logs / f"{name}.log.6").exists()
