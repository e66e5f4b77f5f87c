"""Provisioning at fleet scale in the lab: N servers provisioned at once.

  .venv/bin/python bench/fleet.py --hosts 200 [--power-delay 5] [--workers 2] [--sweep 50,100,200]

For each N (and N = 1 as the reference) a fresh database and a fresh lab: N gpu-servers registered and
inspected, then one tenant's pool set to N, and the time from that commit until every claim is
Available (the makespan). Prints makespan(N) / makespan(1), per-step p50/p95, and the CPU seconds that
the console's own processes (web server, Celery workers) spent per provisioned host; the lab (BMC
emulator, agents, tenant API) is excluded. Power changes land after a fixed --power-delay, the same
for every server, so that the ratio shows what the console adds and not the spread of random delays.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _setup import ROOT, fresh_database, percentile

os.environ["DATABASE_URL"] = os.environ.get("FLEET_DATABASE_URL", "postgres://root@127.0.0.1:5432/vmetal_bench_fleet")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/3")
os.environ.setdefault("DRIVE_STALE_EVERY_S", "5")
os.environ.setdefault("AGENT_SILENCE_S", "30")
CLK = os.sysconf("SC_CLK_TCK")
NETWORK = """\
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata: {name: servers, namespace: p-default}
spec:
  providerRef: metal3
  properties:
    metal3.vcluster.com/network-cidr: 10.10.0.1/16
    metal3.vcluster.com/network-ip-range: 10.10.1.0-10.10.250.255
"""


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Console:
    """The console's own processes: a web server (agent endpoints) and Celery workers with beat."""

    def __init__(self, workers: int, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = Path(tempfile.mkdtemp(prefix="vmetal-fleet-"))
        env = {**os.environ, "LOG_LEVEL": "WARNING", "CELERY_BEAT_SCHEDULE_FILENAME": str(self.logs / "beat")}
        self.procs = [subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}", "--noreload", "--skip-checks"],
            cwd=ROOT, env=env, stdout=open(self.logs / "web.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)]
        for i in range(workers):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "vmetal_console", "worker", "-Q",
                 os.environ["CELERY_TASK_DEFAULT_QUEUE"], "-P", "threads", "-c", str(threads), "-n", f"w{i}@%h",
                 "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning",
                 *(["-B"] if i == 0 else [])],
                cwd=ROOT, env=env, stdout=open(self.logs / f"worker{i}.log", "w"), stderr=subprocess.STDOUT,
                start_new_session=True))
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError((self.logs / "web.log").read_text())
                time.sleep(0.2)
        time.sleep(2)  # workers connect

    def cpu(self) -> float:
        return cpu_seconds([p.pid for p in self.procs])

    def stop(self):
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def run_once(n: int, args) -> dict:
    fresh_database()
    from django.core.management import call_command
    from django.db.models import Count

    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost
    from lab.site import IMAGE_NAME, LabSite
    from manifests.apply import apply_files
    from pools.models import NodePool

    console = Console(args.workers, args.threads)
    site = LabSite(hosts=n, gpu_hosts=n, tenants=["bench"], console_url=console.url, agent_mode="thread",
                   power_delay=(args.power_delay, args.power_delay),
                   var_dir=Path(tempfile.mkdtemp(prefix="vmetal-fleet-lab-"))).start()
    try:
        call_command("apply", "-f", str(ROOT / "demo" / "site.yaml"), verbosity=0)
        apply_files([("network", NETWORK)], actor="bench")  # room for every node's address
        site.register()
        t0 = time.monotonic()
        while BareMetalHost.objects.filter(state="available").count() < n:
            if time.monotonic() - t0 > args.timeout:
                raise RuntimeError(f"registration: {dict(BareMetalHost.objects.values_list('state').annotate(Count('pk')))}")
            time.sleep(0.5)
        registered = time.monotonic() - t0
        cpu_before = console.cpu()

        pool = (f"privateNodes:\n  autoNodes:\n    - provider: metal3\n      properties:\n"
                f"        vcluster.com/os-image: {IMAGE_NAME}\n      static:\n        - name: gpu\n"
                f"          quantity: {n}\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                f"              value: gpu-server\n")
        start = time.monotonic()
        apply_files([("pool", pool)], actor="bench", tenant="bench")
        while NodeClaim.objects.filter(phase="Available").count() < n:
            if time.monotonic() - start > args.timeout:
                phases = dict(NodeClaim.objects.values_list("phase").annotate(Count("pk")))
                raise RuntimeError(f"provisioning did not finish: {phases}")
            time.sleep(0.2)
        makespan = time.monotonic() - start
        cpu = console.cpu() - cpu_before
        steps = {}
        for step, duration in Event.objects.filter(kind="step", message="done", data__flow="provision") \
                .values_list("step", "duration_s"):
            steps.setdefault(step, []).append(duration)
        assert NodePool.objects.get().quantity == n
        return {"n": n, "registered_s": registered, "makespan_s": makespan, "cpu_per_host": cpu / n, "steps": steps}
    finally:
        site.stop()
        console.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--sweep", default="", help="more N to try, comma separated, e.g. 50,100,300")
    parser.add_argument("--power-delay", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    sizes = [1, args.hosts] + [int(x) for x in args.sweep.split(",") if x]
    results = {}
    for n in sizes:
        results[n] = r = run_once(n, args)
        print(f"N={n:>4}: registered+inspected in {r['registered_s']:.1f}s; provisioned in {r['makespan_s']:.1f}s; "
              f"console CPU {r['cpu_per_host']:.3f} CPU-s per host", flush=True)
    base = results[1]["makespan_s"]
    print(f"\npower changes land after {args.power_delay:g}s; console: web + {args.workers} worker(s) × {args.threads} threads")
    for n in sorted(results):
        print(f"makespan({n}) / makespan(1) = {results[n]['makespan_s'] / base:.2f}")
    print(f"\nper-step durations (seconds): p50 / p95 at N=1 and at N={args.hosts}")
    for step, values in results[args.hosts]["steps"].items():
        one = results[1]["steps"].get(step, [0])
        print(f"  {step:<16} {percentile(one, 50):6.2f} / {percentile(one, 95):6.2f}    "
              f"{percentile(values, 50):6.2f} / {percentile(values, 95):6.2f}")


if __name__ == "__main__":
    main()
