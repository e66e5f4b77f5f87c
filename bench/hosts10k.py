"""The fleet's reads at 10,000 registered hosts: server time and queries per read.

  .venv/bin/python bench/hosts10k.py [--hosts 10000] [--tenants 100] [--repeat 5] [--profile DIR]

A fresh PostgreSQL database (`vmetal_bench` unless DATABASE_URL names another), then `--hosts` hosts in a running
fleet's mix: most serving claims of `--tenants` tenants (two pools each, claims in every live phase), a quarter
free, the rest in repair, error, maintenance, being inspected or provisioned; labels (role, rack, rail group), three
Events per host (the needs-attention card and the repair page read the reason from them). Each read is served in
this process through Django's test client (middleware, session, view, template or serializer; DEBUG off), or for
`status --json` through call_command: one call to warm up, then `--repeat` timed calls; the median of the wall
time and of this process's CPU time (time.process_time: the server's own work, not the database's), the queries
of one call and their SQL time. `--profile DIR` writes a cProfile of one call of each read that takes over 1 s
(wall, median) to DIR/<read>.prof and prints its top functions.
"""
import argparse
import cProfile
import io
import pstats
import statistics
import time
from pathlib import Path

from _setup import fresh_database

# A running fleet: most hosts serve claims, a quarter are free, a few need attention or are on their way.
MIX = (["provisioned"] * 60 + ["available"] * 25 + ["repair"] * 4 + ["error"] * 3 + ["maintenance"] * 3
       + ["inspecting"] * 2 + ["provisioning"] * 2 + ["retired"] * 1)
PHASES = ("Available",) * 8 + ("Joining", "Releasing")

READS = [
    ("fleet board /hosts/", "get", "/hosts/", {}),
    ("fleet board, filtered (state=repair, tenant)", "get", "/hosts/", {"state": "repair", "tenant": "tenant-007"}),
    ("fleet board, last page", "get", "/hosts/", {"page": "last"}),
    ("attention list /repair/", "get", "/repair/", {}),
    ("capacity /node-types/", "get", "/node-types/", {}),
    ("capacity API /api/v1/capacity/", "get", "/api/v1/capacity/", {}),
    ("hosts API /api/v1/hosts/", "get", "/api/v1/hosts/", {}),
    ("hosts API, page_size=500", "get", "/api/v1/hosts/", {"page_size": "500"}),
    ("hosts API, state=repair", "get", "/api/v1/hosts/", {"state": "repair"}),
    ("status --json", "status", None, None),
]


def build(hosts: int, tenants: int) -> None:
    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost
    from pools.models import NodePool, NodeProvider, NodeType, Tenant

    provider = NodeProvider.objects.create(name="metal3")
    types = {role: NodeType.objects.create(name=f"{role}-server", provider=provider, declared_in_provider=True,
                                           host_selector={"matchLabels": {"role": role}})
             for role in ("gpu", "cpu")}
    BareMetalHost.objects.bulk_create([
        BareMetalHost(name=f"node-{i:05d}",
                      bmc_address=f"redfish://10.{i // 65536}.{i // 256 % 256}.{i % 256}/redfish/v1/Systems/1",
                      boot_mac="52:54:00:%02x:%02x:%02x" % (i >> 16 & 255, i >> 8 & 255, i & 255),
                      labels={"role": "gpu" if i % 2 else "cpu", "rack": f"r{i // 40}", "rail-group": f"g{i % 8}"},
                      state=MIX[i * 7 % len(MIX)], inventory={"gpus": 8 if i % 2 else 0},
                      error_message="bench: BMC did not answer" if MIX[i * 7 % len(MIX)] == "error" else "")
        for i in range(hosts)], batch_size=2000)
    made = Tenant.objects.bulk_create([Tenant(name=f"tenant-{t:03d}") for t in range(tenants)])
    NodePool.objects.bulk_create([NodePool(tenant=t, name=role, provider=provider, quantity=0)
                                  for t in made for role in ("gpu", "cpu")])
    pools = {(p.tenant_id, p.name): p for p in NodePool.objects.all()}
    serving = list(BareMetalHost.objects.filter(state__in=("provisioned", "provisioning")).order_by("pk"))
    claims = []
    for i, h in enumerate(serving):
        tenant, role = made[i % len(made)], h.labels["role"]
        claims.append(NodeClaim(name=f"claim-{h.pk}", tenant=tenant, pool=pools[(tenant.pk, role)], pool_name=role,
                                provider=provider, node_type=types[role], host=h, host_name=h.name,
                                phase="Provisioning" if h.state == "provisioning" else PHASES[i % len(PHASES)]))
    NodeClaim.objects.bulk_create(claims, batch_size=2000)
    everyone = BareMetalHost.objects.order_by("pk").only("pk", "name", "state")
    Event.objects.bulk_create([
        Event(kind="transition", object_type="host", object_name=h.name, host_id=h.pk, from_state=a, to_state=b,
              message=f"bench: {a} → {b}", actor="bench:hosts10k")
        for h in everyone for a, b in (("registering", "inspecting"), ("inspecting", "available"),
                                       ("available", h.state))], batch_size=5000)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would soon after a bulk load
    print(f"fleet: {BareMetalHost.objects.count():,} hosts, {len(made)} tenants, {len(claims):,} claims, "
          f"{Event.objects.count():,} Events", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", type=Path, help="cProfile each read over 1 s into this folder")
    args = parser.parse_args()
    fresh_database()

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    started = time.perf_counter()
    build(args.hosts, args.tenants)
    print(f"set-up in {time.perf_counter() - started:.0f} s", flush=True)
    admin = User.objects.create_superuser("bench", "bench@example.invalid", "bench-password-not-used")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(admin)
    pages = -(-args.hosts // 50)

    def call(kind, path, params):
        if kind == "status":
            out = io.StringIO()
            call_command("status", "--json", stdout=out)
            return
        response = client.get(path, {k: (str(pages) if v == "last" else v) for k, v in params.items()})
        assert response.status_code == 200, (path, response.status_code)

    print(f"{'read':<48} {'queries':>7} {'wall p50':>9} {'CPU p50':>8} {'SQL':>7}  (median of {args.repeat})")
    for label, kind, path, params in READS:
        call(kind, path, params)  # to warm up
        walls, cpus = [], []
        for _ in range(args.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            call(kind, path, params)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        with CaptureQueriesContext(connection) as ctx:
            call(kind, path, params)
        sql = sum(float(q["time"]) for q in ctx.captured_queries)
        wall = statistics.median(walls)
        print(f"{label:<48} {len(ctx.captured_queries):>7} {wall * 1000:>6.0f} ms {statistics.median(cpus) * 1000:>5.0f} ms"
              f" {sql * 1000:>4.0f} ms", flush=True)
        if args.profile and wall > 1.0:
            args.profile.mkdir(parents=True, exist_ok=True)
            profiler = cProfile.Profile()
            profiler.runcall(call, kind, path, params)
            out = args.profile / (label.split()[0] + "-" + str(abs(hash(label)) % 1000) + ".prof")
            profiler.dump_stats(out)
            print(f"  profile: {out}")
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


if __name__ == "__main__":
    main()
