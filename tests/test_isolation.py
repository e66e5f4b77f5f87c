"""Isolation, end to end in the lab: tenant A's node writes a secret across its disks; A releases the host;
tenant B gets the same host; a scan of every byte of B's disks finds none of A's. Whether the NodeType asks the
overwrite (`full`) or the drive's own erase (`secure`), a release to another tenant purges (the lab's fake
`nvme format --ses=2` leaves indeterminate content)."""
import secrets

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from hosts.models import BareMetalHost, EraseCertificate
from pools.models import NodePool, NodeType
from pools.services import pool_set_quantity

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def node_available(tenant: str):
    return NodeClaim.objects.filter(tenant__name=tenant, phase=ClaimPhase.AVAILABLE).first()


@pytest.mark.parametrize("policy", ["full", "secure"])
def test_tenant_b_finds_none_of_tenant_a_s_bytes_on_the_host_a_released(
        policy, lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["alpha", "beta"], disk_bytes=128 * 1024 * 1024)
    NodeType.objects.filter(name="gpu-server").update(cleaning_policy=policy)
    wait_hosts("available", 1, timeout=60)

    apply(gpu_pool(1), tenant="alpha")
    wait_for(lambda: node_available("alpha"), timeout=90)
    secret = b"ALPHA-SECRET:" + secrets.token_hex(16).encode() + b";"
    written = site.write_pattern("gpu-01", secret)
    hits = site.scan_disks("gpu-01", secret)
    assert len(hits) > written // len(secret) // 2  # the scan sees A's data while A has the host
    assert {name for name, _ in hits} == {"nvme0n1.img", "nvme1n1.img"}

    pool_set_quantity(pool=NodePool.objects.get(tenant__name="alpha"), quantity=0, actor="user:alpha")
    wait_for(lambda: NodeClaim.objects.filter(tenant__name="alpha", phase=ClaimPhase.RELEASED).exists(), timeout=90)
    assert BareMetalHost.objects.get().state == "available", lab_report()
    certs = EraseCertificate.objects.filter(previous_tenant="alpha")
    assert certs.count() == 2 and {c.result for c in certs} == {"pass"}
    # Another tenant may have it next: whatever the NodeType's policy, the drive's own purge (hosts/gate/plan.py).
    assert {c.method for c in certs} == {"secure"}
    assert {c.method_type for c in certs} == {"Purge"}

    apply(gpu_pool(1), tenant="beta")
    wait_for(lambda: node_available("beta"), timeout=90)
    assert node_available("beta").host.name == "gpu-01"
    assert site.read_disk("gpu-01", 0, 16) == b"VMETAL-LAB-IMAGE"  # B's image, on B's node
    # Every byte of every disk, for the secret and for any 16-byte piece of it.
    assert site.scan_disks("gpu-01", secret) == []
    for start in range(0, len(secret) - 16, 8):
        assert site.scan_disks("gpu-01", secret[start:start + 16]) == [], secret[start:start + 16]
