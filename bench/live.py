"""bench/live.py: live views under load, and the fleet board's cost per page at fleet scale.

Live: N websocket clients watch one live page (the fleet board by default; the claims list; the event log once
it is live) on a real ASGI server (daphne) with the Redis channel layer, while this process changes the page's
objects at a fixed rate, each change through its service (commit, then the on-commit publish). Measures the
time from each change's commit to each client receiving its row, and counts what a client missed (it drops
its connection once, for a while, mid-run) and got back from the re-sync on reconnect. After the run nothing
may be lost: every client's last view of every object is the database's.

    .venv/bin/python bench/live.py [--pages fleet,claims] [--clients 20] [--rate 200] [--duration 60]
                                   [--hosts 200] [--gap 2] [--settle 4]

Board: the fleet board rendered in this process (Django's test client, DEBUG off) at 200 hosts and at 10,000:
server time and SQL queries per render for the first page, filtered pages and the last page.

    .venv/bin/python bench/live.py --board [--board-hosts 10000] [--repeat 20]

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

CURSOR = re.compile(r'id="live-cursor" data-cursor="(\d+)"')
MARK = "bench #"  # each change's reason or message carries its number: what a row that shows it was rendered from


# --- what a client finds in a message: (object id, label, version) per row ---------------------------------
# The version orders the changes of one object: a row whose version is at least a change's shows that change.

HOST_ROW = re.compile(r'<tr id="host-(\d+)" data-live-id="\d+" data-state="(\w+)" data-changed="([\d.]+)"')
CLAIM_ROW = re.compile(r'<tr id="claim-(\d+)"[^>]*?data-phase="(\w+)"(.*?)</tr>', re.DOTALL)
MARKED = re.compile(re.escape(MARK) + r"(\d+)\b")


def fleet_rows(message: str) -> list[tuple]:
    return [(int(h), s, float(c)) for h, s, c in HOST_ROW.findall(message)]


def claim_rows(message: str) -> list[tuple]:
    """A claim's row shows its message, which the bench's change sets to "bench #<n>"."""
    rows = []
    for claim, phase, body in CLAIM_ROW.findall(message):
        found = MARKED.search(body)
        if found:
            rows.append((int(claim), phase, int(found.group(1))))
    return rows


def event_rows(message: str) -> list[tuple]:
    """Each Event of a bench change is an object of its own (its number), whatever the log's row looks like."""
    return [(int(n), "", int(n)) for n in MARKED.findall(message)]


PARSERS = {"fleet_rows": fleet_rows, "claim_rows": claim_rows, "event_rows": event_rows}


# --- the clients (a child process of their own: they never share a GIL with the writer) -------------------

def run_clients(url: str, cookie: str, ids: list[int], cursor: int, clients: int, duration: float, gap: float,
                settle: float, writer_done, out, parser: str = "fleet_rows") -> None:
    import websocket  # websocket-client

    parse = PARSERS[parser]
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
                rows = parse(message)
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


# --- the pages: what each one watches and how the bench changes it ----------------------------------------

HOST_CYCLE = {"available": "maintenance", "maintenance": "registering", "registering": "inspecting",
              "inspecting": "available"}
CLAIM_CYCLE = {"Pending": "Provisioning", "Provisioning": "Joining", "Joining": "Pending"}


class Page:
    """A live page under load. `ws` is its consumer's path; `parser` reads a client's messages (PARSERS);
    `setup` makes the objects it shows; `change` makes change number n of one of them, inside the writer's
    transaction, and returns its version; `final` gives each object's (label, version) in the database."""

    name, ws, parser, declares_ids = "", "", "", True

    def setup(self, n: int) -> list:
        raise NotImplementedError

    def change(self, obj, n: int) -> float:
        raise NotImplementedError

    def final(self) -> dict:
        raise NotImplementedError


