"""Shared test fixtures: manifests applied the way users apply them, the demo site, database facts."""
import os
import shutil
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.factories")  # its builders' asserts explain themselves, as a test's do
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

ROOT = Path(__file__).resolve().parent
# Every response, websocket frame and log record of every test (and what the browser, daphne and Celery
# workers get or log) is checked for secrets: BMC credentials, kubeconfigs, API tokens, agent and bootstrap
# tokens (tests/api_conftest.py).
pytest_plugins = ["tests.api_conftest"]
FIXTURES = ROOT / "tests" / "fixtures"
DEMO = ROOT / "demo"


@pytest.fixture(autouse=True)
def _secrets_never_leave(no_secrets_leak):
    pass


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


# The lanes: a test that uses one of these fixtures (directly or through another fixture) gets the marker, and
# `./bin/test --fast` (pytest --fast) leaves it out. Fixtures of test modules count too (vm_lab, listener's spawn).
LANE_FIXTURES = {
    # Child processes, and schemathesis's generated requests through the WSGI application (minutes of CPU).
    "slow": {"celery_worker_process", "console_server", "watcher", "spawn", "production_venv", "wsgi_app"},
    # The lab's simulated servers, agents and tenant APIs; its BMC emulator (sushy-tools, a child process), also as
    # the test modules' own fixtures that start it (lab, redfish).
    "lab": {"lab_factory", "lab_sites", "redfish_labs", "lab", "redfish"},
    "browser": {"browser"},  # Chromium
    "vm": {"images", "vm_lab", "vm_console"},  # QEMU VMs and their images
}


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="the fast lane: leave out the tests marked " + ", ".join(LANE_FIXTURES))


@pytest.fixture(autouse=True)
def fast_password_hashes(request):
    """Tests of the fast lane hash passwords with MD5: the fixtures make several users per test, and PBKDF2's
    million rounds cost about 0.4 s each. A test with a child process (a console, a worker) keeps the
    production hasher, which that process must read too; PBKDF2 stays second so its hashes still check."""
    if any(request.node.get_closest_marker(marker) for marker in LANE_FIXTURES):
        yield
        return
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher",
                                             "django.contrib.auth.hashers.PBKDF2PasswordHasher"]):
        yield


def pytest_collection_modifyitems(config, items):
    """Each test is put in its lane by the fixtures it uses (LANE_FIXTURES); --fast deselects all but the fast
    lane. `postgres` tests skip on SQLite for a newcomer's quick run, and `vm` tests where QEMU is not installed,
    but never in CI: there they must run (.ci/run installs QEMU)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in LANE_FIXTURES.items():
            if used & fixtures and marker not in item.keywords:
                item.add_marker(marker)
    if config.getoption("fast"):
        slow = [item for item in items if any(marker in item.keywords for marker in LANE_FIXTURES)]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item not in set(slow)]
    if os.environ.get("CI"):
        return
    skips = {}
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        skips["postgres"] = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    if not os.environ.get("REDIS_URL"):
        skips["redis"] = pytest.mark.skip(reason="needs Redis's channel layer (set REDIS_URL=redis://...)")
    if shutil.which("qemu-system-x86_64") is None:
        skips["vm"] = pytest.mark.skip(reason="needs QEMU: qemu-system-x86_64 is not installed "
                                              "(apt-get install qemu-system-x86)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def apply(tmp_path, capsys):
    """apply(text, tenant=None, name="manifest.yaml") → the command's output lines, as `manage.py apply`."""

    def run(*texts: str, tenant: str | None = None, dry_run: bool = False, names: list[str] | None = None):
        args = []
        for i, text in enumerate(texts):
            path = tmp_path / (names[i] if names else f"manifest{i}.yaml")
            path.write_text(text)
            args += ["-f", str(path)]
        if tenant:
            args += ["--tenant", tenant]
        if dry_run:
            args.append("--dry-run")
        capsys.readouterr()
        call_command("apply", *args)
        return capsys.readouterr().out.splitlines()

    return run


@pytest.fixture
def demo_site(apply):
    """The demo's provider, node types (gpu-server, cpu-server), image, network and 8 available hosts."""
    return apply((DEMO / "site.yaml").read_text(), (DEMO / "hosts.yaml").read_text())


