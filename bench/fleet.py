"""Provisioning at fleet scale in the lab: N servers provisioned at once.

  .venv/bin/python bench/fleet.py --hosts 200 [--power-delay 5] [--workers 2] [--sweep 20,50,100]
                                  [--web-pool 10] [--profile DIR]
  .venv/bin/python bench/fleet.py --pair [--hosts 20] [--pair-runs 2] [--pair-first one|two]
  .venv/bin/python bench/fleet.py --warm [--warm-sizes 1,20,50] [--warm-polls 5,600,600db] [--power-delay 2] [--idle 60]

--warm (hosts/flows/warm.py): for each N, cold (the NodeType keeps no warm host) and warm (it keeps all N warm, once
per --warm-polls value: how long the agent listener holds a warm agent's idle ask, WARM_POLL_S; `db`: without
Redis, as the embedded mode, the held ask looks at the database every WARM_POLL_TICK_S), each with a fresh
database and lab, N gpu-servers registered and inspected, then a quiet window of --idle seconds with nothing to
do (the warm hosts' agents waiting in their long polls), then one pool of N. Prints claim → Ready (claim created →
Available) p50/p95 warm and cold side by side with their ratio, the console's CPU per provision, and the
console's CPU per warm host-hour: the CPU of the quiet window, warm minus cold, per host and hour (the agent
listener's CPU per heartbeat beside it), against the console CPU that a warm provision saves.

For each N (and N = 1 as the reference) a fresh database and a fresh lab: N gpu-servers registered and
inspected, then one tenant's pool set to N, and the time from that commit until every claim is
Available (the makespan). Prints makespan(N) / makespan(1), per-step p50/p95, and the CPU seconds that
the console's own processes (web server, Celery workers) spent per provisioned host; the lab (BMC
emulator, agents, tenant API) is excluded, and shown beside it with PostgreSQL's and the machine's.
Power changes land after a fixed --power-delay, the same for every server, so that the ratio shows
what the console adds and not the spread of random delays.

The console runs as in production: the agent listener (manage.py agent-listener) with DEBUG off, Celery workers,
each process with a bounded PostgreSQL pool (DATABASE_POOL_MAX: --web-pool for the listener, threads + 1 for
a worker), so N agents heartbeating never open more than --max-connections connections.
--profile DIR samples the console's processes and the lab's with py-spy (`pip install py-spy`) at the largest N.

--pair: at N = --hosts, side by side in one run, one worker + one listener against two workers + two listeners
(the HA topology), the listeners behind a round-robin TCP balancer in both (bench/_balancer.py): console CPU-s and
DB transactions per provisioned host of each.
"""
import argparse
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from _setup import ROOT, Console, backends, busy, cpu_seconds, fresh_database, percentile, transactions

os.environ["DATABASE_URL"] = os.environ.get("FLEET_DATABASE_URL", "postgres://root@127.0.0.1:5432/vmetal_bench_fleet")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/3")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/4")  # the channel layer and the warm agents' wake
os.environ.setdefault("DRIVE_STALE_EVERY_S", "5")
os.environ.setdefault("AGENT_SILENCE_S", "30")
# Every agent of the lab calls from 127.0.0.1: --hosts agents heartbeating each second, plus results.
os.environ.setdefault("AGENT_CALL_ADDRESS_LIMIT", "1000000")
os.environ.setdefault("SECRET_KEY", "fleet-bench-" + os.urandom(8).hex())  # the console runs with DEBUG off


