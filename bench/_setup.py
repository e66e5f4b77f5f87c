"""Shared set-up for the benchmarks: a PostgreSQL database of their own, migrated, and a Celery worker."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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


CLK = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes and their children (from /proc)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
        total += (utime + stime + cutime + cstime) / CLK
    return total


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Console:
    """The console's own processes, served as in production: agent listeners (`manage.py agent-listener`, the agent
    protocol and the boot path), Celery workers with beat, each process with its own bounded PostgreSQL connection
    pool (DATABASE_POOL_MAX). `balanced`: the servers reach the listeners through a round-robin TCP balancer
    (bench/_balancer.py, as a load balancer in production; its CPU is not the console's), whatever their number.
    `separate_beat`: beat runs as a process of its own (`celery beat`, as deploy/systemd runs it), not inside the
    first worker; it holds no PostgreSQL pool (it only sends tasks)."""

    def __init__(self, workers: int, threads: int, web_pool: int, listeners: int = 1, balanced: bool = False,
                 separate_beat: bool = False):
        ports = [free_port() for _ in range(listeners)]
        self.port = ports[0]
        self.logs = Path(tempfile.mkdtemp(prefix="vmetal-fleet-"))
        self.balancer = None
        if balanced:
            # Another loopback address: a boot URL on the listeners' own address with another port is refused.
            front = "127.0.0.2:" + str(free_port("127.0.0.2"))
            self.balancer = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "_balancer.py"), front,
                 ",".join(f"127.0.0.1:{p}" for p in ports)], stdout=open(self.logs / "balancer.log", "w"),
                stderr=subprocess.STDOUT, start_new_session=True)
            self.url = f"http://{front}"
        else:
            self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LOG_LEVEL": "WARNING", "CELERY_BEAT_SCHEDULE_FILENAME": str(self.logs / "beat"),
               "DEBUG": "False",  # as in production: no query log kept per connection
               "AGENT_LISTEN": f"127.0.0.1:{self.port}", "AGENT_BOOT_URL": self.url}
        # Connections: web_pool for each listener, threads + 1 per worker; the bench's own one on top.
        self.connections = listeners * web_pool + workers * (threads + 1) + 1
        self.listeners = listeners
        self.procs = [subprocess.Popen(
            [sys.executable, "manage.py", "agent-listener", "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT, env={**env, "AGENT_LISTEN": f"127.0.0.1:{port}", "DATABASE_POOL_MAX": str(web_pool)},
            stdout=open(self.logs / f"web{i}.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
            for i, port in enumerate(ports)]
        for i in range(workers):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "vmetal_console", "worker", "-P", "threads",
                 "-c", str(threads), "-n", f"w{i}@%h",
                 "--without-heartbeat", "--without-gossip", "--without-mingle",
                 "-l", os.environ.get("FLEET_WORKER_LOG", "warning"),
                 *(["-B"] if i == 0 and not separate_beat else [])],
                cwd=ROOT, env={**env, "DATABASE_POOL_MAX": str(threads + 1)},
                stdout=open(self.logs / f"worker{i}.log", "w"), stderr=subprocess.STDOUT,
                start_new_session=True))
        self.names = [f"web{i}" for i in range(listeners)] + [f"worker{i}" for i in range(workers)]
        if separate_beat:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "vmetal_console", "beat", "-l", "warning"],
                cwd=ROOT, env={**env, "DATABASE_POOL_MAX": "1"}, stdout=open(self.logs / "beat.log", "w"),
                stderr=subprocess.STDOUT, start_new_session=True))
            self.names.append("beat")
            self.connections += 1
        endpoints = [("127.0.0.1", port) for port in ports]
        if balanced:
            endpoints.append(("127.0.0.2", int(self.url.rsplit(":", 1)[1])))
        deadline = time.monotonic() + 30
        for host, port in endpoints:
            while True:
                try:
                    socket.create_connection((host, port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs[:listeners]):
                        raise RuntimeError("\n".join((self.logs / f"web{i}.log").read_text() for i in range(listeners)))
                    time.sleep(0.2)
        time.sleep(2)  # workers connect
        self.profilers = []

    def profile(self, directory: Path, n: int, lab: dict[str, int]) -> None:
        """Sample the console's processes, and the lab's (`lab`: name → pid), with py-spy (pip install py-spy)
        until stop_profiling()."""
        spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
        if not spy:
            raise SystemExit("--profile needs py-spy on PATH (or PY_SPY=/path/to/py-spy)")
        directory.mkdir(parents=True, exist_ok=True)
        console = {name: p.pid for name, p in zip(self.names, self.procs)}
        for name, pid in {**console, **lab}.items():
            self.profilers.append(subprocess.Popen(
                [spy, "record", "--nonblocking", "--gil", "--subprocesses", "-r", "50", "-f", "raw",
                 "-o", str(directory / f"n{n}-{name}.txt"), "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop_profiling(self) -> None:
        for p in self.profilers:
            p.send_signal(signal.SIGINT)
        for p in self.profilers:
            p.wait(30)
        self.profilers = []

    def cpu(self) -> float:
        return cpu_seconds([p.pid for p in self.procs])

    def web_cpu(self) -> float:
        return cpu_seconds([p.pid for p in self.procs[:self.listeners]])

    def stop(self):
        for p in self.procs + ([self.balancer] if self.balancer else []):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs + ([self.balancer] if self.balancer else []):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def backends() -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend serving the bench database (the console's pools)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
        pids = [row[0] for row in cursor.fetchall()]
    return {pid: cpu_seconds([pid]) for pid in pids}


def busy() -> tuple[float, float]:
    """The whole machine's busy and total CPU time so far (every process, other people's included)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / CLK, sum(fields) / CLK


def transactions() -> int:
    """Committed transactions in the bench database so far (each autocommit query is one)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]
