"""The agent listener faces the provisioning network: `manage.py agent-listener` answers an unknown path with its own
404 and a malformed request with 400, still answers while 800 connections hold half-sent requests (its threads and
memory stay bounded), and takes a burst of 100 connections at once into its backlog."""
import http.client
import json
import re
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .api_conftest import watch_child_log

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)
    return value


class Listener:
    def __init__(self, spawn, env: dict, log: Path, **settings: str):
        self.port = free_port()
        self.log = log
        env = {**{k: v for k, v in env.items() if k != "AGENT_BOOT_URL"}, "AGENT_LISTEN": f"127.0.0.1:{self.port}",
               "PYTHONUNBUFFERED": "1", "AGENT_LISTENER_THREADS": str(THREADS), **settings}
        self.proc = spawn([sys.executable, "manage.py", "agent-listener"], cwd=ROOT, env=env, stdout=open(log, "w"),
                          stderr=subprocess.STDOUT)
        watch_child_log(log)
        wait_until(lambda: self.proc.poll() is not None or self._listening(), what="the listener listens")
        assert self.proc.poll() is None, log.read_text()

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def request(self, raw: bytes, timeout: float = 30.0) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(raw)
            return read_answer(s)

    def get(self, path: str, host: str = "127.0.0.1") -> tuple[int, object]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path, headers={"Host": host})
            answer = connection.getresponse()
            body = answer.read()
        finally:
            connection.close()
        is_json = answer.getheader("Content-Type", "").startswith("application/json")
        return answer.status, json.loads(body) if is_json else body

    def proc_status(self) -> dict[str, int]:
        fields = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("Threads", "VmRSS"):
                fields[name] = int(value.split()[0])
        return fields

    def open_sockets(self) -> int:
        fds = Path(f"/proc/{self.proc.pid}/fd")
        count = 0
        for fd in fds.iterdir():
            try:
                count += os.readlink(fd).startswith("socket:")
            except OSError:
                pass
        return count

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def read_answer(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.fixture
def listener(subprocess_env, tmp_path, spawn):
    started = []

    def start(**settings):
        started.append(Listener(spawn, subprocess_env, tmp_path / f"listener-{len(started)}.log", **settings))
        return started[-1]

    yield start
    for one in started:
        one.stop()


def test_an_unknown_path_is_a_404_of_the_listeners_own_not_a_500(listener):
    server = listener()
    assert server.get("/nope") == (404, {"error": "not found"})
    assert server.get("/tenants/") == (404, {"error": "not found"})  # a console page: not on this listener


def test_a_malformed_request_is_a_400_and_the_listener_goes_on(listener):
    server = listener()
    assert re.match(rb"HTTP/1\.[01] 400 ", server.request(b"GARBAGE\r\n\r\n"))
    assert re.match(rb"HTTP/1\.[01] 400 ", server.request(b"GET /agent/lookup HTTP/1.1\r\nContent-Length: nine\r\n\r\n"))
    assert server.get("/nope", host="evil.example") == (400, {"error": "bad request"})  # not its name
    assert server.get("/nope")[0] == 404


def test_the_listener_answers_to_its_boot_urls_name_as_well_as_allowed_hosts(listener):
    server = listener(ALLOWED_HOSTS="console.example.com", AGENT_BOOT_URL="http://10.9.8.7:8001")
    assert server.get("/nope", host="10.9.8.7:8001")[0] == 404
    assert server.get("/nope", host="127.0.0.1")[0] == 404  # its bind (AGENT_LISTEN)
    assert server.get("/nope", host="console.example.com")[0] == 404
    assert server.get("/nope", host="evil.example")[0] == 400


def test_800_half_sent_requests_leave_a_normal_request_answered_and_threads_and_memory_bounded(listener):
    server = listener(AGENT_LISTENER_IDLE_S="600")
    assert server.get("/nope")[0] == 404  # warmed up: Django loaded, the thread pool started
    before = server.proc_status()
    slow = []
    try:
        for _ in range(800):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"POST /agent/lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"macs\":")
            slow.append(s)
        wait_until(lambda: server.open_sockets() >= 800, what="the listener holds all 800")
        assert server.get("/nope") == (404, {"error": "not found"})
        during = server.proc_status()
        assert during["Threads"] <= before["Threads"] + 2, (before, during)  # no thread per connection
        assert during["Threads"] <= THREADS + 8
        assert during["VmRSS"] - before["VmRSS"] < 64 * 1024, (before, during)  # KiB: well under 80 KiB each
    finally:
        for s in slow:
            s.close()


