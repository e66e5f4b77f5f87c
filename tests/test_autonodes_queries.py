"""Query counts: a tenant's decision runs as many queries for forty-two Pending pods, twenty claims made or more
and others in flight as for three pods and one claim (the reads and writes of tenant_decide do not grow with the
demand); tests/test_autonodes_pass.py: a pass of several tenants reads the fleet-wide rows once."""
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from autonodes.choices import DemandStatus
from autonodes.models import PendingPod
from autonodes.services import tenant_decide
from claims.models import NodeClaim
from hosts.models import BareMetalHost
from pools.models import Tenant

from .autonodes_conftest import BURST

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


@pytest.fixture
def two(apply, demo_site):
    """Tenant two with the dynamic pool burst (gpu-server and cpu-server, up to 100 nodes); 40 more free hosts of
    each type than the demo's."""
    apply(BURST.format(nodes=100), tenant="two")
    BareMetalHost.objects.bulk_create([
        BareMetalHost(name=f"{role}-extra-{i:02d}", bmc_address=f"redfish://10.9.{k}.{i}/redfish/v1/Systems/1",
                      boot_mac=f"52:54:09:00:{k:02x}:{i:02x}", labels={"role": role}, state="available")
        for k, role in enumerate(["gpu", "cpu"]) for i in range(40)])
    return Tenant.objects.get(name="two")


def pods(tenant, prefix: str, n: int, requests: dict) -> None:
    PendingPod.objects.bulk_create([
        PendingPod(tenant=tenant, namespace="ml", name=f"{prefix}-{i}", uid=str(uuid.uuid4()), owner=f"Job/{prefix}",
                   requests=requests) for i in range(n)])


def decide(tenant) -> tuple[int, object]:
    with CaptureQueriesContext(connection) as ctx:
        result = tenant_decide(tenant_id=tenant.pk)
    return len(ctx.captured_queries), result


def answered(result) -> int:
    """Pods launched on a new claim or placed on one in flight."""
    return sum(len(keys) for keys in result.launched.values()) + len(result.placed)


GPU_8 = {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "8"}
CPU_64 = {"cpu": "60", "memory": "256Gi"}
GPU_16 = {"cpu": "4", "memory": "64Gi", "nvidia.com/gpu": "16"}  # no NodeType has 16 GPUs: unservable


def test_a_decision_runs_as_many_queries_for_forty_two_pods_and_twenty_claims_as_for_three(two):
    pods(two, "first", 1, GPU_8)
    tenant_decide(tenant_id=two.pk)  # a claim in flight before the decisions counted

    pods(two, "small-gpu", 1, GPU_8)
    pods(two, "small-cpu", 1, CPU_64)
    pods(two, "small-big", 1, GPU_16)
    small, result = decide(two)
    assert answered(result) == 2 and len(result.unservable) == 1

    pods(two, "train", 20, GPU_8)
    pods(two, "etl", 12, CPU_64)
    pods(two, "huge", 10, GPU_16)
    large, result = decide(two)
    assert answered(result) == 32 and len(result.unservable) == 10
    assert len(result.launched) >= 20  # a gpu-server for each 8-GPU pod at least
    assert NodeClaim.objects.filter(tenant=two).count() > 20
    assert PendingPod.objects.filter(tenant=two, status=DemandStatus.LAUNCHED).count() == 35

    assert large == small, (small, large)
    # A pass of one tenant: the fleet's NodeTypes, free hosts (available, promised) and launch deadlines (read once
    # per pass, whatever its tenants); the tenant's lock with its watch, pods, pools, claims; the claim-name check,
    # one insert of claims, one of Events, one update of the pods launched and placed, one of the verdicts; the
    # savepoint and its release.
    assert small == 15, small

    again, result = decide(two)  # the same demand: nothing to decide, fewer queries still
    assert not result.launched and again < small
