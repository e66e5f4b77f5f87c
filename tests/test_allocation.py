"""The allocator: cheapest matching type, one host per claim, reasons a person understands."""
import threading

import pytest
from django.core.management import call_command
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext

from claims.allocation import AllocationResult, claims_allocate
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.reconcile import pools_reconcile
from hosts.models import BareMetalHost
from pools.models import Tenant

from .factories import IMAGE, make_hosts, make_pool

@pytest.fixture
def site(apply):
    apply(open("demo/site.yaml").read())


def roomy_network():
    """The demo's network hands out 22 addresses, and a claim takes no host without one (claims.ipam): tests of
    hosts at scale give it room."""
    from pools.models import NodeEnvironment

    NodeEnvironment.objects.filter(name="servers").update(properties={
        "metal3.vcluster.com/network-cidr": "10.0.0.1/16", "metal3.vcluster.com/network-ip-range": "10.0.1.0-10.0.9.255"})


@pytest.mark.django_db
def test_no_free_host_leaves_the_claim_pending_with_a_reason_a_person_understands(site):
    make_hosts(2)
    BareMetalHost.objects.update(state="maintenance")
    make_pool("one", 1)
    call_command("reconcile")
    claim = NodeClaim.objects.get()
    assert claim.phase == ClaimPhase.PENDING and claim.reason == "NoCapacity"
    assert claim.message == "no free host of type gpu-server: 0 of 2 available"


@pytest.mark.django_db
def test_a_selector_that_no_node_type_matches_says_so(site):
    make_pool("one", 1, node_type="tpu-server")
    call_command("reconcile")
    claim = NodeClaim.objects.get()
    assert claim.message == "no NodeType matches vcluster.com/node-type=tpu-server"


@pytest.mark.django_db
def test_the_cheapest_matching_node_type_with_a_free_host_wins(site, apply):
    apply("""\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata: {name: gpu-cheap}
spec:
  providerRef: metal3
  cost: 1
  properties: {vcluster.com/node-type: gpu-server, tier: cheap}
  bareMetalHosts: {selector: {matchLabels: {role: gpu, tier: cheap}}}
""")
    make_hosts(2)
    BareMetalHost.objects.filter(name="gpu-00001").update(labels={"role": "gpu", "tier": "cheap"})
    pool = make_pool("one", 2)
    pool.node_type_selector = [{"property": "vcluster.com/node-type", "operator": "In", "values": ["gpu-server"]}]
    pool.save()
    call_command("reconcile")
    types = sorted(NodeClaim.objects.values_list("node_type__name", "host__name"))
    assert types == [("gpu-cheap", "gpu-00001"), ("gpu-server", "gpu-00000")]


@pytest.mark.django_db
def test_a_claim_pinned_to_a_server_name_gets_that_host(site):
    make_hosts(3)
    properties = {"metal3.vcluster.com/server-name": "gpu-00002", "vcluster.com/os-image": IMAGE}
    tenant = Tenant.objects.create(name="one", provider_properties={"metal3": properties})
    make_pool("one", 1)
    call_command("reconcile")
    assert NodeClaim.objects.get().host.name == "gpu-00002"
    assert tenant.pools.count() == 1


@pytest.mark.django_db
def test_the_queries_of_a_reconcile_pass_do_not_grow_with_the_number_of_claims(site):
    make_hosts(300)
    roomy_network()
    small, big = make_pool("one", 10), make_pool("two", 200)
    counts = {}
    for pool in (small, big):
        with CaptureQueriesContext(connection) as ctx:
            pools_reconcile(pool_ids=[pool.pk])
        counts[pool.quantity] = len(ctx.captured_queries)
        assert NodeClaim.objects.filter(pool=pool, phase=ClaimPhase.PROVISIONING).count() == pool.quantity
    if connection.vendor == "postgresql":
        assert counts[10] == counts[200], counts
    else:  # SQLite caps the variables of one statement, so bulk writes go in a few batches
        assert counts[200] < 2 * counts[10], counts
    with CaptureQueriesContext(connection) as ctx:
        pools_reconcile()  # nothing to do: a handful of queries (one of them: tenants being deleted?)
    assert len(ctx.captured_queries) <= 7


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_200_concurrent_allocations_over_50_hosts_give_exactly_50_and_never_one_host_twice(site):
    assert connection.vendor == "postgresql"
    make_hosts(50)
    roomy_network()
    make_pool("one", 200)
    # Create the claims without allocating, then allocate them one by one from 20 threads at once.
    from claims import reconcile

    original = reconcile.claims_allocate
    reconcile.claims_allocate = lambda **kw: AllocationResult()
    try:
        pools_reconcile()
    finally:
        reconcile.claims_allocate = original
    ids = list(NodeClaim.objects.values_list("pk", flat=True))
    assert len(ids) == 200
    errors = []
    barrier = threading.Barrier(20)

    def worker(chunk):
        try:
            barrier.wait()
            for claim_id in chunk:
                claims_allocate(claim_ids=[claim_id])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=worker, args=(ids[i::20],)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    allocated = NodeClaim.objects.filter(host__isnull=False)
    assert allocated.count() == 50
    assert allocated.values("host").distinct().count() == 50
    assert BareMetalHost.objects.filter(state="provisioning").count() == 50
    pending = NodeClaim.objects.filter(phase=ClaimPhase.PENDING)
    assert pending.count() == 150
    assert set(pending.values_list("message", flat=True)) == {"no free host of type gpu-server: 0 of 50 available"}