def test_a_burst_of_100_connections_is_accepted_even_while_the_listener_is_not_accepting(listener):
    server = listener()
    assert server.get("/nope")[0] == 404
    os.killpg(server.proc.pid, signal.SIGSTOP)  # the kernel alone takes the burst, into the listen backlog
    burst = []
    try:
        for _ in range(100):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", server.port))
            burst.append(s)
        pending = set(burst)

        def all_connected():
            _, writable, _ = select.select([], list(pending), [], 0.1)
            for s in writable:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    pending.discard(s)
            return not pending

        wait_until(all_connected, timeout=10, what=f"all 100 connected ({len(pending)} still waiting)")
        for s in burst:
            s.setblocking(True)
            s.settimeout(30)
            s.sendall(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        os.killpg(server.proc.pid, signal.SIGCONT)
        answers = [read_answer(s) for s in burst]
        assert all(re.match(rb"HTTP/1\.[01] 404 ", a) for a in answers), answers
    finally:
        os.killpg(server.proc.pid, signal.SIGCONT)
        for s in burst:
            s.close()


def start_listener(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", "agent-listener", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_listener_moved_by_bind_alone_does_not_start_and_says_why(subprocess_env):
    port, moved = free_port(), free_port()
    env = {**{k: v for k, v in subprocess_env.items() if k != "AGENT_BOOT_URL"}, "AGENT_LISTEN": f"127.0.0.1:{port}"}
    refused = start_listener(env, "--bind", f"127.0.0.1:{moved}")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert (f"--bind 127.0.0.1:{moved} is not AGENT_LISTEN (127.0.0.1:{port}), from which the servers' boot URL "
            f"(http://127.0.0.1:{port}) is made") in refused.stderr
    with socket.socket() as s:  # nothing listens there
        assert s.connect_ex(("127.0.0.1", moved)) != 0

    pinned = start_listener({**env, "AGENT_BOOT_URL": f"http://127.0.0.1:{port}"}, "--bind", f"127.0.0.1:{moved}")
    assert pinned.returncode != 0
    assert f"names this listener's address on port {port}, but it would listen on {moved}" in pinned.stderr


def test_a_listener_moved_with_agent_listen_or_behind_another_boot_address_starts(listener):
    server = listener()  # AGENT_LISTEN is its bind, AGENT_BOOT_URL follows
    assert server.get("/nope")[0] == 404
    behind_nat = listener(AGENT_BOOT_URL="http://10.9.8.7:8001")
    assert behind_nat.get("/nope")[0] == 404


def test_a_warm_agents_held_ask_outlives_the_idle_timeout_and_gets_its_command(listener, demo_site):
    """The server closes silent connections (AGENT_LISTENER_IDLE_S), but never one whose request is running: a warm
    host's long poll is held past it and answered as soon as a command is queued (woken through Redis)."""
    from hosts.engine.agent import agent_command
    from hosts.engine.flow import Run, Waiting
    from hosts.models import BareMetalHost
    from hosts.services import host_transition

    from .factories import ask_in_thread, warm_agent

    server = listener(AGENT_LISTENER_IDLE_S="1", WARM_POLL_S="60")
    host, client, session = warm_agent(f"http://127.0.0.1:{server.port}")
    assert client.heartbeat(session, status="idle") is None and session.wait_s == 60  # told to long-poll
    box = ask_in_thread(client, session)
    box["thread"].join(4)  # several idle timeouts and clean-ups of the server
    assert box["thread"].is_alive(), box

    host_transition(host=host, to_state="provisioning", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"id": "f-1", "name": "provision", "step": "check_tenant_api"})
    with pytest.raises(Waiting, match="queued for the agent"):
        agent_command(Run(BareMetalHost.objects.get(pk=host.pk)), "check_endpoint", {"host": "127.0.0.1", "port": 6443})
    box["thread"].join(30)
    assert not box["thread"].is_alive() and "error" not in box, box
    assert box["answer"]["name"] == "check_endpoint", box