def make_hosts(n: int, prefix: str = "bench", start: int = 0, states=("available",), labels=None,
               mac_byte: int = 2) -> list:
    """`n` hosts named `<prefix>-NNNNN` whose MACs' third byte is `mac_byte`: pages that run one after the other on
    one database each give their own."""
    from hosts.models import BareMetalHost

    BareMetalHost.objects.bulk_create([
        BareMetalHost(name=f"{prefix}-{i:05d}", bmc_address=f"redfish://10.2.{i // 250}.{i % 250}/redfish/v1/Systems/1",
                      boot_mac=f"52:54:{mac_byte:02x}:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}",
                      labels=labels(i) if labels else {"role": "gpu"}, state=states[i % len(states)])
        for i in range(start, start + n)], batch_size=2000)
    return list(BareMetalHost.objects.filter(name__startswith=f"{prefix}-").order_by("pk"))


class FleetPage(Page):
    """The fleet board: hosts move available → maintenance → registering → inspecting → available."""

    name, ws, parser = "fleet", "/ws/fleet/?per_page=200", "fleet_rows"
    prefix, mac_byte = "bench", 2  # each page its own hosts: pages run one after the other on one database

    def setup(self, n):
        return make_hosts(n, prefix=self.prefix, mac_byte=self.mac_byte)

    def change(self, host, n):
        from hosts.services import host_transition

        host_transition(host=host, to_state=HOST_CYCLE[host.state], actor="bench:live", reason=f"{MARK}{n}")
        return host.state_changed_at.timestamp()

    def final(self):
        from hosts.models import BareMetalHost

        return {h: (s, c.timestamp()) for h, s, c in BareMetalHost.objects.filter(name__startswith=f"{self.prefix}-")
                .values_list("pk", "state", "state_changed_at")}


class ClaimsPage(Page):
    """The claims list (/ws/claims/, an admin's: every tenant's claims): claims go Pending → Provisioning →
    Joining → Pending through claims.phases.claims_transition, each with the message "bench #<n>"."""

    name, ws, parser = "claims", "/ws/claims/", "claim_rows"

    def setup(self, n):
        from claims.models import NodeClaim
        from pools.models import NodeProvider, Tenant

        provider = NodeProvider.objects.get_or_create(name="metal3")[0]
        tenants = [Tenant.objects.get_or_create(name=f"bench-{t}")[0] for t in range(4)]
        NodeClaim.objects.bulk_create([
            NodeClaim(name=f"bench-claim-{i:05d}", tenant=tenants[i % len(tenants)], provider=provider,
                      pool_name="gpu", message=f"{MARK}0") for i in range(n)])
        return list(NodeClaim.objects.filter(name__startswith="bench-claim-").order_by("pk"))

    def change(self, claim, n):
        from claims.phases import claims_transition

        claims_transition(claims=[claim], to_phase=CLAIM_CYCLE[claim.phase], actor="bench:live", message=f"{MARK}{n}")
        return n

    def final(self):
        from claims.models import NodeClaim

        return {c: (p, int(m[len(MARK):])) for c, p, m in
                NodeClaim.objects.filter(message__startswith=MARK).values_list("pk", "phase", "message")}


class EventsPage(FleetPage):
    """The event log: every host move is an Event whose message is "bench #<n>"; each is an object of its own,
    which every client must get, live or in the re-sync."""

    name, ws, parser, declares_ids = "events", "/ws/events/", "event_rows", False
    prefix, mac_byte = "evbench", 3

    def setup(self, n):
        from events.selectors import latest_event_id

        self.since = latest_event_id()  # this page's Events only, not those of a page run before it
        return super().setup(n)

    def change(self, host, n):
        super().change(host, n)
        return n

    def final(self):
        from events.models import Event

        made = Event.objects.filter(pk__gt=self.since, message__startswith=MARK).values_list("message", flat=True)
        return {n: ("", n) for n in (int(m[len(MARK):]) for m in made)}


