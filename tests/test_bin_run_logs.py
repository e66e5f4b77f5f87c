"""`./bin/run` keeps every process's log in var/log/, the web server's included, rotated over the last five
starts; and any of its processes that ends (a web server whose port is taken, a lab that cannot start, a worker
killed) ends the run with exit 1, naming it, with its log's tail."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = ("web", "worker", "beat", "agent-listener", "lab", "watch-pods")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_a_start_rotates_the_logs_and_a_taken_port_ends_the_run_with_the_web_log(subprocess_env, tmp_path, spawn):
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
        run = spawn([str(ROOT / "bin" / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        found = path.read_text() if path.exists() else ""
        if text in found:
            return found
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{text!r} not in {path.name} (run ended: {proc.poll()}):\n{found[-3000:]}")
        time.sleep(0.2)


def start_bin_run(spawn, env: dict) -> subprocess.Popen:
    return spawn([str(ROOT / "bin" / "run")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stop_bin_run(run: subprocess.Popen) -> str:
    try:
        os.killpg(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, stderr = run.communicate(timeout=60)
    return stderr


@pytest.mark.django_db(transaction=True)
def test_with_a_database_url_bin_run_still_starts_the_lab_and_its_files_are_the_owners_only(
        subprocess_env, tmp_path, spawn):
    var = tmp_path / "var"
    env = {k: v for k, v in subprocess_env.items() if k not in {"CELERY_BROKER_URL", "REDIS_URL", "VMETAL_LAB",
                                                                   "ALLOWED_HOSTS"}}
    assert env["DATABASE_URL"].startswith(("postgres", "sqlite"))
    env.update(VMETAL_VAR_DIR=str(var), PORT=str(free_port()), AGENT_PORT=str(free_port()), LAB_HOSTS="1",
               PYTHONUNBUFFERED="1")
    run = start_bin_run(spawn, env)
    try:
        lab_log = wait_for_text(var / "log" / "lab.log", "lab running: 1 servers", run)
        assert "Unknown command" not in lab_log
        assert (var.stat().st_mode & 0o777) == 0o700
        lab = var / "lab"
        assert lab.is_dir() and (lab.stat().st_mode & 0o777) == 0o700
        for path in lab.rglob("*"):  # BMC passwords, boot configurations: behind a directory only the owner enters
            if path.is_dir() and not path.is_symlink():
                assert path.stat().st_mode & 0o077 == 0, path
    finally:
        stop_bin_run(run)


@pytest.mark.django_db(transaction=True)
def test_bin_run_without_the_lab_says_so(subprocess_env, tmp_path, spawn):
    var = tmp_path / "var"
    env = {k: v for k, v in subprocess_env.items() if k not in {"CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(VMETAL_VAR_DIR=str(var), PORT=str(free_port()), AGENT_PORT=str(free_port()), VMETAL_LAB="0")
    run = start_bin_run(spawn, env)
    try:
        lab_log = wait_for_text(var / "log" / "lab.log", "the lab is off", run)
        assert "no simulated servers" in lab_log
    finally:
        stderr = stop_bin_run(run)
    assert "vMetal Console: the lab is off (VMETAL_LAB=0): no simulated servers" in stderr


def processes_of(run: subprocess.Popen) -> dict[int, str]:
    """pid → command line of every process in the run's session (bin/run and what it started)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == run.pid:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ProcessLookupError):
                continue
    return found


def end_session(run: subprocess.Popen) -> None:
    """Whatever of the run is left (it should have stopped it all itself)."""
    try:
        os.killpg(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


@pytest.mark.django_db(transaction=True)
def test_a_lab_that_cannot_start_ends_the_run_loudly_with_the_end_of_its_log(subprocess_env, tmp_path, spawn):
    var = tmp_path / "var"
    env = {k: v for k, v in subprocess_env.items() if k not in {"CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(VMETAL_VAR_DIR=str(var), PORT=str(free_port()), AGENT_PORT=str(free_port()), LAB_HOSTS="-1")
    run = start_bin_run(spawn, env)
    try:
        _, stderr = run.communicate(timeout=240)  # before: the run went on, the console without its servers
    finally:
        end_session(run)
    assert run.returncode == 1
    assert "vMetal Console: the lab process stopped (exit status 1); the end of" in stderr
    assert "--hosts and --vms must be 0 or more" in stderr  # the lab's own words, from lab.log


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_dies_ends_the_run_loudly_with_the_end_of_its_log(subprocess_env, tmp_path, spawn):
    var = tmp_path / "var"
    env = {k: v for k, v in subprocess_env.items() if k not in {"CELERY_BROKER_URL", "REDIS_URL"}}
    env.update(VMETAL_VAR_DIR=str(var), PORT=str(free_port()), AGENT_PORT=str(free_port()), VMETAL_LAB="0")
    run = start_bin_run(spawn, env)
    try:
        wait_for_text(var / "log" / "worker.log", " ready.", run)
        worker = next(pid for pid, args in processes_of(run).items() if "vmetal_console worker" in args)
        os.kill(worker, signal.SIGKILL)  # the OOM killer, say
        _, stderr = run.communicate(timeout=60)
    finally:
        end_session(run)
    assert run.returncode == 1
    assert "vMetal Console: the worker process stopped (exit status 137); the end of" in stderr
    assert " ready." in stderr
