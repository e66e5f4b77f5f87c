"""A day of churn: a lab fleet whose claims are made and released all along, and the invariants that must hold.

  .venv/bin/python bench/soak.py [--hosts 1000] [--duration 3600] [--warmup 600] [--churn 0.10] [--claimed 0.2]
                                 [--tenants 10] [--power-delay 2] [--workers 2] [--threads 8] [--web-pool 10]
                                 [--sample 60] [--settle 900] [--csv FILE]

The console runs as in production (bench/_setup.py Console): the agent listener (manage.py agent-listener) with DEBUG
off, --workers Celery workers, Celery beat as a process of its own, each with a bounded PostgreSQL pool
(DATABASE_POOL_MAX). The lab (lab/site.py) serves --hosts gpu-servers with thread agents, their BMCs in one emulator
process, and --tenants tenant APIs. Warm-up, not measured: every server registered through the console's own
registration (manifests, as `manage.py lab register` does; spec.inspectionMode fast, so the inventory is the BMC's and
the intake gate still erases each one), then one static pool per tenant, --claimed × hosts claims in all, every one
Available.

The soak, --duration seconds: every minute, ~churn × hosts / 60 claims are given back and as many made, by resizing
the tenants' static pools through the path a user takes (manifests.apply.apply_files, as `vcluster.yaml` is applied):
the largest pools shrink, the smallest grow, so the claimed population stays steady. The first --warmup seconds of it
are warm-up: memory drift is judged against the first sample after it. Every --sample seconds: RSS of each console
process and of the lab, PostgreSQL connections to the bench database, the Event table's rows and bytes, claims by
phase, hosts by state. Then churn stops and the fleet is given --settle seconds to finish what is under way.

Checked at the end (exit status 1 if any fails):
  claims lost       a claim seen once that no longer exists, a live claim Failed, a Released claim without its
                    Released transition, or a pool whose demand is not met (live claims Available ≠ quantity) after
                    the settle
  hosts with two    a host with two live claims (the database), or two claims whose tenures on one host overlap
  claims            (the next scheduled before the previous was released)
  stuck hosts       a host in an in-progress state past its deadline_at (hosts/lifecycle.py deadline_for) at any
                    sample, or moved to error or repair during the soak (the deadline sweep's or a gate's verdict)
  erased releases   every claim released from a host has a passing erase certificate (hosts.EraseCertificate,
                    claim_name) signed by its release gate (between its scheduling and its Released)
  memory            each console process's RSS after warm-up within ±10 % of its first sample after warm-up
  connections       the most connections to the bench database ≤ the console's pools + the bench's own
Printed: Event rows and bytes per host-hour and per claim made and released over the measured window, the rows that
EVENT_RETENTION_DAYS may prune (events/retention.py: routine step events) apart from those kept for ever, and the disk
a year of such churn takes with it.
"""
import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _setup import ROOT, Console, fresh_database, rss_bytes

os.environ["DATABASE_URL"] = os.environ.get("SOAK_DATABASE_URL", "postgres://root@127.0.0.1:5432/vmetal_bench_soak")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/5")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/6")
os.environ.setdefault("AGENT_CALL_ADDRESS_LIMIT", "1000000")  # every lab agent calls from 127.0.0.1
os.environ.setdefault("SECRET_KEY", "soak-bench-" + os.urandom(8).hex())  # the console runs with DEBUG off

LIVE = ("Pending", "Provisioning", "Joining", "Available")
BUSY = ("Pending", "Provisioning", "Joining", "Releasing")
DRIFT = 0.10  # memory within ±10 % of its first sample after warm-up


def pool_manifest(quantity: int) -> str:
    from lab.site import IMAGE_NAME

    return (f"privateNodes:\n  autoNodes:\n    - provider: metal3\n      properties:\n"
            f"        vcluster.com/os-image: {IMAGE_NAME}\n      static:\n        - name: gpu\n"
            f"          quantity: {quantity}\n          nodeTypeSelector:\n"
            f"            - property: vcluster.com/node-type\n              value: gpu-server\n")


