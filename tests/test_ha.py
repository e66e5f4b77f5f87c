"""Two of every process, any one of them may die: two Celery workers, two beats, two pod watchers and two agent
listeners (behind a round-robin proxy, as the provisioning network's load balancer) run as separate processes on
PostgreSQL and Redis while the lab's servers are provisioned and released, and one process of each kind is killed
with SIGKILL in turn mid-flow (and started again, as systemd would). No claim is lost, no host serves two claims,
none passes a deadline, every release is erased before the host is free again, each kind is back to normal within
60 s of its kill, and no beat period is sent twice."""
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db.models import Count

from conftest import DEMO, ROOT, wait_for
from lab.site import ROOMY_NETWORK
from vmetal_console import queues as celery_queues

from .autonodes_lab_conftest import dynamic_pool
from .lab_conftest import FAST, gpu_pool, lab_report

pytest_plugins = ["tests.lab_conftest", "tests.autonodes_lab_conftest"]
pytestmark = [
    pytest.mark.django_db(transaction=True), pytest.mark.postgres,
    pytest.mark.skipif(not os.environ.get("REDIS_URL") and not os.environ.get("CI"),
                       reason="needs Redis (set REDIS_URL=redis://...)"),
]

HOSTS = int(os.environ.get("HA_TEST_HOSTS", "20"))  # fewer by hand, to look at one thing
BACK_S = 60  # each kind back to normal within this of its kill
# Beat's periods here (FAST, and the defaults of the others this test looks at).
PERIODS = {"drive-stale-hosts": 2, "reconcile-pools": 5, "autonodes-disrupt": 10, "sweep-overdue-hosts": 30}
SENT = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] Scheduler: Sending due task "
                  r"(\S+) ", re.M)


def free_address(host: str) -> tuple[str, int]:
    with socket.socket() as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]


class Proxy:
    """A TCP load balancer in front of the agent listeners: each new connection goes to the next listener that
    accepts it (a dead one is passed over), as a provisioning network's balancer or VIP would."""

    def __init__(self, backends: list[tuple[str, int]]):
        self.backends = backends
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self._next = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket):
        upstream = None
        for _ in range(len(self.backends)):
            backend = self.backends[self._next % len(self.backends)]
            self._next += 1
            try:
                upstream = socket.create_connection(backend, timeout=2)
                break
            except OSError:
                continue
        if upstream is None:
            client.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self):
        self.server.close()


class Topology:
    """Two of each console process, started (and started again after a kill) with the same environment."""

    def __init__(self, spawn, env: dict, logs: Path, listeners: list[tuple[str, int]], queues: list[str]):
        self.spawn, self.env, self.logs, self.queues = spawn, env, logs, queues
        self.listeners = listeners
        self.procs: dict[tuple[str, int], subprocess.Popen] = {}
        self.log_of: dict[tuple[str, int], Path] = {}
        self.all_logs: dict[str, list[Path]] = {}

    def command(self, kind: str, i: int) -> list[str]:
        celery = [sys.executable, "-m", "celery", "-A", "vmetal_console"]
        return {
            "worker": [*celery, "worker", "-Q", ",".join(self.queues), "-P", "threads", "-c", "4",
                       "-n", f"w{i}-{uuid.uuid4().hex[:6]}@%h", "--without-heartbeat", "--without-gossip",
                       "--without-mingle", "-l", "info"],
            "beat": [*celery, "beat", "-l", "info", "-s", str(self.logs / f"beat-{i}-schedule")],
            "watcher": [sys.executable, "manage.py", "watch-pods"],
            "listener": [sys.executable, "manage.py", "agent-listener", "--bind", "{}:{}".format(*self.listeners[i])],
        }[kind]

    def start(self, kind: str, i: int) -> subprocess.Popen:
        from tests.api_conftest import watch_child_log

        log = self.logs / f"{kind}-{i}-{len(self.all_logs.get(kind, []))}.log"
        watch_child_log(log)
        self.all_logs.setdefault(kind, []).append(log)
        env = self.env
        if kind == "listener":
            env = {**env, "AGENT_LISTEN": "{}:{}".format(*self.listeners[i])}
        with open(log, "w") as out:
            self.procs[kind, i] = self.spawn(self.command(kind, i), cwd=ROOT, env=env, stdout=out,
                                             stderr=subprocess.STDOUT)
        self.log_of[kind, i] = log
        return self.procs[kind, i]

    def kill(self, kind: str, i: int) -> float:
        """SIGKILL, then started again at once (as systemd's Restart=always); → when it was killed."""
        proc = self.procs[kind, i]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        self.start(kind, i)
        return killed

    def text(self, kind: str) -> str:
        return "".join(log.read_text() for log in self.all_logs.get(kind, []) if log.exists())


