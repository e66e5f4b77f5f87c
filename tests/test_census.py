"""The release gate's census: the disks to erase are fixed by the console before the erase, from the inventory of
record and the BMC's own storage view; a disk the agent does not report, reports under another serial or size, or
an extra disk fails the gate, and a certificate never presents the agent's word as a fact the console verified.
The inventory of record changes only by an admin's accept; a later inspection that finds other disks is a
deviation. The lab's BMCs report their servers' drives through Redfish, read through sushy."""
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from events.models import Event
from hosts.bmc.client import BMC
from hosts.choices import HostState
from hosts.gate import cleaning
from hosts.gate.census import census_take, record_from
from hosts.models import BareMetalHost
from hosts.selectors import RECORD, host_sku_deviations

from .factories import GATE, erased, verified

MiB = 1024 * 1024
SIZE = 96 * MiB
TWO = [{"name": "nvme0n1", "serial": "S7GPU010", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": SIZE, "type": "nvme"},
       {"name": "nvme1n1", "serial": "S7GPU011", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": SIZE, "type": "nvme"}]


@pytest.fixture
def host(db):
    inventory = {"system": {"serial": "LAB-gpu-01"}, "disks": TWO}
    return BareMetalHost.objects.create(name="gpu-01", bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/1",
                                        boot_mac="52:54:00:00:00:01", labels={"role": "gpu"}, inventory=inventory,
                                        disk_record=record_from(inventory, by="inspection"))


def reports(*disks) -> tuple[dict, dict]:
    """The agent's erase and verify results for these disks ({name, serial, size_bytes})."""
    erase = {"disks": [{**erased()["disks"][0], **d} for d in disks]}
    verify = {"disks": [{**verified()["disks"][0], **d} for d in disks], "passed": True}
    return erase, verify


def gate(host, *disks, bmc_drives=None, flow_id="f-1"):
    erase, verify = reports(*disks)
    census = census_take(host=host, bmc_drives=bmc_drives)
    certs = cleaning.issue_certificates(host=host, flow_id=flow_id, gate=GATE, previous={"tenant": "alpha"},
                                        erase=erase, verify=verify, census=census)
    return {c.disk: c for c in certs}, census


def d(i, **changes):
    return {"name": TWO[i]["name"], "serial": TWO[i]["serial"], "size_bytes": SIZE, **changes}


pytestmark = pytest.mark.django_db


def test_every_disk_of_the_census_reported_as_it_is_passes(host):
    certs, census = gate(host, d(0), d(1))
    assert census["source"] == "inventory" and len(census["disks"]) == 2
    assert {n: c.result for n, c in certs.items()} == {"nvme0n1": "pass", "nvme1n1": "pass"}
    doc = certs["nvme1n1"].document
    assert doc["media"]["serial"] == "S7GPU011" and doc["reported_by_agent"]["matches_census"] is True
    assert doc["observed_by_console"]["census"]["source"] == "inventory"
    assert doc["observed_by_console"]["census"]["this_disk"]["serial"] == "S7GPU011"


def test_a_disk_of_the_inventory_the_agent_does_not_report_fails_with_the_disk_named(host):
    certs, _ = gate(host, d(0))
    assert certs["nvme0n1"].result == "pass"
    missing = certs["nvme1n1"]
    assert missing.result == "fail" and missing.serial == "S7GPU011"
    assert missing.document["verification"]["findings"] == [
        "disk S7GPU011 (96 MiB) of the inventory not reported by the agent"]
    assert missing.document["post_sanitization_classification"].startswith("tenant data may remain")


def test_a_forged_serial_fails_and_is_never_presented_as_a_verified_fact(host, admin_client):
    certs, _ = gate(host, d(0), d(1, serial="FORGED-SERIAL"))
    page = admin_client.get(f"/certificates/{certs['nvme1n1'].pk}/").content.decode()
    assert '<td class="mono">—</td>' in page  # the medium's serial: none the console saw
    assert "nvme1n1 serial FORGED-SERIAL" in page and '<td class="fail">no</td>' in page
    forged = certs["nvme1n1"]
    assert forged.result == "fail" and forged.serial == ""  # the list shows no serial the console did not see
    assert forged.document["media"]["serial"] is None
    assert forged.document["media"]["identified_by"].startswith("nobody")
    assert forged.document["reported_by_agent"]["disk"]["serial"] == "FORGED-SERIAL"
    assert forged.document["reported_by_agent"]["matches_census"] is False
    assert forged.document["verification"]["findings"][0] == (
        "reported with serial FORGED-SERIAL: disk nvme1n1 of the inventory is S7GPU011")
    # The census's disk itself, not reported under its own serial: a failed certificate of its own, by serial.
    assert certs["S7GPU011"].result == "fail"
    assert "disk S7GPU011 (96 MiB) of the inventory not reported by the agent" in \
        certs["S7GPU011"].document["verification"]["findings"]
    assert "FORGED-SERIAL" not in str(certs["S7GPU011"].document["media"])


def test_another_size_or_an_extra_disk_fails(host):
    certs, _ = gate(host, d(0), d(1, size_bytes=SIZE + MiB))
    assert certs["nvme1n1"].result == "fail"
    assert certs["nvme1n1"].document["verification"]["findings"][0] == (
        "disk S7GPU011 (96 MiB) of the inventory reported with 97 MiB")
    certs, _ = gate(host, d(0), d(1), {"name": "nvme9n1", "serial": "EXTRA-SERIAL", "size_bytes": SIZE}, flow_id="f-2")
    assert certs["nvme0n1"].result == certs["nvme1n1"].result == "pass"
    assert certs["nvme9n1"].result == "fail" and certs["nvme9n1"].document["verification"]["findings"][0] == (
        "disk nvme9n1 (EXTRA-SERIAL (96 MiB), as the agent reports it) is not in the census")


def test_the_bmc_s_drives_join_the_census_and_its_size_must_match_too(host):
    bmc = [{"name": "Disk.Bay.0", "serial": "S7GPU010", "model": "SAMSUNG", "size_bytes": SIZE},
           {"name": "Disk.Bay.1", "serial": "S7GPU011", "model": "SAMSUNG", "size_bytes": SIZE},
           {"name": "Disk.Bay.2", "serial": "S7GPU012", "model": "SAMSUNG", "size_bytes": SIZE}]
    certs, census = gate(host, d(0), d(1), bmc_drives=bmc)
    assert census["source"] == "both"
    assert [x["source"] for x in census["disks"]] == ["both", "both", "bmc"]
    # A drive only the BMC knows is still a disk to erase: not reported, it fails.
    assert certs["S7GPU012"].result == "fail" and certs["S7GPU012"].document["verification"]["findings"] == [
        "disk S7GPU012 (96 MiB) of the BMC not reported by the agent"]
    # The inventory of record taken from a lying agent at intake: the BMC's size still holds.
    host.disk_record = record_from({"disks": [TWO[0], {**TWO[1], "size_bytes": SIZE + MiB}]}, by="inspection")
    certs, _ = gate(host, d(0), d(1, size_bytes=SIZE + MiB), bmc_drives=bmc[:2], flow_id="f-2")
    assert certs["nvme1n1"].result == "fail" and certs["nvme1n1"].document["verification"]["findings"][0] == (
        "disk S7GPU011 (96 MiB) of the BMC reported with 97 MiB")


def test_a_bmc_s_rounded_capacity_and_a_drive_it_lists_without_a_serial_do_not_fail_an_honest_erase(host):
    bmc = [{"name": "Disk.Bay.0", "serial": "S7GPU010", "size_bytes": SIZE - 100_000},  # nominal, rounded down
           {"name": "Disk.Bay.1", "serial": "S7GPU011", "size_bytes": SIZE},
           {"name": "Volume.0", "serial": "", "size_bytes": 2 * SIZE}]  # a RAID volume: nothing to match it by
    certs, census = gate(host, d(0), d(1), bmc_drives=bmc)
    assert {n: c.result for n, c in certs.items()} == {"nvme0n1": "pass", "nvme1n1": "pass"}
    assert census["bmc"] == "3 drive(s) reported, 1 without a serial (not counted)"


def test_without_a_census_nothing_passes(host):
    erase, verify = reports(d(0), d(1))
    certs = cleaning.issue_certificates(host=host, flow_id="f-1", gate=GATE, previous={}, erase=erase, verify=verify,
                                        census=None)
    assert {c.result for c in certs} == {"fail"}
    assert certs[0].document["verification"]["findings"][0] == "no census of the host's disks was taken before the erase"


def test_a_later_inspection_that_finds_other_disks_deviates_until_an_admin_accepts_them(host, capsys):
    host.inventory = {**host.inventory, "disks": [TWO[0], {**TWO[1], "serial": "S7NEW999"}]}
    host.save(update_fields=["inventory"])
    assert host_sku_deviations(host) == {RECORD: [
        "disk S7GPU011 (96 MiB) of the inventory of record not found",
        "disk nvme1n1 (S7NEW999 (96 MiB)) not in the inventory of record"]}
    # The census still holds the record: the new disk is an extra one, the old one missing.
    certs, _ = gate(host, d(0), d(1, serial="S7NEW999"))
    assert certs["nvme1n1"].result == "fail" and certs["S7GPU011"].result == "fail"

    with pytest.raises(CommandError, match="only a host in repair"):
        call_command("repair", "gpu-01", "accept-disks", "--reason", "disk replaced")
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.REPAIR)
    with pytest.raises(CommandError, match="needs a reason"):
        call_command("repair", "gpu-01", "accept-disks")
    before = host.disk_record
    assert BareMetalHost.objects.get(pk=host.pk).disk_record == before  # refused: nothing changed
    call_command("repair", "gpu-01", "accept-disks", "--reason", "disk replaced (ticket 42)", "--actor", "admin:ann")
    host.refresh_from_db()
    assert [x["serial"] for x in host.disk_record["disks"]] == ["S7GPU010", "S7NEW999"]
    assert host.disk_record["by"] == "admin:ann" and host_sku_deviations(host) == {}
    event = Event.objects.filter(host=host, kind="change").latest("id")
    assert event.actor == "admin:ann" and "disk replaced (ticket 42)" in event.message
    assert event.data["disk_record"]["before"]["disks"][1]["serial"] == "S7GPU011"


def test_the_lab_s_bmcs_report_their_drives_through_redfish_and_one_without_storage_reports_none(redfish_labs):
    drives = [{"id": "Disk.Bay.0", "serial": "S7GPU010", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": SIZE,
               "manufacturer": "SAMSUNG", "media_type": "SSD"},
              {"id": "Disk.Bay.1", "serial": "S7GPU011", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": SIZE,
               "manufacturer": "SAMSUNG", "media_type": "SSD"}]
    systems = [{"name": "gpu-01", "mac": "52:54:00:00:00:01", "drives": drives},
               {"name": "gpu-02", "mac": "52:54:00:00:00:02"}]
    with redfish_labs(systems, "admin", "pw", power_delay=(0.1, 0.2)) as lab:
        with BMC(lab.system_address("gpu-01"), "admin", "pw") as bmc:
            assert bmc.drives() == [
                {"name": "Disk.Bay.0", "serial": "S7GPU010", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": SIZE,
                 "manufacturer": "SAMSUNG", "media_type": "SSD", "protocol": "NVMe"},
                {"name": "Disk.Bay.1", "serial": "S7GPU011", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": SIZE,
                 "manufacturer": "SAMSUNG", "media_type": "SSD", "protocol": "NVMe"}]
        with BMC(lab.system_address("gpu-02"), "admin", "pw") as bmc:
            assert bmc.drives() is None
