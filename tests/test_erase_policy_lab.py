"""Erase policy per disk and per next owner, end to end in the lab: a re-image of the same pool keeps the data disk
its pool marks kept (the tenant's bytes still there, the OS disk erased, the certificate saying kept and why) and the
pool's own replacement claim gets the host back; the move to another tenant then purges every disk and none of the
first tenant's bytes is left. Real Celery worker, real agents on file-backed disks, the lab's fake `nvme`."""
import io
import secrets

import pytest
from django.core.management import call_command

from claims.choices import ClaimPhase, ReleasePurpose
from claims.models import NodeClaim
from claims.phases import claims_release
from conftest import wait_for
from hosts.models import BareMetalHost, EraseCertificate
from pools.models import NodePool, NodeType
from pools.services import pool_set_quantity

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

RULES = [{"role": "os", "method": "full"},
         {"role": "scratch", "match": {"path": "/dev/nvme1n1"}, "method": "secure", "keepOnReimage": True}]
KEEP_SCRATCH = "          cleaning:\n            keepOnReimage: [scratch]\n"


def available(tenant: str, but=None):
    claims = NodeClaim.objects.filter(tenant__name=tenant, phase=ClaimPhase.AVAILABLE)
    return (claims.exclude(pk=but.pk) if but else claims).first()


def test_a_reimage_keeps_the_pool_s_data_disk_and_a_move_to_another_tenant_purges_every_disk(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one", "two"], disk_bytes=96 * 1024 * 1024)
    NodeType.objects.filter(name="gpu-server").update(cleaning_disks=RULES)
    wait_hosts("available", 1, timeout=60)
    apply(gpu_pool(1) + KEEP_SCRATCH, tenant="one")
    first = wait_for(lambda: available("one"), timeout=90)
    secret = b"ONE-SCRATCH:" + secrets.token_hex(16).encode() + b";"
    site.write_pattern("gpu-01", secret)
    assert {name for name, _ in site.scan_disks("gpu-01", secret)} == {"nvme0n1.img", "nvme1n1.img"}

    # A re-image for the same pool: the scratch disk is kept, the OS disk erased; the pool's next claim has it back.
    claims_release(claims=[first], actor="user:test", reason="re-image", purpose=ReleasePurpose.REIMAGE)
    wait_for(lambda: NodeClaim.objects.filter(pk=first.pk, phase=ClaimPhase.RELEASED).exists(), timeout=120)
    host = BareMetalHost.objects.get()
    assert (host.state, host.kept_for_pool.name) == ("available", "gpu"), lab_report()
    call_command("reconcile", stdout=io.StringIO())  # the pool's next claim (a drift roll makes it itself)
    second = wait_for(lambda: available("one", but=first), timeout=120)
    assert second.host.name == "gpu-01", lab_report()
    certs = {c.disk: c for c in EraseCertificate.objects.filter(claim_name=first.name)}
    assert {d: (c.result, c.method) for d, c in certs.items()} == {"nvme0n1": ("pass", "full"),
                                                                  "nvme1n1": ("pass", "kept")}
    assert certs["nvme1n1"].document["disk_policy"]["why"] == (
        "kept: data disk (scratch) marked kept by pool one/gpu for a re-image of the same pool")
    assert certs["nvme0n1"].document["disk_policy"]["level"] == "Clear"
    assert {name for name, _ in site.scan_disks("gpu-01", secret)} == {"nvme1n1.img"}  # the kept data, only
    host = BareMetalHost.objects.get()
    assert host.kept_until is None  # the pool's own claim took it back with its data

    # Then to another tenant: every disk purged, the kept one too, whatever the pool marks.
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:one")
    wait_for(lambda: NodeClaim.objects.filter(pk=second.pk, phase=ClaimPhase.RELEASED).exists(), timeout=120)
    certs = {c.disk: c for c in EraseCertificate.objects.filter(claim_name=second.name)}
    assert {d: (c.result, c.method_type) for d, c in certs.items()} == {"nvme0n1": ("pass", "Purge"),
                                                                       "nvme1n1": ("pass", "Purge")}, lab_report()
    assert "this release is not a re-image of that pool, so it is erased" in \
        certs["nvme1n1"].document["disk_policy"]["why"]
    assert site.scan_disks("gpu-01", secret) == []
    apply(gpu_pool(1), tenant="two")
    assert wait_for(lambda: available("two"), timeout=90).host.name == "gpu-01"
