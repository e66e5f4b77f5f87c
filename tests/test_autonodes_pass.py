"""A pass of decisions (tenants_decide, the decide task over several tenants): each tenant decided under its own
lock and in its own transaction, the fleet's NodeTypes, free hosts and launch deadlines read once for the pass,
no free host promised to two tenants, and the allocation and the live pages' messages sent once, after the pass."""
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from autonodes import services
from autonodes.choices import DemandStatus
from autonodes.models import PendingPod
from autonodes.tasks import decide
from claims.models import NodeClaim
from core import live
from pools.models import Tenant

from .autonodes_conftest import BURST

pytestmark = pytest.mark.postgres

@pytest.fixture
def tenants(apply, demo_site):
    """Tenants two and three, each with the dynamic pool burst (up to 4 nodes); the demo's 4 GPU hosts are free."""
    apply(BURST.format(nodes=4), tenant="two")
    apply(BURST.format(nodes=4), tenant="three")
    return Tenant.objects.get(name="two"), Tenant.objects.get(name="three")


def gpu_pods(tenant, n: int) -> None:
    """n pods of 8 GPUs: a gpu-server each."""
    PendingPod.objects.bulk_create([
        PendingPod(tenant=tenant, namespace="ml", name=f"train-{i}", uid=str(uuid.uuid4()), owner="Job/train",
                   requests={"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "8"}) for i in range(n)])


@pytest.mark.django_db
def test_two_tenants_asking_for_more_servers_than_are_free_are_never_promised_the_same_host(tenants):
    two, three = tenants
    gpu_pods(two, 3)
    gpu_pods(three, 3)  # six servers asked for, four free

    result = decide.run(tenant_ids=[two.pk, three.pk])

    assert result["launched"] == 4
    assert NodeClaim.objects.filter(node_type__name="gpu-server").count() == 4  # the free hosts, not one more
    assert NodeClaim.objects.filter(tenant=two).count() == 3
    assert NodeClaim.objects.filter(tenant=three).count() == 1
    waiting = PendingPod.objects.filter(tenant=three, status=DemandStatus.WAITING)
    assert {p.reason for p in waiting} == {"not added: no free host of type gpu-server"} and len(waiting) == 2

    again = decide.run(tenant_ids=[three.pk, two.pk])  # the same demand, the other order: nothing more
    assert again["launched"] == 0 and NodeClaim.objects.count() == 4


@pytest.mark.django_db
def test_a_pass_reads_the_fleets_node_types_free_hosts_and_launch_deadlines_once(tenants):
    two, three = tenants
    gpu_pods(two, 1)
    gpu_pods(three, 1)

    with CaptureQueriesContext(connection) as ctx:
        decisions = services.tenants_decide(tenant_ids=[two.pk, three.pk])

    assert all(len(d.launched) == 1 for d in decisions.values())
    sql = [q["sql"] for q in ctx.captured_queries]
    assert sum('FROM "pools_nodetype"' in s for s in sql) == 1
    assert sum('FROM "hosts_baremetalhost"' in s for s in sql) == 1  # the free hosts of every type
    assert sum("ROW_NUMBER()" in s for s in sql) == 1  # the launch deadlines


@pytest.mark.django_db(transaction=True)
def test_a_pass_asks_for_one_allocation_and_hands_its_live_messages_over_once(tenants, monkeypatch):
    two, three = tenants
    gpu_pods(two, 1)
    gpu_pods(three, 1)
    allocations, handoffs = [], []
    monkeypatch.setattr(services, "reconcile_soon", lambda pool_ids: allocations.append(sorted(pool_ids)))
    monkeypatch.setattr(live, "_send", lambda messages: handoffs.append(messages))

    decide.run(tenant_ids=[two.pk, three.pk])

    pools = sorted(NodeClaim.objects.values_list("pool_id", flat=True))
    assert len(pools) == 2 and allocations == [pools]
    assert len(handoffs) == 1
    groups = {group for names, _message in handoffs[0] for group in names}
    assert {f"tenant-{two.pk}", f"tenant-{three.pk}", "claims"} <= groups
