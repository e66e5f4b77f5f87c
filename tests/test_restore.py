"""Backup and restore: a database restored from an older backup touches no server before it read it. Every host is held
at once; the console reads each host's BMC and every tenant's nodes, then adopts what still serves a tenant, releases
through the gate what serves none, and leaves the rest alone; an erase certificate signed after the backup comes back
from the archive, and a forged one dropped there is refused. docs/operations.md ("Backup and restore") shows this
test's table."""
import json
import subprocess
import uuid

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.choices import EventKind
from events.models import Event
from hosts.choices import HostState
from hosts.gate import certificates
from hosts.management.commands.backup import pg_environment
from hosts.models import BareMetalHost, EraseCertificate, HostCommand
from hosts.services import host_delete
from lab.site import IMAGE_NAME
from manifests.apply import apply_files

from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]

POOLS = """\
privateNodes:
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: {image}
      static:
        - name: a
          quantity: {a}
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
        - name: b
          quantity: {b}
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
"""


def pools(a: int, b: int) -> str:
    return POOLS.format(image=IMAGE_NAME, a=a, b=b)


@pytest.fixture
def archive(tmp_path, settings, worker_settings):
    """The certificate archive, outside the database, for this process and the worker alike."""
    path = tmp_path / "archive"
    settings.CERTIFICATE_ARCHIVE_DIR = worker_settings["CERTIFICATE_ARCHIVE_DIR"] = str(path)
    return path


def claim_of(pool: str, phase: str | None = None, host: bool = True):
    claims = NodeClaim.objects.filter(pool_name=pool).exclude(phase=ClaimPhase.RELEASED)
    if phase:
        claims = claims.filter(phase=phase)
    if host:
        claims = claims.filter(host__isnull=False)
    return claims.order_by("created_at").last()


def host_manifests(site, name: str) -> str:
    docs = [d for d in yaml.safe_load_all(site.manifests())
            if d and d["metadata"]["name"] in (name, f"{name}-bmc")]
    return "".join("---\n" + yaml.safe_dump(d, sort_keys=False) for d in docs)


def forged_certificate(real: EraseCertificate) -> tuple[str, str]:
    """A real certificate's body with a new id, signed by a key that is not the console's: (file name, text)."""
    body = {**real.document, "certificate_id": str(uuid.uuid4()), "result": "pass"}
    key = Ed25519PrivateKey.generate()
    text = certificates.render(body, key.sign(certificates.canonical(body)).hex(),
                               certificates.key_id(key.public_key()))
    return f"{body['certificate_id']}.json", text


def pg_restore(directory) -> None:
    """The backup back into the test's database, as an operator would with PostgreSQL's own tool alone."""
    connect, env = pg_environment()
    connection.close()
    subprocess.run(["pg_restore", "--clean", "--if-exists", "--single-transaction", "--no-owner", *connect,
                    str(directory)], env=env, check=True, capture_output=True)


def reconciled(host_name: str) -> Event:
    return Event.objects.filter(kind=EventKind.TRANSITION, object_name=host_name, from_state=HostState.HELD).first()