@pytest.mark.django_db
def test_status_json_is_stable(site, apply, seed_block, capsys):
    import json

    make_hosts(3)
    apply(seed_block, tenant="one")
    call_command("reconcile")
    capsys.readouterr()
    call_command("status", "--json")
    status = json.loads(capsys.readouterr().out)
    assert set(status) == {"version", "generated_at", "hosts", "tenants", "node_types"}
    assert status["version"] == 1
    assert status["hosts"]["total"] == 3
    assert status["hosts"]["by_state"] == {"registering": 0, "inspecting": 0, "available": 2, "checking": 0,
                                           "provisioning": 1, "provisioned": 0, "deprovisioning": 0, "repair": 0,
                                           "retesting": 0, "repairing": 0, "servicing": 0, "retired": 0, "error": 0,
                                           "maintenance": 0, "held": 0}
    one = status["tenants"][0]
    assert one["name"] == "one" and one["namespace"] == "p-default"
    gpu = next(p for p in one["pools"] if p["name"] == "gpu")
    assert gpu == {"name": "gpu", "kind": "static", "provider": "metal3", "quantity": 1,
                   "claims": {"Pending": 0, "Provisioning": 1, "Joining": 0, "Available": 0, "Failed": 0,
                              "Releasing": 0}}
    gpu_type = next(t for t in status["node_types"] if t["name"] == "gpu-server")
    assert gpu_type["capacity"] == {"total": 3, "available": 2, "held_back": 0, "provisioned": 1, "preparing": 0,
                                    "repair": 0, "error": 0, "maintenance": 0, "held": 0, "retired": 0}
    call_command("status")
    assert "gpu-server" in capsys.readouterr().out


@pytest.mark.django_db
def test_a_host_freed_while_a_claim_turns_pending_unseen_still_wakes_the_allocator(
        site, monkeypatch, django_capture_on_commit_callbacks):
    # Two transactions cross: a host becomes available while, in another, its claim loses a host and turns
    # Pending. Neither sees the other before it commits; the one that commits first must still wake the allocator.
    from claims import task_names
    from hosts.services import host_transition

    make_hosts(1)
    BareMetalHost.objects.update(state="maintenance")
    make_pool("one", 1)
    call_command("reconcile")
    NodeClaim.objects.update(phase=ClaimPhase.PROVISIONING)  # serving another host, about to lose it
    BareMetalHost.objects.update(state="inspecting")
    sent = []
    monkeypatch.setattr("claims.allocation.task_send", lambda name, **kwargs: sent.append(name))
    with django_capture_on_commit_callbacks(execute=False) as on_commit:
        host_transition(host=BareMetalHost.objects.get(), to_state="available", actor="test")
    NodeClaim.objects.update(phase=ClaimPhase.PENDING)  # the other transaction commits first
    for callback in on_commit:
        callback()
    assert task_names.RECONCILE_POOLS in sent


@pytest.mark.django_db
def test_new_claim_names_never_clash_and_only_a_clash_with_an_existing_claim_costs_a_query(site, monkeypatch):
    import claims.reconcile

    make_hosts(1)
    make_pool("one", 1)
    pools_reconcile()
    taken = NodeClaim.objects.get().name.split("-", 1)[1]
    # The draws, a character at a time: a name twice in the batch, then the existing claim's, then fresh ones.
    draws = iter("bbbbb" "bbbbb" + taken + "ccccc" "ddddd")
    monkeypatch.setattr(claims.reconcile.secrets, "choice", lambda alphabet: next(draws))
    with CaptureQueriesContext(connection) as ctx:
        names = claims.reconcile._new_claim_names(["one", "one", "one"])
    assert names == ["one-bbbbb", "one-ddddd", "one-ccccc"]
    assert len(ctx.captured_queries) == 2  # the batch's own clash drawn again without a query, the existing one's: one
