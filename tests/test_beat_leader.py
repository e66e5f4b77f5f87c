"""Several beat processes on Redis: one sends the periodic tasks, the others wait; the holder killed with SIGKILL,
another takes over within the lock's lease and resumes the same schedule, so no period is sent twice. A Redis
restart that loses every key ends no beat: one of them takes the lock again and sends the schedule anew."""
import os
import re
import signal
import subprocess
import sys
import uuid
from datetime import datetime
from pathlib import Path

import pytest

from conftest import wait_for

from .production_conftest import private_redis  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.postgres,
    pytest.mark.skipif(not os.environ.get("REDIS_URL") and not os.environ.get("CI"),
                       reason="needs Redis (set REDIS_URL=redis://...)"),
]

SENT = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Scheduler: Sending due task "
                  r"(\S+) ", re.M)
EVERY_S = 2  # drive-stale-hosts' period here
LOCK_S = 6


def sends(log: Path, entry: str = "drive-stale-hosts") -> list[datetime]:
    """When this beat sent the entry, from its own log."""
    text = log.read_text() if log.exists() else ""
    return [datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f") for when, name in SENT.findall(text) if name == entry]


def unread_queues() -> dict:
    """The environment that sends a process's tasks to queues of this test's own, which nobody reads."""
    return {"CELERY_QUEUE_PREFIX": f"test-unread-{uuid.uuid4().hex[:12]}."}


def start_beats(spawn, subprocess_env, tmp_path, count: int = 2, **env) -> list[tuple]:
    from tests.api_conftest import watch_child_log

    env = {**subprocess_env, "PYTHONUNBUFFERED": "1", **unread_queues(),
           "DRIVE_STALE_EVERY_S": str(EVERY_S), "BEAT_LOCK_S": str(LOCK_S), **env}
    beats = []
    for i in range(count):
        log = tmp_path / f"beat-{i}.log"
        watch_child_log(log)
        with open(log, "w") as out:
            proc = spawn([sys.executable, "-m", "celery", "-A", "vmetal_console", "beat", "-l", "info",
                          "-s", str(tmp_path / f"beat-{i}-schedule")], cwd=ROOT, env=env, stdout=out,
                         stderr=subprocess.STDOUT)
        beats.append((proc, log))
    return beats


def assert_once_per_period(times: list[datetime]) -> None:
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
    # A period is never sent twice: consecutive sends are a period apart (a beat's tick may land a little early
    # or late, never half a period early).
    assert all(gap >= EVERY_S * 0.5 for gap in gaps), gaps


def test_two_beats_send_each_period_once_and_the_other_takes_over_when_the_holder_is_killed(
        spawn, subprocess_env, tmp_path):
    (first, first_log), (second, second_log) = start_beats(spawn, subprocess_env, tmp_path)
    wait_for(lambda: len(sends(first_log)) + len(sends(second_log)) >= 4, timeout=60)
    holder, holder_log, other_log = ((first, first_log, second_log) if sends(first_log)
                                     else (second, second_log, first_log))
    assert sends(other_log) == []  # the other one waits for the lock
    assert_once_per_period(sends(holder_log))

    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait(10)
    killed_at = datetime.now()
    last = sends(holder_log)[-1]
    # The lock lapses LOCK_S after its last renewal; the waiting beat looks every LOCK_S / 4.
    wait_for(lambda: len(sends(other_log)) >= 3, timeout=LOCK_S * 3 + 15)
    taken = sends(other_log)
    assert (taken[0] - killed_at).total_seconds() <= 30, (killed_at, taken[0])  # the lease's promise
    assert "Acquired lock" in other_log.read_text()
    # The same schedule goes on: the first send of the new holder is a period or more after the dead one's last.
    assert_once_per_period([*sends(holder_log), *taken])
    assert taken[0] > last


def test_a_redis_restart_that_loses_every_key_ends_no_beat_and_one_of_them_sends_the_schedule_again(
        spawn, subprocess_env, tmp_path, private_redis):
    beats = start_beats(spawn, subprocess_env, tmp_path, CELERY_BROKER_URL=f"{private_redis.url}/0",
                        REDIS_URL=f"{private_redis.url}/1")
    logs = [log for _, log in beats]

    def all_sends() -> list[datetime]:
        return sorted(when for log in logs for when in sends(log))

    wait_for(lambda: len(all_sends()) >= 2, timeout=60)
    private_redis.stop()  # nothing saved: the lock, the schedule and its last runs are gone with it
    # Each beat notices (the holder at its next tick, the other at its next look at the lock) and stays up.
    wait_for(lambda: all("Redis unreachable" in log.read_text() for log in logs), timeout=LOCK_S * 2 + 15)
    before = len(all_sends())
    private_redis.start()
    wait_for(lambda: len(all_sends()) >= before + 3, timeout=LOCK_S * 3 + 15)
    assert all(proc.poll() is None for proc, _ in beats)
    text = "".join(log.read_text() for log in logs)
    assert "installing it again" in text
    # One beat holds the lock again: the two together still send each period once.
    assert_once_per_period(all_sends())