@pytest.mark.timeout(600)  # measured 2-3 min on 2 loaded cores: five servers registered, four claims, one release
def test_a_restore_touches_no_server_before_it_read_it_and_adopts_what_still_serves_a_tenant(
        archive, lab_factory, celery_worker_process, apply, tmp_path):
    site = lab_factory(hosts=5, gpu_hosts=5, tenants=["one"])
    try:
        wait_hosts("available", 5, timeout=180)
        # gpu-05 is not in the backup: removed now, registered again after it.
        host_delete(host=BareMetalHost.objects.get(name="gpu-05"), actor="user:test")
        apply(pools(a=1, b=1), tenant="one")
        wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=150)
        released, kept = claim_of("a").host_name, claim_of("b").host_name
        # The backup is taken while a third claim's host is provisioning.
        apply(pools(a=1, b=2), tenant="one")
        adopted = wait_for(lambda: BareMetalHost.objects.filter(state=HostState.PROVISIONING).first(), timeout=60)
        adopted_claim = adopted.claim.name
        call_command("backup", str(tmp_path / "backup"))
        backup_at = timezone.now()
        # After the backup: that claim becomes Available, a fourth claim takes the last free host, pool a's claim is
        # released (its host erased, off), and gpu-05 registers again.
        wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 3, timeout=150)
        apply(pools(a=1, b=3), tenant="one")
        wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 4, timeout=150)
        stranger = claim_of("b").host_name
        assert stranger not in (released, kept, adopted.name)
        apply(pools(a=0, b=3), tenant="one")
        apply_files([("lab", host_manifests(site, "gpu-05"))], actor="user:test")
        wait_hosts("available", 2, timeout=150)  # the released host, erased; gpu-05, registered
    except AssertionError:
        raise AssertionError(lab_report()) from None
    signed_after_backup = {c.document["certificate_id"] for c in EraseCertificate.objects.filter(
        host__name=released, created_at__gt=backup_at)}
    assert signed_after_backup
    assert {f"{cid}.json" for cid in signed_after_backup} <= {p.name for p in archive.iterdir()}
    forged_name, forged_text = forged_certificate(EraseCertificate.objects.filter(host__name=released).first())
    # Stop the console; restore the backup with a bare pg_restore, the step that holds the hosts forgotten (the
    # database's epoch, behind the archive's, gives it away); drop a forged certificate in the archive; start again.
    celery_worker_process.kill()
    mark = max([0, *(e["seq"] for e in site.redfish.events())])
    pg_restore(tmp_path / "backup")
    assert not BareMetalHost.objects.filter(state=HostState.HELD).exists()
    assert not BareMetalHost.objects.filter(name="gpu-05").exists()
    assert not EraseCertificate.objects.filter(document__certificate_id__in=signed_after_backup).exists()
    (archive / forged_name).write_text(forged_text)
    celery_worker_process.start()
    try:
        wait_for(lambda: all(reconciled(name) for name in (released, kept, adopted.name, stranger)), timeout=60)
        assert not BareMetalHost.objects.filter(state=HostState.HELD).exists()
        # The released host goes through the gate again; wait for it (its claim, pending again, may take it after).
        wait_for(lambda: EraseCertificate.objects.filter(host__name=released,
                                                         created_at__gt=reconciled(released).created_at).exists(),
                 timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    for cid in signed_after_backup:  # the released host's newest certificates came back from the archive
        assert EraseCertificate.objects.get(document__certificate_id=cid).host.name == released
    table = {name: (reconciled(name).data["reconcile"]["database"], reconciled(name).data["reconcile"]["node"] != "",
                    reconciled(name).data["reconcile"]["verdict"], reconciled(name).to_state)
             for name in (released, kept, adopted.name, stranger)}
    assert table == {
        released: (HostState.PROVISIONED, False, "released through the gate", HostState.DEPROVISIONING),
        kept: (HostState.PROVISIONED, True, "left alone", HostState.PROVISIONED),
        adopted.name: (HostState.PROVISIONING, True, "adopted", HostState.PROVISIONED),
        stranger: (HostState.AVAILABLE, True, "adopted: in maintenance", HostState.MAINTENANCE),
    }, lab_report()
    assert NodeClaim.objects.get(name=adopted_claim).phase == ClaimPhase.AVAILABLE
    assert NodeClaim.objects.get(name=adopted_claim).host.name == adopted.name
    assert "which no claim of the restored database waiting for a host matches" in reconciled(stranger).message
    # No power action reached a host that serves a tenant, nor gpu-05 (unknown to the restored database); the
    # released host's first one came after its BMC was read.
    after = [e for e in site.redfish.events(mark)]
    assert not [e for e in after if e["system"] in (kept, adopted.name, stranger, "gpu-05")], after
    first = min(e["time"] for e in after if e["system"] == released)
    assert first > reconciled(released).created_at.timestamp()
    # No adopted or kept host was re-imaged or re-inspected: no agent command on them since the restore.
    restored_at = reconciled(kept).created_at
    assert not HostCommand.objects.filter(host__name__in=(kept, adopted.name, stranger),
                                          created_at__gte=restored_at).exists()
    # The forged certificate was refused, recorded, and not imported.
    assert not EraseCertificate.objects.filter(document__certificate_id=forged_name[:-5]).exists()
    refusal = Event.objects.filter(kind=EventKind.SECURITY, message__contains=forged_name).first()
    assert refusal is not None and "not among the keys checked" in refusal.message
    assert json.loads((archive / forged_name).read_text())  # left where it was, for a person to look at
