"""bench/live.py: live views under load. N websocket clients watch the fleet board (a page of hosts) on a real
ASGI server (daphne) with the Redis channel layer, while this process moves hosts through their life cycle at a
fixed rate, each transition through hosts.services (commit, then the on-commit publish). Measures the time from
each transition's commit to each client receiving its row, and counts what a client missed (it drops its
connection once, for a while, mid-run) and got back from the re-sync on reconnect. After the run nothing may
be lost: every client's last view of every host is the database's.

    .venv/bin/python bench/live.py [--clients 20] [--rate 200] [--duration 60] [--hosts 200] [--gap 2]

Uses its own PostgreSQL database (vmetal_bench, dropped and created; DATABASE_URL to change) and Redis
(REDIS_URL, default redis://127.0.0.1:6379/3) for the channel layer."""
import argparse
import json
import multiprocessing
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
# Production settings for this process and the server alike: DEBUG off (no query log kept per connection);
# both must sign sessions with the same key.
os.environ.setdefault("DEBUG", "False")
os.environ.setdefault("SECRET_KEY", "bench-secret-key-not-for-production-0123456789")
import _setup  # noqa: E402  (sets the bench database and Django settings)

ROW = re.compile(r'<tr id="host-(\d+)" data-live-id="\d+" data-state="(\w+)" data-changed="([\d.]+)"')
CURSOR = re.compile(r'id="live-cursor" data-cursor="(\d+)"')


# --- the clients (a child process of their own: they never share a GIL with the writer) -------------------

def run_clients(url: str, cookie: str, ids: list[int], cursor: int, clients: int, duration: float, gap: float,
                settle: float, writer_done, out) -> None:
    import websocket  # websocket-client

    results = [None] * clients

    def client(n: int) -> None:
        seen = []  # (received at, kind, [(host, state, changed)])
        sessions = []  # (connected at, closed at)
        state = {"cursor": cursor}
        # Each client drops its connection once, for `gap` seconds, at a time of its own in the run.
        drop_at = time.time() + 3 + (duration - 6 - gap) * (n + 0.5) / clients
        dropped = False

        def running() -> bool:  # until `settle` seconds after the writer's last transition
            if writer_done.is_set():
                state.setdefault("end", time.time() + settle)
                return time.time() < state["end"]
            return True

        while running():
            try:
                ws = websocket.create_connection(url, header=[f"Cookie: {cookie}"], timeout=15)
            except (OSError, websocket.WebSocketException):
                time.sleep(0.5)
                continue
            ws.settimeout(0.5)
            opened = time.time()
            try:
                ws.send(json.dumps({"type": "resync", "since": state["cursor"], "ids": ids}))
            except (OSError, websocket.WebSocketException):
                continue
            while running() and (dropped or time.time() < drop_at):
                try:
                    message = ws.recv()
                except websocket.WebSocketTimeoutException:
                    continue
                except (OSError, websocket.WebSocketException):
                    break  # the server dropped us: reconnect, and re-sync
                at = time.time()
                found = CURSOR.search(message)
                kind = "resync" if found else "live"
                rows = [(int(h), s, float(c)) for h, s, c in ROW.findall(message)]
                if rows:
                    seen.append((at, kind, rows))
                if found:
                    state["cursor"] = int(found.group(1))
            ws.close()
            sessions.append((opened, time.time()))
            if not dropped:
                dropped = True
                time.sleep(gap)
        results[n] = {"seen": seen, "sessions": sessions}

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.send((results, cpu_seconds()))
    out.close()


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) a process has used so far: this one, or another by its /proc entry."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the writer --------------------------------------------------------------------------------------------

CYCLE = {"available": "maintenance", "maintenance": "registering", "registering": "inspecting",
         "inspecting": "available"}


