"""Shared set-up for the benchmarks: a PostgreSQL database of their own, migrated, and a Celery worker."""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://root@127.0.0.1:5432/vmetal_bench")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/2")
# Queues of the bench's own (vmetal_console/queues.py): its workers, started without -Q, consume every one of them.
os.environ.setdefault("CELERY_QUEUE_PREFIX", f"bench-{uuid.uuid4().hex[:8]}.")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vmetal_console.settings")
os.environ.setdefault("LOG_LEVEL", "WARNING")
from core.keys import throwaway_keys  # noqa: E402

# A production database needs every key (vmetal_console/keys.py): those not given are made for this run, and the
# console processes a bench starts inherit them.
os.environ.update(throwaway_keys())
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")  # required in production; the benches' servers
os.environ.setdefault("VMETAL_LAB", "1")  # the lab app (manage.py lab) is installed for tests and benchmarks


def fresh_database() -> None:
    """Drop and create the bench database, then migrate it."""
    import psycopg
    from django.conf import settings as django_settings

    if django_settings.configured:
        from django.db import connections

        connections.close_all()
    url = os.environ["DATABASE_URL"]
    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


class Worker:
    def __init__(self, concurrency: int = 4, log: str = "/tmp/vmetal-bench-worker.log", queues: tuple[str, ...] = ()):
        """queues: the kinds of vmetal_console.queues it consumes (all when empty)."""
        self.concurrency, self.log, self.queues = concurrency, log, queues

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "vmetal_console", "worker", "-P", "threads", "-c", str(self.concurrency),
             "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "info",
             *(["-Q", ",".join(os.environ["CELERY_QUEUE_PREFIX"] + q for q in self.queues)] if self.queues else [])],
            cwd=ROOT, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while "ready." not in Path(self.log).read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(Path(self.log).read_text()[-2000:])
            time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(15)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