@pytest.fixture
def seed_block() -> str:
    return (FIXTURES / "seed-private-nodes.yaml").read_text()


@pytest.fixture
def subprocess_env(settings):
    """Environment for a child process (manage.py, a Celery worker) that must use this test's database.
    Only committed rows are visible to it: use it with django_db(transaction=True)."""
    db = connection.settings_dict
    env = dict(os.environ)
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    else:
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    # With Redis, beat's lock is named by the database: a beat killed by one test keeps the next test's beat
    # (same test database) waiting at most this long.
    env.setdefault("BEAT_LOCK_S", "6")
    return env


@pytest.fixture
def worker_settings() -> dict:
    """Environment overrides for the worker process (a test may request and fill this first)."""
    return {}


@pytest.fixture
def celery_worker_process(subprocess_env, tmp_path, worker_settings, settings):
    """A real Celery worker (a child process) on the configured broker, on queues of its own: every queue name of
    this test starts with a prefix of its own (CELERY_QUEUE_PREFIX, read by the worker and by this process's sends
    alike), so tests running in parallel never take each other's tasks. It consumes every queue of the prefix, or
    the kinds in worker_settings["QUEUE_KINDS"] (comma separated), plus every queue of each prefix in
    worker_settings["EXTRA_QUEUE_PREFIXES"]. Yields a handle with .restart(), .kill() and .another(kinds), a
    second worker of the same test on other kinds."""
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from tests.api_conftest import watch_child_log
    from vmetal_console import queues as celery_queues
    from vmetal_console.celery import app

    prefix = f"test-{uuid.uuid4().hex[:12]}."
    settings.CELERY_QUEUE_PREFIX = prefix  # this process's sends (vmetal_console.queues.route reads it at each)
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = celery_queues.queue_name(prefix, celery_queues.DEFAULT)
    consumed = set()

    class Worker:
        proc = None

        def __init__(self, name: str = "worker", kinds: str | None = None):
            self.log, self.kinds = tmp_path / f"{name}.log", kinds

        def queues(self) -> list[str]:
            kinds = [k for k in (self.kinds or worker_settings.get("QUEUE_KINDS") or "").split(",") if k]
            names = [celery_queues.queue_name(prefix, kind) for kind in kinds or celery_queues.KINDS]
            for extra in filter(None, worker_settings.get("EXTRA_QUEUE_PREFIXES", "").split(",")):
                names += [celery_queues.queue_name(extra, kind) for kind in celery_queues.KINDS]
            return names

        def start(self):
            # Read worker_settings now: a test may change them and restart the worker.
            env = {**subprocess_env, "CELERY_QUEUE_PREFIX": prefix, "PYTHONUNBUFFERED": "1",
                   "CELERY_BEAT_SCHEDULE_FILENAME": str(tmp_path / "celerybeat-schedule"), **worker_settings}
            beat = ["-B"] if worker_settings.get("WITH_BEAT") else []
            names = self.queues()
            consumed.update(names)
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "vmetal_console", "worker", "-Q", ",".join(names),
                 "-P", "threads", "-c", "4", "-n", f"{self.log.stem}@%h", "--without-heartbeat",
                 "--without-gossip", "--without-mingle", "-l", "info", *beat],
                cwd=ROOT, env=env, stdout=open(self.log, "a"), stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + 30
            while "ready." not in self.log.read_text():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"celery worker did not start:\n{self.log.read_text()[-3000:]}")
                time.sleep(0.1)

        def kill(self, sig=signal.SIGKILL):
            if self.proc and self.proc.poll() is None:
                os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:  # a warm shutdown waits for its tasks (a BMC that never answers)
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)

        def another(self, kinds: str) -> "Worker":
            other = Worker(f"worker-{len(workers)}", kinds)
            watch_child_log(other.log)
            workers.append(other)
            other.start()
            return other

    worker = Worker()
    workers = [worker]
    watch_child_log(worker.log)  # no secret in what the worker logs (tests/api_conftest.py)
    worker.start()
    yield worker
    for each in workers:
        each.kill(signal.SIGTERM)
    app.conf.task_default_queue = previous
    # What is left in this test's queues (a killed worker's, a flood's) would lie in the shared broker for good.
    from kombu.exceptions import OperationalError

    try:
        with app.connection_for_write() as connection:
            for name in sorted(consumed):
                if name.startswith(prefix):
                    celery_queues.queue(name)(connection.default_channel).purge()
    except (OperationalError, OSError):  # a broker a test stopped: nothing to purge it of
        pass
    # Shown by pytest only when the test failed ("Captured stdout teardown"): what the worker did last.
    for each in workers:
        print(f"--- the Celery {each.log.stem}'s log, last lines ---\n"
              + "\n".join(each.log.read_text().splitlines()[-80:]))