def drive(hosts: list, rate: float, duration: float, writers: int) -> list[tuple[int, float, float]]:
    """Move hosts round-robin at `rate` transitions per second in all, from `writers` threads (as several
    Celery worker threads would); returns (host id, state_changed_at, commit time) per transition."""
    from django.db import connection, transaction

    from hosts.services import host_transition

    done = []
    start = time.time() + 0.2

    def writer(mine: list) -> None:
        k = 0
        try:
            while True:
                due = start + k * writers / rate
                if due - start >= duration:
                    return
                now = time.time()
                if due > now:
                    time.sleep(due - now)
                host = mine[k % len(mine)]
                committed = {}
                with transaction.atomic():
                    # Registered first, so it runs first after COMMIT: before the service's own publish.
                    transaction.on_commit(lambda: committed.setdefault("at", time.time()))
                    host_transition(host=host, to_state=CYCLE[host.state], actor="bench:live", reason="bench")
                done.append((host.pk, host.state_changed_at.timestamp(), committed["at"]))
                k += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(hosts[i::writers],)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def percentile(values, p):
    return _setup.percentile(values, p) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200, help="transitions per second")
    parser.add_argument("--duration", type=float, default=60, help="seconds of transitions")
    parser.add_argument("--hosts", type=int, default=200, help="hosts on the watched page (≤ 200: one page)")
    parser.add_argument("--gap", type=float, default=2.0, help="seconds each client stays disconnected, once")
    parser.add_argument("--writers", type=int, default=4, help="threads making the transitions")
    args = parser.parse_args()

    _setup.fresh_database()
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import connection

    import hosts.engine
    from events.selectors import latest_event_id
    from hosts.models import BareMetalHost

    # No worker here: the states' drive tasks are not sent (this measures the live path, not the flows).
    hosts.engine.request_drive = lambda host_id, countdown=None: None
    BareMetalHost.objects.bulk_create([
        BareMetalHost(name=f"bench-{i:04d}", bmc_address=f"redfish://10.2.{i // 250}.{i % 250}/redfish/v1/Systems/1",
                      boot_mac=f"52:54:02:00:{i >> 8 & 255:02x}:{i & 255:02x}", labels={"role": "gpu"},
                      state="available") for i in range(args.hosts)])
    hosts_ = list(BareMetalHost.objects.order_by("pk"))
    admin = User.objects.create_superuser("bench", "bench@example.invalid", "bench-password-not-used")
    session = SessionStore()
    session.update({SESSION_KEY: str(admin.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                    HASH_SESSION_KEY: admin.get_session_auth_hash()})
    session.create()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Path("/tmp/vmetal-bench-daphne.log")
    # A web process keeps its database connections (DB_CONN_MAX_AGE): the consumers read from a thread that
    # would otherwise open a new PostgreSQL connection for every render.
    env = {**os.environ, "LOG_LEVEL": "WARNING", "AXES_ENABLED": "False",
           "DB_CONN_MAX_AGE": os.environ.get("DB_CONN_MAX_AGE", "60")}
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "vmetal_console.asgi:application"], cwd=_setup.ROOT, env=env,
                              stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(log.read_text()[-2000:])
                time.sleep(0.1)
        print(f"daphne pid {server.pid} on port {port}", file=sys.stderr, flush=True)
        settle = 4.0
        spawn = multiprocessing.get_context("spawn")
        receiver, sender = spawn.Pipe(duplex=False)
        writer_done = spawn.Event()
        ids = [h.pk for h in hosts_]
        clients = spawn.Process(
            target=run_clients, args=(f"ws://127.0.0.1:{port}/ws/fleet/?per_page=200",
                                      f"sessionid={session.session_key}", ids, latest_event_id(), args.clients,
                                      args.duration, args.gap, settle, writer_done, sender))
        clients.start()
        time.sleep(1.0)  # the clients connect and re-sync once
        load_before, server_cpu, writer_cpu = os.getloadavg(), cpu_seconds(server.pid), cpu_seconds()
        started = time.time()
        transitions = drive(hosts_, args.rate, args.duration, args.writers)
        elapsed = time.time() - started
        writer_cpu = cpu_seconds() - writer_cpu
        writer_done.set()
        connection.close()
        results, clients_cpu = receiver.recv()
        server_cpu = cpu_seconds(server.pid) - server_cpu
        load_after = os.getloadavg()
        clients.join(30)
        final = {h: (s, c.timestamp()) for h, s, c in
                 BareMetalHost.objects.values_list("pk", "state", "state_changed_at")}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(15)

    report(args, transitions, elapsed, results, final)
    print(f"CPU seconds during the run: server (daphne) {server_cpu:.1f}, writer process {writer_cpu:.1f}, "
          f"clients process {clients_cpu:.1f}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"({os.cpu_count()} CPUs)")


def report(args, transitions, elapsed, results, final) -> None:
    latencies, missed, recovered, lost = [], 0, 0, 0
    frames = sum(len(r["seen"]) for r in results)
    for r in results:
        by_host: dict[int, list] = {}
        for at, kind, rows in r["seen"]:
            for host, state, changed in rows:
                by_host.setdefault(host, []).append((at, kind, changed, state))
        for host_id, changed, committed in transitions:
            first = next(((at, kind) for at, kind, seen, _ in by_host.get(host_id, ()) if seen >= changed - 1e-6), None)
            if first is None:
                lost += 1
                continue
            at, kind = first
            connected = any(a <= committed and at <= b for a, b in r["sessions"])
            if kind == "live" and connected:
                latencies.append(at - committed)
            else:
                missed += 1
                recovered += 1
        # After the run, each client's last view of each host must be the database's.
        for host_id, (state, changed) in final.items():
            views = by_host.get(host_id)
            last = max(views, key=lambda v: v[2]) if views else None
            if last is None or abs(last[2] - changed) > 1e-3 or last[3] != state:
                lost += 1
    print(f"clients {args.clients}, hosts on the page {args.hosts}, transitions {len(transitions)} in {elapsed:.1f} s "
          f"({len(transitions) / elapsed:.0f}/s), messages received {frames}")
    print(f"commit → client (live): p50 {percentile(latencies, 50) * 1000:.0f} ms, p95 "
          f"{percentile(latencies, 95) * 1000:.0f} ms, p99 {percentile(latencies, 99) * 1000:.0f} ms, max "
          f"{max(latencies) * 1000:.0f} ms over {len(latencies)} deliveries")
    print(f"missed live (a client was disconnected, or the message did not come): {missed}; "
          f"recovered by the re-sync: {recovered}; lost after the re-sync: {lost}")


if __name__ == "__main__":
    main()