# A page that becomes live is one line here (its consumer's path, how its rows read, how the bench changes it).
PAGES = {"fleet": FleetPage, "claims": ClaimsPage, "events": EventsPage}


def is_live(page: Page) -> bool:
    """Whether the console serves a websocket at the page's path (the event log is not live on every build)."""
    from vmetal_console.asgi import websocket_urlpatterns

    path = page.ws.split("?", 1)[0].lstrip("/")
    return any(route.pattern.match(path) for route in websocket_urlpatterns)


# --- the writer --------------------------------------------------------------------------------------------

def drive(page: Page, objects: list, rate: float, duration: float, writers: int) -> list[tuple[int, float, float]]:
    """Change objects round-robin at `rate` changes per second in all, from `writers` threads (as several
    Celery worker threads would), each in its own transaction; returns (object id, version, commit time)
    per change (for the event log the object is the change's Event, by its number)."""
    import itertools

    from django.db import connection, transaction

    done = []
    start = time.time() + 0.2
    numbers = itertools.count(1)  # next() on a count is atomic under the GIL

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
                obj = mine[k % len(mine)]
                committed = {}
                n = next(numbers)
                with transaction.atomic():
                    # Registered first, so it runs first after COMMIT: before the service's own publish.
                    transaction.on_commit(lambda: committed.setdefault("at", time.time()))
                    version = page.change(obj, n)
                done.append((n if isinstance(page, EventsPage) else obj.pk, version, committed["at"]))
                k += 1
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(objects[i::writers],)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def percentile(values, p):
    return _setup.percentile(values, p) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", default="fleet,claims,events",
                        help="live pages to load, one after the other (those not live on this build are skipped)")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200, help="changes per second")
    parser.add_argument("--duration", type=float, default=60, help="seconds of changes, per page")
    parser.add_argument("--hosts", type=int, default=200, help="objects on the watched page (≤ 200: one page)")
    parser.add_argument("--gap", type=float, default=2.0, help="seconds each client stays disconnected, once")
    parser.add_argument("--writers", type=int, default=4, help="threads making the changes")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds the clients listen after the last change")
    parser.add_argument("--board", action="store_true", help="the fleet board's cost per page instead")
    parser.add_argument("--board-hosts", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=20, help="renders timed per board page")
    args = parser.parse_args()

    _setup.fresh_database()
    if args.board:
        board(args.board_hosts, args.repeat)
        return
    from celery import current_app

    from hosts.task_names import DRIVE_HOST

    # No worker here: the states' drive tasks are not sent (this measures the live path, not the flows).
    send_task = current_app.send_task
    current_app.send_task = lambda name, *args, **kw: None if name == DRIVE_HOST else send_task(name, *args, **kw)
    for name in args.pages.split(","):
        page = PAGES[name.strip()]()
        if not is_live(page):
            print(f"== {page.name}: not live on this build (no websocket at {page.ws}); skipped\n", flush=True)
            continue
        live(page, args)


def admin_session() -> str:
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore

    admin = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.invalid", "bench-password-not-used")
    from access.sessions import SEEN_AT, SIGNED_IN_AT

    session = SessionStore()
    now = int(time.time())  # a session with no sign-in time is idle: its live views would join as nobody
    session.update({SESSION_KEY: str(admin.pk), BACKEND_SESSION_KEY: "access.sessions.LocalPasswordBackend",
                    HASH_SESSION_KEY: admin.get_session_auth_hash(), SIGNED_IN_AT: now, SEEN_AT: now})
    session.create()
    return session.session_key