def agent_client_class():
    """django.test.Client on the agent listener's URLs (the agent protocol, the boot path), which the public
    listener, and so the plain `client`, does not serve."""
    from django.conf import settings
    from django.test import Client
    from django.test.client import ClientHandler

    class AgentClientHandler(ClientHandler):
        def get_response(self, request):
            request.urlconf = settings.AGENT_URLCONF
            return super().get_response(request)

    class AgentClient(Client):
        def __init__(self, **defaults):
            super().__init__(**defaults)
            self.handler = AgentClientHandler()

    return AgentClient


def agent_lookup_body(body: dict) -> dict:
    """A lookup as a freshly booted agent sends it: for a host booting the ramdisk, the console starts a new
    boot and the body carries that boot's secret, as the boot path would have delivered it."""
    from hosts.boot.ramdisk import ramdisk_boot_start
    from hosts.lifecycle import AGENT_STATES
    from hosts.models import BareMetalHost

    macs = [m.lower() for m in body.get("macs") or [] if isinstance(m, str)]
    host = BareMetalHost.objects.filter(boot_mac__in=macs, state__in=AGENT_STATES).first()
    if host is None or "boot_secret" in body:
        return body
    return {**body, "boot_secret": ramdisk_boot_start(host=host, flow_id=(host.flow or {}).get("id", "")).secret}


@pytest.fixture
def agent_client():
    return agent_client_class()()


@pytest.fixture
def agent_server(transactional_db, settings, worker_settings):
    """The agent listener, live, in a thread of the test process: what the lab's servers boot from and their
    agents call. Its URL is AGENT_BOOT_URL here and for workers started after it."""
    from types import SimpleNamespace

    from django.test.testcases import LiveServerThread

    from hosts.protocol.listener import AgentListener

    thread = LiveServerThread("127.0.0.1", static_handler=lambda app: AgentListener())
    thread.daemon = True
    thread.start()
    thread.is_ready.wait()
    if thread.error:
        raise thread.error
    url = f"http://127.0.0.1:{thread.port}"
    settings.AGENT_BOOT_URL = worker_settings["AGENT_BOOT_URL"] = url
    # The names a listener process answers to besides ALLOWED_HOSTS (hosts.protocol.listener.application): here its bind,
    # and the lab's VMs' name for this machine (lab.redfish.GUEST_HOST), where a test's AGENT_BOOT_URL points.
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "10.0.2.2"]
    yield SimpleNamespace(url=url)
    thread.terminate()


@pytest.fixture
def spawn():
    """spawn(args, **Popen arguments) → a long-running child process (a server, a watcher, `bin/run`) in a session
    of its own; whatever of it still runs when the test ends is killed. Its tests run in the slow lane."""
    import signal
    import subprocess

    started = []

    def start(args, **kwargs):
        started.append(subprocess.Popen(args, start_new_session=True, **kwargs))
        return started[-1]

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


@pytest.fixture
def lab_sites(tmp_path):
    """lab_sites(**LabSite arguments) → a lab (not started yet) that is stopped when the test ends, if it runs."""
    from lab.site import LabSite

    made = []

    def make(**kwargs):
        made.append(LabSite(**kwargs))
        return made[-1]

    yield make
    for site in made:
        site.stop()


@pytest.fixture
def redfish_labs():
    """redfish_labs(systems, user, password, **RedfishLab arguments) → the lab's BMC emulator (not started yet:
    start it, or use it as a context manager), stopped when the test ends if it still runs."""
    from lab.redfish import RedfishLab

    made = []

    def make(*args, **kwargs):
        made.append(RedfishLab(*args, **kwargs))
        return made[-1]

    yield make
    for lab in made:
        if lab.running:
            lab.stop()


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.1):
    """Poll until predicate() is truthy; returns its value or fails with the timeout."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