def sends(text: str) -> dict[str, list[datetime]]:
    found: dict[str, list[datetime]] = {}
    for when, name in SENT.findall(text):
        found.setdefault(name, []).append(datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f"))
    return found


def beat_sends(topology: Topology) -> dict[str, list[datetime]]:
    merged: dict[str, list[datetime]] = {}
    for log in topology.all_logs.get("beat", []):
        for name, times in sends(log.read_text()).items():
            merged.setdefault(name, []).extend(times)
    return {name: sorted(times) for name, times in merged.items()}


def sending_beat(topology: Topology) -> int:
    """The beat that sent last: the holder of the lock."""
    def latest(i: int) -> datetime:
        times = [t for ts in sends(topology.log_of["beat", i].read_text()).values() for t in ts]
        return max(times, default=datetime.min)

    return max(range(2), key=latest)


def answers_http(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=2) as s:
            s.sendall(b"GET /no-such-path HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.1")
    except OSError:
        return False


def claims_by_phase() -> dict[str, int]:
    from claims.models import NodeClaim

    return dict(NodeClaim.objects.values_list("phase").annotate(Count("pk")))


@pytest.mark.timeout(1200)  # about 4 minutes alone; more beside the rest of the suite
def test_two_of_every_process_provision_and_release_while_one_of_each_kind_is_killed(
        spawn, lab_sites, subprocess_env, tmp_path, settings, apply):
    from autonodes.choices import WatchState
    from autonodes.models import TenantWatch
    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost, EraseCertificate
    from manifests.apply import apply_files
    from pools.models import NodeType, Tenant

    for key, value in FAST.items():
        if hasattr(settings, key):
            setattr(settings, key, type(getattr(settings, key))(float(value)))
    # Queues of this test's own, consumed by its two workers, sent to by every process (this one included).
    prefix = f"test-{uuid.uuid4().hex[:12]}."
    settings.CELERY_QUEUE_PREFIX = prefix
    queues = [celery_queues.queue_name(prefix, kind) for kind in celery_queues.KINDS]
    # The listeners on addresses of their own (the proxy's is the servers' boot URL), as on two machines.
    listeners = [free_address("127.0.0.2"), free_address("127.0.0.3")]
    proxy = Proxy(listeners)
    env = {**subprocess_env, **FAST, "PYTHONUNBUFFERED": "1",
           "CELERY_QUEUE_PREFIX": prefix,
           "AGENT_BOOT_URL": proxy.url, "BEAT_LOCK_S": "6", "AUTONODES_WATCH_LEASE_S": "6",
           "AUTONODES_WATCH_POLL_S": "1", "BROKER_VISIBILITY_TIMEOUT_S": "40",
           "AGENT_CALL_ADDRESS_LIMIT": "1000000",  # every lab agent calls from 127.0.0.1
           # Twenty agents in threads of this process on a loaded machine: silences and power waits of seconds
           # are load, not faults (this test kills processes, it plays no fault of a server).
           "AGENT_SILENCE_S": "30", "POWER_DEADLINE_S": "30", "POWER_STEP_DEADLINE_S": "90", "BMC_TIMEOUT_S": "10",
           "AGENT_LOOKUP_DEADLINE_S": "180", "AGENT_COMMAND_DEADLINE_S": "300"}  # 20 GPU resets at once: about 60 s
    topology = Topology(spawn, env, tmp_path, listeners, queues)
    try:
        for kind in ("listener", "worker", "beat", "watcher"):
            for i in range(2):
                topology.start(kind, i)
        wait_for(lambda: all(answers_http(address) for address in listeners), timeout=60)
        wait_for(lambda: topology.text("worker").count("ready.") >= 2, timeout=60)

        site = lab_sites(hosts=HOSTS, gpu_hosts=HOSTS, tenants=["one", "auto-a", "auto-b"], console_url=proxy.url,
                         agent_mode="thread", power_delay=(0.2, 0.5), var_dir=tmp_path / "lab").start()
        call_command("apply", "-f", str(DEMO / "site.yaml"), verbosity=0)
        apply_files([("network", ROOMY_NETWORK)], actor="test")
        NodeType.objects.filter(name="gpu-server").update(warm_hosts=0)
        site.register()
        for tenant in ("auto-a", "auto-b"):  # a dynamic pool each: the pod watchers' work, one tenant each
            apply(dynamic_pool(nodes=1), tenant=tenant)
        watched = Tenant.objects.filter(name__in=["auto-a", "auto-b"])
        try:  # registration and intake: the longest part on a loaded machine
            wait_for(lambda: BareMetalHost.objects.filter(state="available").count() == HOSTS, timeout=360)
        except AssertionError:
            raise AssertionError(f"registration\n{lab_report()}") from None

        def watchers_normal() -> bool:
            live = {f":{p.pid}:" for (kind, _), p in topology.procs.items() if kind == "watcher"}
            rows = list(TenantWatch.objects.filter(tenant__in=watched))
            return len(rows) == 2 and all(w.state == WatchState.WATCHING and any(pid in w.holder for pid in live)
                                          for w in rows)

        wait_for(watchers_normal, timeout=BACK_S)
        back: dict[str, float] = {}

        # Provisioning: a worker killed as the first hosts provision, a listener once the first claim is Available.
        apply(gpu_pool(HOSTS), tenant="one")
        wait_for(lambda: BareMetalHost.objects.filter(state="provisioning").exists(), timeout=60)
        killed = topology.kill("worker", 0)
        wait_for(lambda: "ready." in topology.log_of["worker", 0].read_text()
                 and " succeeded in " in topology.log_of["worker", 0].read_text(), timeout=BACK_S)
        back["worker"] = time.monotonic() - killed

        wait_for(lambda: NodeClaim.objects.filter(phase="Available").exists(), timeout=120)
        killed = topology.kill("listener", 1)
        wait_for(lambda: answers_http(listeners[1]), timeout=BACK_S)
        back["listener"] = time.monotonic() - killed

        try:
            wait_for(lambda: claims_by_phase() == {"Available": HOSTS}, timeout=240)
        except AssertionError:
            raise AssertionError(f"claims: {claims_by_phase()}\n{lab_report()}") from None
        provisioned = dict(NodeClaim.objects.values_list("name", "host_id"))
        assert len(set(provisioned.values())) == HOSTS  # one host per claim, each host one claim

        # Release: the beat that sends killed as the release starts, then the watcher holding auto-a's watch.
        apply(gpu_pool(0), tenant="one")
        wait_for(lambda: BareMetalHost.objects.exclude(state__in=["provisioned", "available"]).exists(), timeout=60)
        killed_beat, killed = datetime.now(), topology.kill("beat", sending_beat(topology))
        wait_for(lambda: any(t > killed_beat for t in beat_sends(topology).get("drive-stale-hosts", [])),
                 timeout=BACK_S)
        back["beat"] = time.monotonic() - killed

        auto_a = TenantWatch.objects.get(tenant__name="auto-a").holder
        victim = next(i for i in range(2) if f":{topology.procs['watcher', i].pid}:" in auto_a)
        killed = topology.kill("watcher", victim)
        wait_for(watchers_normal, timeout=BACK_S)
        back["watcher"] = time.monotonic() - killed

        try:
            wait_for(lambda: claims_by_phase() == {"Released": HOSTS}
                     and BareMetalHost.objects.filter(state="available").count() == HOSTS, timeout=240)
        except AssertionError:
            raise AssertionError(f"claims: {claims_by_phase()}\n{lab_report()}") from None
    finally:
        proxy.close()

    assert set(back) == {"worker", "listener", "beat", "watcher"}
    assert all(seconds <= BACK_S for seconds in back.values()), back
    # No host passed a deadline; none failed.
    assert not Event.objects.filter(message__contains="deadline exceeded").exists()
    assert not BareMetalHost.objects.exclude(state="available").exists()
    # Every release was erased, certified, before its host was free again.
    for claim_name, host_id in provisioned.items():
        certificates = EraseCertificate.objects.filter(host_id=host_id, claim_name=claim_name)
        assert certificates.exists() and not certificates.exclude(result="pass").exists(), claim_name
        freed = Event.objects.filter(host_id=host_id, to_state="available",
                                     created_at__gt=certificates.order_by("created_at").first().created_at)
        assert freed.exists(), claim_name
    # Each period sent once: consecutive sends of an entry, whichever beat sent them, a period apart (a tick may
    # land a little early or late, never half a period early).
    for name, times in beat_sends(topology).items():
        if name in PERIODS:
            gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:])]
            assert all(gap >= PERIODS[name] * 0.5 for gap in gaps), (name, gaps)
    assert "Traceback" not in topology.text("beat") + topology.text("watcher")