def live(page: Page, args) -> None:
    from django.db import connection

    from events.selectors import latest_event_id

    objects = page.setup(args.hosts)
    session_key = admin_session()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = Path("/tmp/vmetal-bench-daphne.log")
    # A web process keeps its database connections (DB_CONN_MAX_AGE): the consumers read from a thread that
    # would otherwise open a new PostgreSQL connection for every render.
    env = {**os.environ, "LOG_LEVEL": "WARNING", "AXES_ENABLED": "False",
           "DB_CONN_MAX_AGE": os.environ.get("DB_CONN_MAX_AGE", "60")}
    connection.close()
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
        print(f"== {page.name} ({page.ws}): daphne pid {server.pid} on port {port}", file=sys.stderr, flush=True)
        settle = args.settle
        spawn = multiprocessing.get_context("spawn")
        receiver, sender = spawn.Pipe(duplex=False)
        writer_done = spawn.Event()
        ids = [o.pk for o in objects] if page.declares_ids else []
        clients = spawn.Process(
            target=run_clients, args=(f"ws://127.0.0.1:{port}{page.ws}", f"sessionid={session_key}", ids,
                                      latest_event_id(), args.clients, args.duration, args.gap, settle, writer_done,
                                      sender, page.parser))
        clients.start()
        time.sleep(1.0)  # the clients connect and re-sync once
        load_before, server_cpu, writer_cpu = os.getloadavg(), cpu_seconds(server.pid), cpu_seconds()
        started = time.time()
        transitions = drive(page, objects, args.rate, args.duration, args.writers)
        elapsed = time.time() - started
        writer_cpu = cpu_seconds() - writer_cpu
        writer_done.set()
        connection.close()
        results, clients_cpu = receiver.recv()
        server_cpu = cpu_seconds(server.pid) - server_cpu
        load_after = os.getloadavg()
        clients.join(30)
        final = page.final()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(15)

    print(f"== {page.name} ({page.ws})")
    report(args, transitions, elapsed, results, final)
    print(f"CPU seconds during the run: server (daphne) {server_cpu:.1f}, writer process {writer_cpu:.1f}, "
          f"clients process {clients_cpu:.1f}; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"({os.cpu_count()} CPUs)\n", flush=True)


def report(args, transitions, elapsed, results, final) -> None:
    latencies, missed, recovered, lost = [], 0, 0, 0
    frames = sum(len(r["seen"]) for r in results)
    for r in results:
        by_object: dict[int, list] = {}
        for at, kind, rows in r["seen"]:
            for obj, label, version in rows:
                by_object.setdefault(obj, []).append((at, kind, version, label))
        for obj, version, committed in transitions:
            first = next(((at, kind) for at, kind, seen, _ in by_object.get(obj, ()) if seen >= version - 1e-6), None)
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
        # After the run, each client's last view of each object it changed must be the database's.
        changed = {obj for obj, _, _ in transitions}
        for obj, (label, version) in final.items():
            if obj not in changed:
                continue  # never changed in a short run: the page had it from the start
            views = by_object.get(obj)
            last = max(views, key=lambda v: v[2]) if views else None
            if last is None or abs(last[2] - version) > 1e-3 or last[3] != label:
                lost += 1
    print(f"clients {args.clients}, objects on the page {args.hosts}, changes {len(transitions)} in {elapsed:.1f} s "
          f"({len(transitions) / elapsed:.0f}/s), messages received {frames}")
    if latencies:
        print(f"commit → client (live): p50 {percentile(latencies, 50) * 1000:.0f} ms, p95 "
              f"{percentile(latencies, 95) * 1000:.0f} ms, p99 {percentile(latencies, 99) * 1000:.0f} ms, max "
              f"{max(latencies) * 1000:.0f} ms over {len(latencies)} deliveries")
    else:
        print("commit → client (live): nothing delivered live")
    print(f"missed live (a client was disconnected, or the message did not come): {missed}; "
          f"recovered by the re-sync: {recovered}; lost after the re-sync: {lost}")


# --- the fleet board's cost per page ------------------------------------------------------------------------

BOARD_STATES = ("available", "provisioned", "repair", "error", "maintenance")


def board(total: int, repeat: int) -> None:
    """Renders the fleet board in this process, as the web server would (middleware, session, view, template),
    at 200 hosts and at `total`: server time per render and the SQL queries it ran."""
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from hosts.models import BareMetalHost
    from pools.models import NodeProvider, NodeType, Tenant

    provider = NodeProvider.objects.create(name="metal3")
    NodeType.objects.create(name="gpu-server", provider=provider, host_selector={"matchLabels": {"role": "gpu"}})
    NodeType.objects.create(name="cpu-server", provider=provider, host_selector={"matchLabels": {"role": "cpu"}})
    tenants = [Tenant.objects.create(name=f"bench-{t}") for t in range(4)]
    def labels(i: int) -> dict:
        return {"role": "gpu" if i % 2 else "cpu", "rack": f"r{i % 40}", "rail-group": f"g{i % 8}"}

    admin = User.objects.create_superuser("bench", "bench@example.invalid", "bench-password-not-used")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(admin)

    def serve(hosts: int) -> None:
        from claims.models import NodeClaim

        # Every fifth host serves a claim of one of the tenants: rows with a claim and its tenant.
        served = [h for h in BareMetalHost.objects.filter(state="provisioned", claim__isnull=True).order_by("pk")]
        NodeClaim.objects.bulk_create([
            NodeClaim(name=f"bench-claim-{h.pk}", tenant=tenants[h.pk % len(tenants)], provider=provider,
                      pool_name="gpu", phase="Available", host=h, host_name=h.name) for h in served], batch_size=2000)
        pages = -(-hosts // 50)
        views = [("first page", {}), ("filtered: state=available, label rack=r3", {"state": "available", "label": "rack=r3"}),
                 ("filtered: node_type=gpu-server, tenant=bench-1", {"node_type": "gpu-server", "tenant": "bench-1"}),
                 ("filtered: q=bench-0000", {"q": "bench-0000"}),
                 (f"last page (page={pages})", {"page": str(pages)})]
        print(f"fleet board at {hosts:,} hosts ({repeat} renders each, after one to warm up):")
        for label, params in views:
            client.get("/hosts/", params)
            times, cpu = [], []
            for _ in range(repeat):
                started, cpu_started = time.perf_counter(), time.process_time()
                response = client.get("/hosts/", params)
                times.append(time.perf_counter() - started)
                cpu.append(time.process_time() - cpu_started)
                assert response.status_code == 200, (response.status_code, label)
            sql = []
            for _ in range(3):  # the fastest of three: the database's own cost, not the machine's load
                with CaptureQueriesContext(connection) as ctx:
                    client.get("/hosts/", params)
                sql.append([float(q["time"]) for q in ctx.captured_queries])
            sql = min(sql, key=sum)
            print(f"  {label:<50} {len(sql):>2} queries; server time p50 {percentile(times, 50) * 1000:.0f} ms, "
                  f"p95 {percentile(times, 95) * 1000:.0f} ms; its CPU p50 {percentile(cpu, 50) * 1000:.0f} ms; "
                  f"SQL {sum(sql) * 1000:.0f} ms (slowest query {max(sql) * 1000:.0f} ms)", flush=True)

    def history(hosts: list) -> None:
        """Each host's move into its state, in the Event log (where the board's "needs attention" card reads
        the reason), behind a few older moves: a fleet that has been running a while."""
        from events.models import Event

        Event.objects.bulk_create([
            Event(kind="transition", object_type="host", object_name=h.name, host_id=h.pk, from_state=a, to_state=b,
                  message=f"bench: {a} → {b}", actor="bench:board")
            for h in hosts for a, b in (("registering", "inspecting"), ("inspecting", "available"),
                                        ("available", h.state))], batch_size=5000)

    history(make_hosts(200, states=BOARD_STATES, labels=labels))
    serve(200)
    history(make_hosts(total - 200, start=200, states=BOARD_STATES, labels=labels)[200:])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would soon after a bulk load
    serve(total)


if __name__ == "__main__":
    main()
