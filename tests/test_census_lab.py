"""The release gate's census in the lab: an agent on an honest boot that omits a disk, forges its serial, erases a
decoy of another size in its place or reports an extra disk never returns its host to the pool. The census is
fixed before the erase from the inventory of record (the host's intake) and its BMC's drives (Redfish, through
sushy), so the gate fails to repair with the disk named, and no passing certificate is signed for a disk that was
not erased; the honest host is certified for every disk of its census and becomes available. Real worker, real
agents on file-backed disks, the lab's BMCs reporting their servers' drives."""
import io
import secrets

import pytest
from django.core.management import call_command

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost, EraseCertificate, HostCommand
from pools.models import NodePool
from pools.services import pool_set_quantity

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

DISK = 96 * 1024 * 1024


def repair_event(name: str) -> Event:
    return Event.objects.filter(host__name=name, kind="transition", to_state="repair").order_by("-id").first()


def test_an_agent_that_omits_forges_or_adds_a_disk_on_an_honest_release_sends_its_host_to_repair_naming_the_disk(
        lab_factory, celery_worker_process, apply):
    # gpu-05's BMC reports no storage: its census rests on the inventory of record alone. gpu-07's agent forges a
    # serial from its very first boot: its BMC lists the real one, which the agent's inventory lacks.
    site = lab_factory(hosts=7, gpu_hosts=7, tenants=["one"], disk_bytes=DISK,
                       faults={"gpu-05": "bmc-no-storage", "gpu-07": "agent-forges-serial:nvme1n1"})
    wait_hosts("available", 6, timeout=150)
    wait_hosts("repair", 1, timeout=30)
    # Caught at its inspection, before any erase: the drive its BMC lists is not in the agent's inventory (the two
    # censuses side by side in the evidence), a SKU deviation.
    intake = repair_event("gpu-07")
    assert intake.step == "sku_check" and "BMC's drives: drive S7GPU071 (96 MiB) the BMC lists is not in the " \
        "agent's inventory" in intake.message, intake.message
    census = intake.data["evidence"]["census"]
    assert "S7GPU071" in [d["serial"] for d in census["bmc"]], census
    assert "S7GPU071" not in [d["serial"] for d in census["agent"]], census
    assert not EraseCertificate.objects.filter(host__name="gpu-07", result="pass").exists()
    assert BareMetalHost.objects.get(name="gpu-01").disk_record["disks"][1]["serial"] == "S7GPU011"

    apply(gpu_pool(6), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 6, timeout=150)
    data = b"TENANT-ONE:" + secrets.token_hex(8).encode() + b";"
    for name in ("gpu-01", "gpu-03", "gpu-06"):
        site.write_pattern(name, data)
    lies = {"gpu-01": "agent-omits-disk:nvme1n1", "gpu-02": "agent-forges-serial:nvme1n1",
            "gpu-03": "agent-misreports-size:nvme1n1", "gpu-04": "agent-extra-disk",
            "gpu-05": "bmc-no-storage,agent-omits-disk:nvme1n1"}
    for name, fault in lies.items():  # the next boot's agent lies; the hardware and the BMCs do not
        site.set_fault(name, fault)
    started = Event.objects.order_by("-id").values_list("id", flat=True).first()
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")
    wait_for(lambda: BareMetalHost.objects.filter(state__in=["available", "repair"]).count() == 7, timeout=180)
    states = dict(BareMetalHost.objects.values_list("name", "state"))
    assert {n for n, s in states.items() if s == "repair"} == {*lies, "gpu-07"}, lab_report()

    expected = {
        "gpu-01": "nvme1n1: disk S7GPU011 (96 MiB) of the inventory and the BMC not reported by the agent",
        "gpu-02": "reported with serial FORGED-SERIAL: disk nvme1n1 of the inventory and the BMC is S7GPU021",
        "gpu-03": "disk S7GPU031 (96 MiB) of the inventory reported with 97 MiB",
        "gpu-04": "disk nvme9n1 (EXTRA-SERIAL (96 MiB), as the agent reports it) is not in the census",
        "gpu-05": "disk S7GPU051 (96 MiB) of the inventory not reported by the agent",
    }
    for name, text in expected.items():
        event = repair_event(name)
        assert event.id > started and event.from_state == "deprovisioning", name
        assert event.step == "verify_erase" and text in event.message, (name, event.message)
        census = event.data["evidence"]["census"]
        assert census["source"] == ("inventory" if name == "gpu-05" else "both"), (name, census)
        release = event.data["flow_id"]
        erase = HostCommand.objects.get(host__name=name, flow_id=release, name="erase")
        assert census["taken_at"] <= erase.created_at.isoformat(), name  # fixed before the erase was asked for
        assert not Event.objects.filter(host__name=name, id__gt=started, to_state="available").exists(), name
    for name, serial in (("gpu-01", "S7GPU011"), ("gpu-02", "S7GPU021"), ("gpu-03", "S7GPU031"),
                         ("gpu-05", "S7GPU051")):
        release = repair_event(name).data["flow_id"]
        certs = EraseCertificate.objects.filter(host__name=name, flow_id=release)
        assert not certs.filter(serial=serial, result="pass").exists(), name
        assert not certs.filter(serial="FORGED-SERIAL").exists()
    # Why it matters: the disks it left out or swapped for a decoy still hold the tenant's data (gpu-02's agent did
    # erase its disk, but under a serial that is not the census's: the console cannot tell it from another disk).
    for name in ("gpu-01", "gpu-03"):
        assert {disk for disk, _ in site.scan_disks(name, data)} == {"nvme1n1.img"}, name

    # The honest host: every disk of its census certified under the census's serials, and back in the pool.
    assert states["gpu-06"] == "available"
    certs = EraseCertificate.objects.filter(host__name="gpu-06", previous_tenant="one")
    assert {(c.disk, c.serial, c.result) for c in certs} == {("nvme0n1", "S7GPU060", "pass"),
                                                             ("nvme1n1", "S7GPU061", "pass")}
    doc = certs.first().document
    assert doc["observed_by_console"]["census"]["source"] == "both"
    assert doc["observed_by_console"]["boot"]["config_delivered_via"] in ("ipxe", "virtual-media")
    assert doc["reported_by_agent"]["matches_census"] is True
    assert site.scan_disks("gpu-06", data) == []

    # gpu-07's inventory of record came from its lying agent at intake. With an honest agent, its retest finds other
    # disks than the record: a deviation, to repair, until an admin accepts them; then its retest passes.
    site.set_fault("gpu-07", "")
    since = Event.objects.order_by("-id").values_list("id", flat=True).first()
    call_command("repair", "gpu-07", "retest", stdout=io.StringIO())
    wait_for(lambda: Event.objects.filter(host__name="gpu-07", id__gt=since, to_state="repair").exists(), timeout=90)
    deviated = Event.objects.filter(host__name="gpu-07", id__gt=since, to_state="repair").get()
    assert deviated.step == "sku_check" and (
        "inventory of record: disk FORGED-SERIAL (96 MiB) of the inventory of record not found" in deviated.message
    ), deviated.message
    call_command("repair", "gpu-07", "accept-disks", "--reason", "the intake's agent misreported nvme1n1",
                 stdout=io.StringIO())
    since = Event.objects.order_by("-id").values_list("id", flat=True).first()
    call_command("repair", "gpu-07", "retest", stdout=io.StringIO())
    wait_for(lambda: Event.objects.filter(host__name="gpu-07", id__gt=since, to_state="repair").exists(), timeout=120)
    verdict = Event.objects.filter(host__name="gpu-07", id__gt=since, to_state="repair").get()
    assert verdict.data.get("retest") == "passed", (verdict.message, lab_report())
    assert set(EraseCertificate.objects.filter(host__name="gpu-07", flow_id=verdict.data["flow_id"], result="pass")
               .values_list("serial", flat=True)) == {"S7GPU070", "S7GPU071"}