def run_once(n: int, args, workers: int | None = None, listeners: int = 1, balanced: bool = False) -> dict:
    fresh_database()
    from django.core.management import call_command
    from django.db.models import Count

    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost
    from lab.site import IMAGE_NAME, ROOMY_NETWORK, LabSite
    from manifests.apply import apply_files
    from pools.models import NodePool

    console = Console(workers or args.workers, args.threads, args.web_pool, listeners, balanced)
    if console.connections > args.max_connections:
        raise SystemExit(f"{console.connections} PostgreSQL connections needed, more than --max-connections")
    site = LabSite(hosts=n, gpu_hosts=n, tenants=["bench"], console_url=console.url, agent_mode="thread",
                   power_delay=(args.power_delay, args.power_delay),
                   var_dir=Path(tempfile.mkdtemp(prefix="vmetal-fleet-lab-"))).start()
    try:
        call_command("apply", "-f", str(ROOT / "demo" / "site.yaml"), verbosity=0)
        apply_files([("network", ROOMY_NETWORK)], actor="bench")  # room for every node's address
        site.register()
        t0 = time.monotonic()
        while BareMetalHost.objects.filter(state="available").count() < n:
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"registration: {dict(BareMetalHost.objects.values_list('state').annotate(Count('pk')))}")
            time.sleep(0.5)
        registered = time.monotonic() - t0
        lab_pids = [os.getpid(), site.redfish._proc.pid]  # agents and tenant API are threads of this process
        cpu_before, lab_before, db_before, busy_before = console.cpu(), cpu_seconds(lab_pids), backends(), busy()
        web_before = console.web_cpu()

        pool = (f"privateNodes:\n  autoNodes:\n    - provider: metal3\n      properties:\n"
                f"        vcluster.com/os-image: {IMAGE_NAME}\n      static:\n        - name: gpu\n"
                f"          quantity: {n}\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                f"              value: gpu-server\n")
        if args.profile and n == max(args.sizes):
            console.profile(Path(args.profile), n, {"lab": lab_pids[0], "lab-bmc": lab_pids[1]})
        xact_before = transactions()
        start = time.monotonic()
        apply_files([("pool", pool)], actor="bench", tenant="bench")
        while NodeClaim.objects.filter(phase="Available").count() < n:
            if time.monotonic() - start > args.timeout:
                phases = dict(NodeClaim.objects.values_list("phase").annotate(Count("pk")))
                raise RuntimeError(f"provisioning did not finish: {phases}")
            time.sleep(0.2)
        makespan = time.monotonic() - start
        cpu = console.cpu() - cpu_before
        web_cpu = console.web_cpu() - web_before
        lab_cpu = cpu_seconds(lab_pids) - lab_before
        db_after, busy_after = backends(), busy()
        db_cpu = sum(t - db_before.get(pid, 0.0) for pid, t in db_after.items())
        machine = [a - b for a, b in zip(busy_after, busy_before)]
        console.stop_profiling()
        steps = {}
        for step, duration in Event.objects.filter(kind="step", message="done", data__flow="provision") \
                .values_list("step", "duration_s"):
            steps.setdefault(step, []).append(duration)
        assert NodePool.objects.get().quantity == n
        result = {"n": n, "registered_s": registered, "makespan_s": makespan, "cpu_per_host": cpu / n,
                  "steps": steps, "cpu_s": {"console": cpu, "web": web_cpu, "lab": lab_cpu, "postgres": db_cpu},
                  "machine_busy": machine[0] / machine[1] if machine[1] else 0.0}
    finally:
        site.stop()
        console.stop()
        shutil.rmtree(site.var_dir, ignore_errors=True)  # N servers' disk files
    # PostgreSQL counts a backend's transactions when it exits or idles: read them once the console is gone.
    time.sleep(1)
    result["xact_per_host"] = (transactions() - xact_before) / n
    return result


class _Counter:
    def __init__(self):
        self.value, self._lock = 0, threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.value += 1


HEARTBEATS = _Counter()  # heartbeats the lab's agents sent (this process's agent threads), for --warm


def count_heartbeats() -> None:
    """Count every heartbeat the lab's thread-mode agents send (they run in this process)."""
    from agent.client import ConsoleClient

    sent = ConsoleClient.heartbeat
    if getattr(sent, "counted", False):
        return

    def heartbeat(self, *args, **kwargs):
        HEARTBEATS.add()
        return sent(self, *args, **kwargs)

    heartbeat.counted = True
    ConsoleClient.heartbeat = heartbeat


def heartbeats() -> int:
    return HEARTBEATS.value


def run_warm(n: int, warm: bool, args, poll_s: float = 600, redis: bool = True) -> dict:
    """One N, cold or warm: register N gpu-servers (all kept warm, or none), measure a quiet window, then
    provision N at once. Claim → Ready per claim: its creation to its Available transition. `poll_s`: how long
    the agent listener holds a warm agent's idle ask (WARM_POLL_S); `redis`: False runs the console without
    REDIS_URL (the embedded mode: nothing wakes a held ask, which looks at the database every second)."""
    os.environ["WARM_POLL_S"] = str(poll_s)  # the console's processes read it
    redis_url = os.environ.pop("REDIS_URL", None)
    if redis and redis_url:
        os.environ["REDIS_URL"] = redis_url
    try:
        return _run_warm(n, warm, args)
    finally:
        if redis_url:
            os.environ["REDIS_URL"] = redis_url


def _run_warm(n: int, warm: bool, args) -> dict:
    fresh_database()
    from django.core.management import call_command
    from django.db.models import Count

    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost
    from lab.site import IMAGE_NAME, ROOMY_NETWORK, LabSite
    from manifests.apply import apply_files
    from pools.models import NodeType

    count_heartbeats()
    console = Console(args.workers, args.threads, args.web_pool)
    site = LabSite(hosts=n, gpu_hosts=n, tenants=["bench"], console_url=console.url, agent_mode="thread",
                   power_delay=(args.power_delay, args.power_delay),
                   var_dir=Path(tempfile.mkdtemp(prefix="vmetal-fleet-lab-"))).start()
    try:
        call_command("apply", "-f", str(ROOT / "demo" / "site.yaml"), verbosity=0)
        apply_files([("network", ROOMY_NETWORK)], actor="bench")
        NodeType.objects.filter(name="gpu-server").update(warm_hosts=n if warm else 0, warm_idle_minutes=60)
        site.register()
        t0 = time.monotonic()
        ready = BareMetalHost.objects.filter(state="available")
        if warm:
            ready = ready.filter(warm_since__isnull=False)
        while ready.count() < n:
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"registration: {dict(BareMetalHost.objects.values_list('state').annotate(Count('pk')))}")
            time.sleep(0.5)
        registered = time.monotonic() - t0
        time.sleep(3)  # the last power-offs land, the last drives end
        # The quiet window: nothing to do but the beat's periodic tasks and, warm, the agents' long polls.
        cpu0, web0, beats0 = console.cpu(), console.web_cpu(), heartbeats()
        w0 = time.monotonic()
        time.sleep(args.idle)
        window = time.monotonic() - w0
        idle = {"console": console.cpu() - cpu0, "web": console.web_cpu() - web0,
                "heartbeats": heartbeats() - beats0, "seconds": window}
        if warm and BareMetalHost.objects.filter(warm_since__isnull=False).count() < n:
            raise RuntimeError("warm hosts lost their warmth in the quiet window")

        pool = (f"privateNodes:\n  autoNodes:\n    - provider: metal3\n      properties:\n"
                f"        vcluster.com/os-image: {IMAGE_NAME}\n      static:\n        - name: gpu\n"
                f"          quantity: {n}\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                f"              value: gpu-server\n")
        cpu_before, web_before = console.cpu(), console.web_cpu()
        start = time.monotonic()
        apply_files([("pool", pool)], actor="bench", tenant="bench")
        while NodeClaim.objects.filter(phase="Available").count() < n:
            if time.monotonic() - start > args.timeout:
                phases = dict(NodeClaim.objects.values_list("phase").annotate(Count("pk")))
                raise RuntimeError(f"provisioning did not finish: {phases}")
            time.sleep(0.2)
        makespan = time.monotonic() - start
        cpu, web = console.cpu() - cpu_before, console.web_cpu() - web_before
        available = dict(Event.objects.filter(kind="transition", to_state="Available", claim__isnull=False)
                         .values_list("claim_id", "created_at"))
        latencies = [(available[c.pk] - c.created_at).total_seconds() for c in NodeClaim.objects.all()]
        steps: dict[str, list[float]] = {}
        for step, duration in Event.objects.filter(kind="step", message="done", data__flow="provision") \
                .values_list("step", "duration_s"):
            steps.setdefault(step, []).append(duration)
        return {"n": n, "warm": warm, "poll_s": float(os.environ["WARM_POLL_S"]), "registered_s": registered, "makespan_s": makespan, "latencies": latencies,
                "cpu_per_host": cpu / n, "web_per_host": web / n, "idle": idle, "steps": steps}
    finally:
        site.stop()
        console.stop()
        shutil.rmtree(site.var_dir, ignore_errors=True)


def main_warm(args) -> None:
    sizes = [int(x) for x in args.warm_sizes.split(",") if x]
    polls = [x for x in args.warm_polls.split(",") if x]
    modes = [("cold", False, "600")] + [(f"warm@{p}", True, p) for p in polls]
    results: dict[tuple[int, str], dict] = {}
    for n in sizes:
        for mode, warm, poll in modes:
            try:
                results[n, mode] = r = run_warm(n, warm, args, poll_s=float(poll.removesuffix("db")),
                                                redis=not poll.endswith("db"))
            except RuntimeError as exc:
                print(f"N={n:>3} {mode}: did not finish: {exc}", flush=True)
                continue
            i = r["idle"]
            print(f"N={n:>3} {mode}: registered in {r['registered_s']:.1f}s; claim → Ready p50 "
                  f"{percentile(r['latencies'], 50):.2f}s p95 {percentile(r['latencies'], 95):.2f}s (makespan "
                  f"{r['makespan_s']:.1f}s); console {r['cpu_per_host']:.3f} CPU-s per provision; quiet "
                  f"{i['seconds']:.0f}s: console {i['console']:.2f} CPU-s (web {i['web']:.2f}), "
                  f"{i['heartbeats']} asks", flush=True)
    print(f"\npower changes land after {args.power_delay:g}s; console: agent listener (pool {args.web_pool}) + "
          f"{args.workers} worker(s) × {args.threads} threads; lab agents in threads (no process start); "
          f"warm@X: the agent listener holds a warm host's idle ask up to X s (WARM_POLL_S), woken through Redis "
          f"when its host gets work; Xdb: without Redis (the embedded mode), the held ask looks at the database "
          f"every second")
    print("\nclaim → Ready (claim created → Available), seconds; console CPU-s per provision")
    print(f"  {'N':>4} {'mode':<10} {'p50':>7} {'p95':>7} {'p50/cold':>9} {'p95/cold':>9} {'CPU-s':>7}")
    for n in sizes:
        cold = results.get((n, "cold"))
        for mode, _, _ in modes:
            r = results.get((n, mode))
            if r is None:
                print(f"  {n:>4} {mode:<10} (did not run)")
                continue
            p50, p95 = percentile(r["latencies"], 50), percentile(r["latencies"], 95)
            ratio = (f"{p50 / percentile(cold['latencies'], 50):>9.2f} {p95 / percentile(cold['latencies'], 95):>9.2f}"
                     if cold else f"{'-':>9} {'-':>9}")
            print(f"  {n:>4} {mode:<10} {p50:>7.2f} {p95:>7.2f} {ratio} {r['cpu_per_host']:>7.3f}")
    print("\nwhat warm hosts cost the console (quiet window, warm minus cold), against what a warm provision saves")
    for n in sizes:
        cold = results.get((n, "cold"))
        for mode, warm, _ in modes:
            r = results.get((n, mode))
            if not warm or r is None or cold is None:
                continue
            ci, wi = cold["idle"], r["idle"]
            extra = wi["console"] / wi["seconds"] - ci["console"] / ci["seconds"]  # CPU-s per second, N warm hosts
            per_host_hour = extra / n * 3600
            sent = wi["heartbeats"] - ci["heartbeats"] * wi["seconds"] / ci["seconds"]
            web = wi["web"] - ci["web"] * wi["seconds"] / ci["seconds"]
            per_beat = web / sent if sent > 0 else float("nan")
            saved = cold["cpu_per_host"] - r["cpu_per_host"]
            if sent < n:  # long polls: the window holds hardly an ask; add the asks of an hour at the CPU per ask
                # of the mode of this N with the most asks (the whole poll, as the listener serves it)
                asks = [(results[n, m]["idle"], results[n, m]["poll_s"]) for m, w, _ in modes
                        if w and (n, m) in results]
                busiest = max(asks, key=lambda a: a[0]["heartbeats"])[0]
                per_beat = busiest["web"] / busiest["heartbeats"] if busiest["heartbeats"] else float("nan")
                per_host_hour += 3600 / (r["poll_s"] + 1) * per_beat  # an ask per poll and the 1 s between
                sent = n * wi["seconds"] / (r["poll_s"] + 1)
            line = (f"  N={n:>3} {mode:<10}: {per_host_hour:6.2f} CPU-s per warm host-hour ({sent / wi['seconds'] / n:.3f} "
                    f"asks/s per host at {1000 * per_beat:.1f} ms of the agent listener's CPU each); a warm "
                    f"provision saves {saved:.3f} console CPU-s")
            if saved > 0:
                line += f": it pays for itself at {per_host_hour / saved:.2f} claims per warm host-hour"
            print(line)
    ns = [n for n in sizes if all((n, m) in results for m, _, _ in modes)]
    if ns:
        from hosts.lifecycle import FLOWS

        print("\nper-step p50 (seconds): " + " / ".join(m for m, _, _ in modes))
        print("  " + " " * 18 + "".join(f"{'N=' + str(n):>24}" for n in ns))
        for step in [s.name for s in FLOWS["provision"].steps]:
            cells = []
            for n in ns:
                values = [results[n, m]["steps"].get(step) for m, _, _ in modes]
                cells.append(" / ".join(f"{percentile(v, 50):5.2f}" if v else "    -" for v in values))
            print(f"  {step:<18}" + "".join(f"{c:>24}" for c in cells))


def main_pair(args) -> None:
    """One worker + one listener against two workers + two listeners (as the HA topology runs them), at N = --hosts,
    in one run: each layout with a fresh database and lab, the listeners behind the same round-robin balancer, every
    worker on every queue (beat on the first). Rounds alternate the order, so that a machine growing busier
    favours neither."""
    n, layouts = args.hosts, {"one": 1, "two": 2}
    args.sizes = [n]
    results: dict[str, list[dict]] = {name: [] for name in layouts}
    for round_ in range(args.pair_runs):
        first = list(layouts) if args.pair_first == "one" else list(reversed(layouts))
        order = first if round_ % 2 == 0 else list(reversed(first))
        for name in order:
            count = layouts[name]
            try:
                r = run_once(n, args, workers=count, listeners=count, balanced=True)
            except RuntimeError as exc:
                print(f"{name}: did not finish: {exc}", flush=True)
                continue
            results[name].append(r)
            c = r["cpu_s"]
            print(f"{name} (workers {count}, listeners {count}), N={n}: provisioned in {r['makespan_s']:.1f}s; console "
                  f"{r['cpu_per_host']:.3f} CPU-s per host (listeners {c['web'] / n:.3f}, workers "
                  f"{(c['console'] - c['web']) / n:.3f}), {r['xact_per_host']:.0f} DB transactions per host; machine "
                  f"{100 * r['machine_busy']:.0f}% busy", flush=True)
    print(f"\nside by side, N = {n}, power changes land after {args.power_delay:g}s, {args.threads} threads a worker, "
          f"listeners behind one round-robin balancer (mean of {args.pair_runs} round(s))")
    print(f"  {'layout':<30} {'CPU-s per host':>15} {'transactions per host':>22} {'makespan':>9}")
    means = {}
    for name, count in layouts.items():
        runs = results[name]
        if not runs:
            print(f"  {name:<30} (did not finish)")
            continue
        means[name] = {key: sum(r[key] for r in runs) / len(runs) for key in ("cpu_per_host", "xact_per_host",
                                                                             "makespan_s")}
        m = means[name]
        label = f"{count} worker(s) + {count} listener(s)"
        print(f"  {label:<30} {m['cpu_per_host']:>15.3f} {m['xact_per_host']:>22.0f} {m['makespan_s']:>8.1f}s")
    if len(means) == 2:
        print(f"  two / one: CPU-s per host {means['two']['cpu_per_host'] / means['one']['cpu_per_host']:.2f}, "
              f"transactions per host {means['two']['xact_per_host'] / means['one']['xact_per_host']:.2f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--sweep", default="", help="more N to try, comma separated, e.g. 50,100,300")
    parser.add_argument("--power-delay", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--web-pool", type=int, default=10, help="the web server's PostgreSQL connections")
    parser.add_argument("--max-connections", type=int, default=40, help="refuse to start a console needing more")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--profile", default="", help="a folder: py-spy samples of the console at the largest N")
    parser.add_argument("--pair", action="store_true",
                        help="side by side at N = --hosts: one worker + one listener, then two workers + two listeners")
    parser.add_argument("--pair-runs", type=int, default=1,
                        help="with --pair: rounds, each both layouts (in turn one then two, two then one)")
    parser.add_argument("--pair-first", choices=["one", "two"], default="one",
                        help="with --pair: the layout the first round starts with")
    parser.add_argument("--warm", action="store_true", help="claim → Ready of warm hosts against cold ones")
    parser.add_argument("--warm-sizes", default="1,20,50", help="with --warm: the N to run, comma separated")
    parser.add_argument("--idle", type=float, default=60, help="with --warm: the quiet window, seconds")
    parser.add_argument("--warm-polls", default="5,600,600db",
                        help="with --warm: WARM_POLL_S values to run warm with, comma separated (suffix db: "
                             "without Redis)")
    args = parser.parse_args()
    # The settle window (hosts/boot/ramdisk.py) as the console measures it: a lab server fetches its iPXE script about
    # --power-delay after the power-on request, so its p95 × 1.5 + the margin (10.25 s at 5 s). A window shorter than
    # that fetch (the 3 s that BOOT_SETTLE_S gives the lab) is over before the fetch and would cost nothing here.
    margin = float(os.environ.setdefault("BOOT_SETTLE_MARGIN_S", "2"))
    os.environ.setdefault("BOOT_SETTLE_S", f"{(args.power_delay + 0.5) * 1.5 + margin:g}")
    if args.warm:
        main_warm(args)
        return
    if args.pair:
        main_pair(args)
        return
    sizes = [1, args.hosts] + [int(x) for x in args.sweep.split(",") if x]
    args.sizes = sizes
    results = {}
    for n in sizes:
        try:
            results[n] = r = run_once(n, args)
        except RuntimeError as exc:  # one N that does not finish still leaves the others' figures
            print(f"N={n:>4}: did not finish: {exc}", flush=True)
            continue
        print(f"N={n:>4}: registered+inspected in {r['registered_s']:.1f}s; provisioned in {r['makespan_s']:.1f}s; "
              f"console CPU {r['cpu_per_host']:.3f} CPU-s and {r['xact_per_host']:.0f} DB transactions per host",
              flush=True)
        c = r["cpu_s"]
        print(f"        CPU-s during the makespan: console {c['console']:.1f} (web {c['web']:.1f}, workers "
              f"{c['console'] - c['web']:.1f}), lab (BMCs, agents, tenant API) "
              f"{c['lab']:.1f}, PostgreSQL backends {c['postgres']:.1f}; whole machine "
              f"{100 * r['machine_busy']:.0f}% busy", flush=True)
    base = results[1]["makespan_s"]
    print(f"\npower changes land after {args.power_delay:g}s; console: agent listener (pool {args.web_pool}) + "
          f"{args.workers} worker(s) × {args.threads} threads (pool {args.threads + 1} each)")
    for n in sorted(results):
        print(f"makespan({n}) / makespan(1) = {results[n]['makespan_s'] / base:.2f}   "
              f"({results[n]['makespan_s']:.1f}s, {results[n]['cpu_per_host']:.3f} CPU-s per host)")
    ns = sorted(results)
    print("\nper-step durations (seconds), p50 / p95")
    print("  " + " " * 16 + "".join(f"{'N=' + str(n):>16}" for n in ns))
    for step in results[ns[-1]]["steps"]:
        cells = []
        for n in ns:
            values = results[n]["steps"].get(step) or [0]
            cells.append(f"{percentile(values, 50):6.2f} / {percentile(values, 95):6.2f}")
        print(f"  {step:<16}" + "".join(f"{c:>16}" for c in cells))

if __name__ == "__main__":
    main()
