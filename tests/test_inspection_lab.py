"""Out-of-band inspection in the lab: each inspection reads the BMC's own inventory (Redfish: Processors, memory,
Storage drives, NICs) and keeps it beside the agent's; inspectionMode fast takes it as the host's inventory; a drive
the BMC lists that the agent does not name is a SKU deviation that sends the host to repair before any erase, with
both censuses in the evidence; an IPMI host has no out-of-band inventory and is inspected by its agent. Real worker,
real agents on file-backed disks, the lab's sushy-tools BMCs and its IPMI BMC."""
import pytest

from events.models import Event
from hosts.models import BareMetalHost, EraseCertificate, HostCommand

from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

DISK = 96 * 1024 * 1024


def test_the_bmc_s_inventory_is_kept_beside_the_agent_s_fast_takes_it_and_an_agent_that_omits_a_drive_is_caught(
        lab_factory, celery_worker_process, admin_client):
    lab_factory(hosts=4, gpu_hosts=3, disk_bytes=DISK, faults={"gpu-03": "agent-omits-disk:nvme1n1"},
                ipmi_hosts=["cpu-01"], inspection_modes={"gpu-02": "fast"})
    wait_hosts("repair", 1, timeout=150)
    wait_hosts("available", 3, timeout=150)
    hosts = {h.name: h for h in BareMetalHost.objects.all()}
    assert hosts["gpu-03"].state == "repair", lab_report()

    # Agent mode (the default): the agent's inventory, the BMC's beside it, the two agreeing.
    honest = hosts["gpu-01"]
    assert honest.inspection_mode == "" and "source" not in honest.inventory
    assert honest.bmc_inventory["source"] == "bmc" and len(honest.bmc_inventory["gpus"]) == 8
    assert honest.bmc_inventory["cpu"]["model"] == honest.inventory["cpu"]["model"] == "AMD EPYC 9654"
    assert honest.bmc_inventory["ram_mib"] == honest.inventory["ram_mib"]
    assert sorted(d["serial"] for d in honest.bmc_inventory["disks"]) == \
        sorted(d["serial"] for d in honest.inventory["disks"]) == ["S7GPU010", "S7GPU011"]

    # Fast: the BMC's inventory is the host's; the agent was never asked to inspect, yet it erased every drive the
    # BMC lists and each has its passing certificate.
    fast = hosts["gpu-02"]
    assert fast.inspection_mode == "fast" and fast.inventory["source"] == "bmc"
    assert len(fast.inventory["gpus"]) == 8 and [d["type"] for d in fast.inventory["disks"]] == ["nvme", "nvme"]
    assert fast.disk_record["by"] == "out-of-band inspection"
    assert not HostCommand.objects.filter(host=fast, name="inspect").exists()
    assert HostCommand.objects.filter(host=honest, name="inspect").exists()
    assert sorted(EraseCertificate.objects.filter(host=fast, result="pass").values_list("serial", flat=True)) == \
        ["S7GPU020", "S7GPU021"]

    # The lying agent: the drive its BMC lists is missing from its inventory. Caught at the SKU check, before any
    # erase, with both censuses in the evidence; no certificate.
    event = Event.objects.filter(host__name="gpu-03", to_state="repair").latest("id")
    assert event.step == "sku_check", event.message
    assert "BMC's drives: drive S7GPU031 (96 MiB) the BMC lists is not in the agent's inventory" in event.message
    census = event.data["evidence"]["census"]
    assert [d["serial"] for d in census["bmc"]] == ["S7GPU030", "S7GPU031"]
    assert [d["serial"] for d in census["agent"]] == ["S7GPU030"]
    assert not EraseCertificate.objects.filter(host__name="gpu-03").exists()

    # IPMI: no out-of-band inventory, said plainly; the agent's inventory, the inventory of record's census.
    ipmi = hosts["cpu-01"]
    assert "IPMI BMC lists no inventory" in ipmi.bmc_inventory["none"] and ipmi.inventory["disks"]

    page = admin_client.get("/hosts/gpu-02/").content.decode()
    assert "fast" in page and "The inventory below is the BMC's own (out of band)." in page
    assert "S7GPU021" in page
    page = admin_client.get("/hosts/cpu-01/").content.decode()
    assert "an IPMI BMC lists no inventory" in page
    page = admin_client.get("/hosts/gpu-03/").content.decode()
    assert "Differs from the drives its BMC lists:" in page
