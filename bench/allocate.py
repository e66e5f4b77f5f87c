"""Allocation at fleet scale: 10,000 hosts, 100 tenants, PostgreSQL, a real Celery worker on Redis.

  .venv/bin/python bench/allocate.py [--hosts 10000] [--tenants 100] [--repeat 50]

(a) one pool's quantity +1, repeated: p50/p95 of "pool change committed → claim has a host" (the change
    enqueues the reconcile on commit; no timer is involved);
(b) pools changed so that 1,000 claims appear at once: time until all are allocated;
(c) queries per reconcile pass for 10 and 100 pools, with 1 and with 10 new claims per pool.
"""
import argparse
import time

from _setup import Worker, fresh_database, percentile


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    fresh_database()

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from claims.models import NodeClaim
    from claims.reconcile import pools_reconcile
    from hosts.models import BareMetalHost
    from pools.models import OS_IMAGE_PROPERTY, NodePool, NodeProvider, NodeType, OSImage, Tenant
    from pools.services import pool_set_quantity

    provider = NodeProvider.objects.create(name="metal3")
    # A claim names the image it will be written with, or it waits (NoOSImage).
    OSImage.objects.create(name="bench-image", url="http://images.lab/bench.raw", checksum="ab" * 32)
    for role in ("gpu", "cpu"):
        NodeType.objects.create(name=f"{role}-server", provider=provider, declared_in_provider=True,
                                host_selector={"matchLabels": {"role": role}})
    t0 = time.perf_counter()
    BareMetalHost.objects.bulk_create([
        BareMetalHost(name=f"node-{i:05d}", bmc_address=f"redfish://10.{i // 65536}.{i // 256 % 256}.{i % 256}/redfish/v1/Systems/1",
                      boot_mac="52:54:00:%02x:%02x:%02x" % (i >> 16 & 255, i >> 8 & 255, i & 255),
                      labels={"role": "gpu" if i % 2 else "cpu", "rack": f"r{i // 40}"}, state="available")
        for i in range(args.hosts)], batch_size=2000)
    pools = []
    for t in range(args.tenants):
        tenant = Tenant.objects.create(name=f"tenant-{t:03d}",
                                       provider_properties={provider.name: {OS_IMAGE_PROPERTY: "bench-image"}})
        for role in ("gpu", "cpu"):
            pools.append(NodePool.objects.create(
                tenant=tenant, name=role, provider=provider, quantity=0,
                node_type_selector=[{"property": "vcluster.com/node-type", "value": f"{role}-server"}]))
    print(f"set-up: {args.hosts} hosts, {args.tenants} tenants, {len(pools)} pools in {time.perf_counter() - t0:.1f}s")

    def wait_until(predicate, timeout=60.0):
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError("timed out")
            time.sleep(0.002)

    # Reconciles only (the default queue): the hosts' BMCs are made up, so no drive may run (an allocated host whose
    # power-on failed would be taken from its claim, and the bench measures allocation alone).
    with Worker(concurrency=4, queues=("celery",)):
        # (a) pool change → claim allocated
        latencies = []
        pool = pools[0]
        for i in range(args.repeat):
            start = time.perf_counter()
            pool_set_quantity(pool=pool, quantity=i + 1, actor="bench")
            wait_until(lambda: NodeClaim.objects.filter(pool=pool, host__isnull=False).count() == i + 1)
            latencies.append(time.perf_counter() - start)
        print(f"(a) pool +1 → claim allocated, n={len(latencies)}: p50 {percentile(latencies, 50) * 1000:.0f} ms, "
              f"p95 {percentile(latencies, 95) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms (target p95 < 200 ms)")

        # (b) 1,000 claims at once: 100 pools +10 in one transaction
        burst = [p for p in pools if p.name == "cpu"][:100]
        before = NodeClaim.objects.filter(host__isnull=False).count()
        start = time.perf_counter()
        with transaction.atomic():
            for p in burst:
                pool_set_quantity(pool=p, quantity=10, actor="bench")
        committed = time.perf_counter()
        wait_until(lambda: NodeClaim.objects.filter(host__isnull=False).count() == before + 10 * len(burst), 120)
        done = time.perf_counter()
        print(f"(b) {10 * len(burst)} claims at once ({len(burst)} pools +10 in one commit): all allocated "
              f"{done - committed:.2f} s after the commit (the change itself took {committed - start:.2f} s; "
              "target < 2 s)")

    # (c) queries per reconcile pass
    gpu_pools = [p for p in pools if p.name == "gpu"]  # each pass starts by deleting the chosen pools' claims
    print("(c) queries per reconcile pass:")
    for n_pools in (10, 100):
        for per_pool in (1, 10):
            chosen = gpu_pools[:n_pools]
            for p in chosen:
                NodeClaim.objects.filter(pool=p).delete()
            NodePool.objects.filter(pk__in=[p.pk for p in chosen]).update(quantity=per_pool)
            BareMetalHost.objects.filter(state="provisioning", claim__isnull=True).update(state="available")
            with CaptureQueriesContext(connection) as ctx:
                result = pools_reconcile(pool_ids=[p.pk for p in chosen])
            print(f"    {n_pools:>3} pools × {per_pool:>2} new claims = {len(result.allocated):>4} allocated: "
                  f"{len(ctx.captured_queries)} queries")
            with CaptureQueriesContext(connection) as ctx:
                pools_reconcile(pool_ids=[p.pk for p in chosen])
            print(f"    {n_pools:>3} pools, nothing to do: {len(ctx.captured_queries)} queries")


if __name__ == "__main__":
    main()