def resize(tenant: str, quantity: int) -> None:
    from manifests.apply import apply_files

    apply_files([("vcluster.yaml", pool_manifest(quantity))], actor="user:soak", tenant=tenant)


def counts(model, field: str) -> dict[str, int]:
    from django.db.models import Count

    return dict(model.objects.values_list(field).annotate(Count("pk")).order_by())


def sql(query: str, *params):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()


def wait(what: str, done, timeout: float, status) -> float:
    t0 = time.monotonic()
    while not done():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what} did not finish in {timeout:.0f}s: {status()}")
        time.sleep(1)
    return time.monotonic() - t0


class Soak:
    def __init__(self, args):
        self.args = args
        self.samples: list[dict] = []
        self.claims_seen: set[int] = set()
        self.stuck: dict[str, str] = {}  # host → the first sample that found it past its deadline
        self.made = self.released = 0

    # --- warm-up: the fleet and its claims ---------------------------------------------------------------------
    def start(self):
        args = self.args
        fresh_database()
        from django.core.management import call_command

        from claims.models import NodeClaim
        from hosts.models import BareMetalHost
        from lab.site import ROOMY_NETWORK, LabSite
        from manifests.apply import apply_files

        self.console = Console(args.workers, args.threads, args.web_pool, separate_beat=True)
        self.tenants = [f"t{i:02d}" for i in range(args.tenants)]
        self.site = LabSite(hosts=args.hosts, gpu_hosts=args.hosts, tenants=self.tenants, console_url=self.console.url,
                            agent_mode="thread", power_delay=(args.power_delay, args.power_delay),
                            inspection_modes={f"gpu-{i + 1:02d}": "fast" for i in range(args.hosts)},
                            disk_bytes=args.disk_mib * 2**20, thin_disks=not args.dense_disks,
                            var_dir=Path(tempfile.mkdtemp(prefix="vmetal-soak-lab-"))).start()
        self.lab_pids = {"lab": os.getpid(), "lab-bmc": self.site.redfish._proc.pid}
        call_command("apply", "-f", str(ROOT / "demo" / "site.yaml"), verbosity=0)
        apply_files([("network", ROOMY_NETWORK)], actor="bench")  # room for every node's address
        t0 = time.monotonic()
        self.register(args.register_batch)
        print(f"registered and inspected {args.hosts} servers in {time.monotonic() - t0:.0f}s", flush=True)
        claimed = round(args.claimed * args.hosts)
        self.quantity = {t: claimed // len(self.tenants) + (i < claimed % len(self.tenants))
                         for i, t in enumerate(self.tenants)}
        t0 = time.monotonic()
        for tenant, q in self.quantity.items():
            resize(tenant, q)
        wait("first claims", lambda: NodeClaim.objects.filter(phase="Available").count() >= claimed, args.timeout,
             lambda: counts(NodeClaim, "phase"))
        print(f"{claimed} claims over {len(self.tenants)} tenants Available in {time.monotonic() - t0:.0f}s", flush=True)

    def register(self, batch: int) -> None:
        """The lab's manifests applied as `manage.py lab register` applies them (LabSite.register), the servers
        `batch` at a time, each batch inspected before the next (a thousand intakes at once would only queue up
        behind each other past their steps' deadlines)."""
        from hosts.models import BareMetalHost
        from manifests.apply import apply_files
        from pools.models import Tenant
        from pools.services import tenant_set_api

        docs = ["---\n" + d for d in self.site.manifests().split("---\n") if d.strip()]
        servers = [d for d in docs if "\nkind: BareMetalHost\n" in d or "\nkind: Secret\n" in d]
        apply_files([("lab", "".join(d for d in docs if d not in servers))], actor="system:lab")
        for name, server in self.site.tenants.items():
            tenant = Tenant.objects.filter(name=name).first() or Tenant(name=name)
            tenant_set_api(tenant=tenant, api_endpoint=server.endpoint, kubeconfig=server.kubeconfig(),
                           actor="system:lab")
        self.site.configure_node_types()
        per = 2 * batch  # each server: its BMC Secret and its BareMetalHost
        for i in range(0, len(servers), per):
            apply_files([("lab", "".join(servers[i:i + per]))], actor="system:lab")
            want = min(self.args.hosts, (i + per) // 2)
            t0 = time.monotonic()
            wait("registration", lambda: BareMetalHost.objects.filter(state="available").count() >= want,
                 self.args.timeout, lambda: counts(BareMetalHost, "state"))
            print(f"  {want} servers available ({time.monotonic() - t0:.0f}s for this batch; hosts "
                  f"{counts(BareMetalHost, 'state')}; load {os.getloadavg()[0]:.1f})", flush=True)

    # --- the soak ----------------------------------------------------------------------------------------------
    def churn(self, moves: int) -> None:
        """Give back `moves` claims from the largest pools and make as many in the smallest."""
        if moves <= 0:
            return
        order = sorted(self.tenants, key=lambda t: (-self.quantity[t], t))
        half = len(order) // 2
        donors, takers = order[:half], order[half:][::-1]
        delta = dict.fromkeys(self.tenants, 0)
        for i in range(moves):
            donor = donors[i % len(donors)]
            if self.quantity[donor] + delta[donor] <= 0:
                continue
            delta[donor] -= 1
            delta[takers[i % len(takers)]] += 1
        for tenant, d in delta.items():
            if d:
                self.quantity[tenant] += d
                resize(tenant, self.quantity[tenant])
                self.made += max(d, 0)
                self.released += max(-d, 0)

    def sample(self, at: float, phase: str) -> dict:
        from django.utils import timezone

        from claims.models import NodeClaim
        from events.models import Event
        from events.retention import KEPT_STEP
        from hosts.lifecycle import IN_PROGRESS
        from hosts.models import BareMetalHost

        memory = {name: rss_bytes(p.pid) for name, p in zip(self.console.names, self.console.procs)}
        memory.update({name: rss_bytes(pid) for name, pid in self.lab_pids.items()})
        connections = sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")[0]
        rows, size = sql("SELECT count(*), pg_total_relation_size('events_event') FROM events_event")
        step_rows = Event.objects.filter(kind="step").exclude(KEPT_STEP).count()  # what retention may prune
        now = timezone.now()
        for name in BareMetalHost.objects.filter(state__in=IN_PROGRESS, deadline_at__lt=now) \
                .values_list("name", flat=True):
            self.stuck.setdefault(name, f"t={at:.0f}s")
        self.claims_seen.update(NodeClaim.objects.values_list("pk", flat=True))
        row = {"t": round(at), "phase": phase, "memory": memory, "connections": connections, "event_rows": rows,
               "event_bytes": size, "step_rows": step_rows, "claims": counts(NodeClaim, "phase"),
               "hosts": counts(BareMetalHost, "state"), "made": self.made, "released": self.released,
               "console_cpu_s": round(self.console.cpu(), 1), "load": os.getloadavg()[0]}
        self.samples.append(row)
        mem = " ".join(f"{k} {v / 2**20:.0f}" for k, v in memory.items())
        print(f"t={at:5.0f}s {phase:<7} load {row['load']:.1f} | RSS MiB {mem} | conns {connections} | events "
              f"{rows} ({size / 2**20:.1f} MiB) | claims {row['claims']} | hosts {row['hosts']} | "
              f"made {self.made} released {self.released}", flush=True)
        return row

    def run(self) -> None:
        from django.utils import timezone

        args = self.args
        per_minute = args.churn * args.hosts / 60
        self.started = timezone.now()
        t0 = time.monotonic()
        next_sample, next_churn, due = t0, t0, 0.0
        while (now := time.monotonic()) - t0 < args.duration:
            if now >= next_churn:
                due += per_minute
                self.churn(int(due))
                due -= int(due)
                next_churn += 60
            if now >= next_sample:
                at = now - t0
                if at >= args.warmup and not hasattr(self, "measured_from"):
                    self.measured_from = (timezone.now(), len(self.samples))
                self.sample(at, "warmup" if at < args.warmup else "soak")
                next_sample += args.sample
            time.sleep(max(0.0, min(next_sample, next_churn) - time.monotonic()))
        self.sample(time.monotonic() - t0, "soak")
        self.ended = timezone.now()
        self.window_end = len(self.samples)
        # Settle: what is under way finishes; nothing new is asked.
        self.settle_s = self._settle(args.settle)
        self.sample(time.monotonic() - t0, "settled")

    def _settle(self, timeout: float) -> float | None:
        from claims.models import NodeClaim
        from hosts.lifecycle import IN_PROGRESS
        from hosts.models import BareMetalHost

        def done():
            return (not NodeClaim.objects.filter(phase__in=BUSY).exists()
                    and not BareMetalHost.objects.filter(state__in=IN_PROGRESS).exists())
        try:
            return wait("settle", done, timeout, lambda: counts(NodeClaim, "phase"))
        except RuntimeError as exc:
            print(exc, flush=True)
            return None

    # --- the verdict -------------------------------------------------------------------------------------------
    def check(self) -> bool:
        from django.db.models import Count, Q

        from claims.models import NodeClaim
        from events.models import Event
        from hosts.models import BareMetalHost, EraseCertificate
        from pools.models import NodePool

        ok = True

        def verdict(name: str, failures: list, detail: str = "") -> None:
            nonlocal ok
            ok &= not failures
            shown = ", ".join(map(str, failures[:10])) + (" …" if len(failures) > 10 else "")
            print(f"  {'ok  ' if not failures else 'FAIL'} {name}: {len(failures)}{' (' + shown + ')' if failures else ''}"
                  f"{'; ' + detail if detail else ''}", flush=True)

        print("\ninvariants", flush=True)
        existing = set(NodeClaim.objects.values_list("pk", flat=True))
        vanished = sorted(self.claims_seen - existing)
        failed = list(NodeClaim.objects.filter(phase="Failed").values_list("name", flat=True))
        released = NodeClaim.objects.filter(phase="Released")
        with_event = set(Event.objects.filter(kind="transition", to_state="Released", claim__isnull=False)
                         .values_list("claim_id", flat=True))
        unrecorded = [c.name for c in released if c.pk not in with_event or c.released_at is None]
        unmet = []
        for pool in NodePool.objects.select_related("tenant"):
            live = pool.claims.filter(phase__in=LIVE, replacement_of__isnull=True)
            available = live.filter(phase="Available").count()
            if live.count() != pool.quantity or available != pool.quantity:
                unmet.append(f"{pool.tenant.name}/{pool.name}: {available} Available of {pool.quantity}")
        verdict("claims lost", [f"vanished {v}" for v in vanished] + [f"Failed {f}" for f in failed]
                + [f"no Released record {u}" for u in unrecorded] + unmet,
                f"{len(self.claims_seen)} claims seen, {self.made} made and {self.released} released by the churn; "
                f"settled in {'%.0fs' % self.settle_s if self.settle_s is not None else 'NOT within --settle'}")

        doubled = list(NodeClaim.objects.filter(phase__in=LIVE + ("Releasing",), host__isnull=False)
                       .values("host_id").annotate(n=Count("pk")).filter(n__gt=1).values_list("host_id", flat=True))
        overlaps, tenure = [], {}
        for c in NodeClaim.objects.exclude(host_name="").exclude(scheduled_at=None).order_by("host_name", "scheduled_at"):
            prev = tenure.get(c.host_name)
            if prev is not None and (prev.released_at is None or prev.released_at > c.scheduled_at):
                overlaps.append(f"{c.host_name}: {prev.name} and {c.name}")
            tenure[c.host_name] = c
        verdict("hosts with two claims", [f"host {h}" for h in doubled] + overlaps)

        window = Q(created_at__gte=self.started)
        failed_moves = list(Event.objects.filter(window, kind="transition", object_type="host",
                                                 to_state__in=["error", "repair"])
                            .values_list("object_name", "to_state", "message")[:50])
        verdict("hosts stuck past their deadline",
                [f"{h} past its deadline at {at}" for h, at in self.stuck.items()]
                + [f"{h} → {s}: {m[:120]}" for h, s, m in failed_moves],
                f"hosts now: {counts(BareMetalHost, 'state')}")

        releases = NodeClaim.objects.filter(phase="Released", released_at__gte=self.started).exclude(host_name="")
        passing = {}
        for name, at in EraseCertificate.objects.filter(result="pass", claim_name__in=releases.values("name")) \
                .values_list("claim_name", "created_at"):
            passing.setdefault(name, []).append(at)
        # Signed by the release's gate: after the claim's host was scheduled, before the claim is Released.
        unerased = [c.name for c in releases if not any(c.scheduled_at <= at <= c.released_at
                                                        for at in passing.get(c.name, []))]
        verdict("releases without an erase certificate", unerased,
                f"{releases.count()} releases from a host, {sum(map(len, passing.values()))} passing certificates")

        measured = self.samples[self.measured_from[1]:self.window_end]
        drifts = []
        print("\nmemory (RSS MiB) after warm-up: first / last / min / max, drift", flush=True)
        for name in measured[0]["memory"]:
            values = [s["memory"][name] for s in measured if s["memory"][name]]
            first = values[0]
            lo, hi = (min(values) - first) / first, (max(values) - first) / first
            console_process = name in self.console.names
            print(f"  {name:<8} {first / 2**20:7.1f} {values[-1] / 2**20:7.1f} {min(values) / 2**20:7.1f} "
                  f"{max(values) / 2**20:7.1f}   {100 * lo:+.1f} % / {100 * hi:+.1f} %"
                  f"{'' if console_process else '   (the lab: shown, not judged)'}", flush=True)
            if console_process and (hi > DRIFT or lo < -DRIFT):
                drifts.append(f"{name} {100 * lo:+.1f} %/{100 * hi:+.1f} %")
        verdict("console processes whose memory drifted past ±10 %", drifts,
                f"{len(measured)} samples after warm-up")

        most = max(s["connections"] for s in self.samples)
        verdict("connections over the pools' bound", [most] if most > self.console.connections else [],
                f"most {most} of at most {self.console.connections} (listener {self.args.web_pool}, "
                f"{self.args.workers} × ({self.args.threads} + 1), beat 1, the bench 1)")
        self.figures(measured)
        return ok

    def figures(self, measured: list[dict]) -> None:
        first, last = measured[0], measured[-1]
        hours = (last["t"] - first["t"]) / 3600
        host_hours = self.args.hosts * hours
        rows = last["event_rows"] - first["event_rows"]
        steps = last["step_rows"] - first["step_rows"]
        size = last["event_bytes"] - first["event_bytes"]
        per_row = last["event_bytes"] / max(1, last["event_rows"])  # table + indexes + TOAST, all rows
        cycles = (last["made"] - first["made"])
        print(f"\nEvent table over {hours * 60:.0f} min of soak ({cycles} claims made and as many released, "
              f"churn {100 * self.args.churn:.0f} %/h of {self.args.hosts} hosts):", flush=True)
        print(f"  {rows / host_hours:.2f} rows per host-hour ({steps / host_hours:.2f} routine step events that "
              f"retention prunes, {(rows - steps) / host_hours:.2f} kept for ever); {size / host_hours:.0f} bytes per "
              f"host-hour as measured "
              f"(pg_total_relation_size), {per_row:.0f} bytes per row on average", flush=True)
        if cycles:
            print(f"  per claim made and released: {rows / cycles:.0f} rows ({steps / cycles:.0f} prunable), "
                  f"{size / cycles:.0f} bytes",
                  flush=True)
        year = 24 * 365
        for retention in (0, 30, 90):
            kept_steps = steps / host_hours * (year if retention == 0 else 24 * retention)
            total = ((rows - steps) / host_hours * year + kept_steps) * per_row
            print(f"  a year at this churn, EVENT_RETENTION_DAYS={retention}"
                  f"{' (keep all)' if retention == 0 else ''}: {total / 2**20:.0f} MiB per host, "
                  f"{total * 1000 / 2**30:.1f} GiB per 1,000 hosts", flush=True)
        if cycles:  # the events follow the claims: the fleet's size adds none while its hosts are idle
            for retention in (0, 30, 90):
                kept = steps / cycles * (year if retention == 0 else 24 * retention)
                total = 100 * ((rows - steps) / cycles * year + kept) * per_row
                print(f"  100 claims made and released an hour (1,000 hosts at 10 %/h), a year, "
                      f"EVENT_RETENTION_DAYS={retention}: {total / 2**30:.1f} GiB", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=3600, help="seconds of churn, warm-up included")
    parser.add_argument("--warmup", type=float, default=600, help="the first seconds of churn memory is not judged on")
    parser.add_argument("--churn", type=float, default=0.10, help="claims made (and as many released) per hour, as a "
                                                                   "fraction of --hosts")
    parser.add_argument("--claimed", type=float, default=0.2, help="the claimed population, a fraction of --hosts")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--power-delay", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--web-pool", type=int, default=10, help="the agent listener's PostgreSQL connections")
    # Each release (and each intake) purges both of a server's disks at the strongest level (a host that may go to
    # another tenant). On thin disks (the default) the lab plays the purge as a discard (the files read back zeros and
    # stay sparse); --dense-disks writes every byte, which needs hosts × 2 × --disk-mib free.
    parser.add_argument("--disk-mib", type=int, default=80, help="each lab disk's size (the image and the 64 MiB "
                                                                   "seed region must fit)")
    parser.add_argument("--dense-disks", action="store_true", help="erases write every byte of the disk files")
    parser.add_argument("--register-batch", type=int, default=200, help="servers registered at a time (warm-up)")
    parser.add_argument("--sample", type=float, default=60, help="seconds between samples")
    parser.add_argument("--settle", type=float, default=900, help="after the churn, seconds for the work under way")
    parser.add_argument("--timeout", type=float, default=3600, help="registration and the first claims, each")
    parser.add_argument("--csv", default="", help="write the samples here")
    args = parser.parse_args()
    if args.warmup >= args.duration:
        raise SystemExit("--warmup must be shorter than --duration")
    margin = float(os.environ.setdefault("BOOT_SETTLE_MARGIN_S", "2"))  # as bench/fleet.py
    os.environ.setdefault("BOOT_SETTLE_S", f"{(args.power_delay + 0.5) * 1.5 + margin:g}")
    soak, ok = Soak(args), False
    try:
        soak.start()
        soak.run()
        ok = soak.check()
    finally:
        if hasattr(soak, "site"):
            soak.site.stop()
            shutil.rmtree(soak.site.var_dir, ignore_errors=True)
        if hasattr(soak, "console"):
            soak.console.stop()
        if args.csv and soak.samples:
            with open(args.csv, "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["t", "phase", "load", "connections", "event_rows", "event_bytes", "prunable_rows",
                                 "made", "released", "console_cpu_s", "memory", "claims", "hosts"])
                for s in soak.samples:
                    writer.writerow([s["t"], s["phase"], s["load"], s["connections"], s["event_rows"],
                                     s["event_bytes"], s["step_rows"], s["made"], s["released"], s["console_cpu_s"],
                                     json.dumps(s["memory"]), json.dumps(s["claims"]), json.dumps(s["hosts"])])
    print(f"\n{'all invariants held' if ok else 'INVARIANTS FAILED'}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
