"""BIOS settings and firmware in the lab (sushy-tools BMCs with the lab's Bios, Settings, FirmwareInventory and
SimpleUpdate; the real agent; a real Celery worker): the gpu-server NodeType's settings are applied at intake (and
before a provision) and verified after the reboot, a setting the BIOS never keeps sends its host to repair with the
evidence, and an admin's firmware update of an available host succeeds, or fails into repair with the BMC's
messages."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost
from lab.site import FIRMWARE_UPDATE_FAILURE
from pools.models import NodeType

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]

SETTINGS = {"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Enabled"}
MINIMUMS = [{"component": "bios", "minVersion": "2.4.0"}, {"component": "bmc", "minVersion": "1.10"}]


@pytest.fixture
def firmware_lab(lab_factory, worker_settings, settings):
    """lab_factory with a firmware update's task looked at often (the worker started next reads it)."""
    worker_settings.update(FIRMWARE_POLL_S="0.2")
    settings.FIRMWARE_POLL_S = 0.2
    return lab_factory


def _wait(predicate, timeout: float) -> None:
    try:
        wait_for(predicate, timeout=timeout)
    except AssertionError:
        raise AssertionError(f"not within {timeout}s\n{lab_report()}") from None


def _transitions(host) -> list[tuple[str, str]]:
    return list(Event.objects.filter(host=host, kind="transition").order_by("id").values_list("from_state", "to_state"))


def _step(host, name: str) -> Event:
    return Event.objects.filter(host=host, kind="step", step=name).exclude(message="started").order_by("-id").first()


@pytest.mark.django_db(transaction=True)
def test_bios_settings_are_applied_at_intake_verified_after_the_reboot_and_one_that_never_sticks_goes_to_repair(
        firmware_lab, celery_worker_process, client, admin_user):
    site = firmware_lab(hosts=2, gpu_hosts=2, faults={"gpu-02": "bios-no-stick:SriovGlobalEnable"},
                        disk_bytes=96 * 1024 * 1024, firmware={"settings": SETTINGS, "components": MINIMUMS})
    wait_hosts("available", 1, timeout=120)
    _wait(lambda: BareMetalHost.objects.filter(name="gpu-02", state="repair").exists(), timeout=60)

    good = BareMetalHost.objects.get(name="gpu-01")
    assert {k: good.firmware["settings"][k] for k in SETTINGS} == SETTINGS and good.firmware["pending"] == {}
    bmc = site.redfish.state("gpu-01")
    assert {k: bmc["bios"][k] for k in SETTINGS} == SETTINGS and bmc["bios_pending"] == {}
    applied = _step(good, "bios_apply")
    assert set(applied.data["changed"]) == set(SETTINGS), applied.data
    assert _step(good, "bios_verify").data["verified"] == sorted(SETTINGS)
    versions = {c["component"]: c["currentVersion"] for c in good.firmware["components"]}
    assert versions["bios"] == "2.3.1" and versions["bmc"] == "1.10.2" and versions["gpu:GPU.0"] == "96.00.AF.00.01"

    # The setting that never sticks: the host goes to repair with wanted / actual / pending, not to the pool.
    bad = BareMetalHost.objects.get(name="gpu-02")
    moved = Event.objects.filter(host=bad, kind="transition", to_state="repair").get()
    assert moved.step == "bios_verify"
    assert "BIOS settings did not stick after the reboot: SriovGlobalEnable: wanted Enabled, is Disabled" in moved.message
    evidence = moved.data["evidence"]["bios"]
    assert evidence["not_applied"] == {"SriovGlobalEnable": {"wanted": "Enabled", "actual": "Disabled"}}
    assert evidence["actual"] == {"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Disabled"}
    assert ("inspecting", "available") not in _transitions(bad)

    # The host page: wanted / actual per setting, and the firmware against the NodeType's minimums.
    client.force_login(admin_user)
    page = client.get("/hosts/gpu-02/").content.decode()
    assert 'id="host-bios-settings"' in page
    assert "<td>SriovGlobalEnable</td><td>Enabled</td><td>Disabled</td>" in page
    assert "<td>ProcVirtualization</td><td>Enabled</td><td>Enabled</td>" in page
    page = client.get("/hosts/gpu-01/").content.decode()
    assert "<td>2.3.1</td><td>2.4.0 below</td>" in page  # BIOS under the minimum
    assert "<td>1.10.2</td><td>1.10 ✓</td>" in page
    assert 'id="firmware-update-link"' in page  # an available host, an admin


@pytest.mark.django_db(transaction=True)
def test_an_admin_updates_firmware_on_an_available_host_and_a_failed_update_goes_to_repair_with_the_bmcs_message(
        firmware_lab, celery_worker_process, client, admin_user):
    site = firmware_lab(hosts=2, gpu_hosts=2, faults={"gpu-02": "firmware-update-fails"}, disk_bytes=96 * 1024 * 1024)
    wait_hosts("available", 2, timeout=150)
    client.force_login(admin_user)

    answer = client.post("/hosts/gpu-01/firmware-update/",
                         {"component": "bios", "image_url": "http://firmware.example.invalid/lab/bios-2.4.0.bin"})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    _wait(lambda: ("servicing", "available") in _transitions(BareMetalHost.objects.get(name="gpu-01")), timeout=60)
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.state == "available" and host.power_state == "off"
    bios = next(c for c in host.firmware["components"] if c["component"] == "bios")
    assert (bios["currentVersion"], bios["initialVersion"], bios["lastVersionFlashed"]) == ("2.4.0", "2.3.1", "2.4.0")
    assert site.redfish.state("gpu-01")["firmware"]["BIOS"] == "2.4.0"
    asked = Event.objects.filter(host=host, kind="transition", to_state="servicing").get()
    assert asked.actor.endswith(admin_user.username) and asked.data["firmware_update"]["component"] == "bios"
    verified = _step(host, "firmware_update_verify").data
    assert (verified["component"], verified["before"], verified["after"]) == ("bios", "2.3.1", "2.4.0")

    answer = client.post("/hosts/gpu-02/firmware-update/",
                         {"component": "bmc", "image_url": "https://firmware.example.invalid/lab/bmc-1.11.0.bin"})
    assert answer.status_code == 302
    _wait(lambda: BareMetalHost.objects.get(name="gpu-02").state == "repair", timeout=60)
    failed = BareMetalHost.objects.get(name="gpu-02")
    moved = Event.objects.filter(host=failed, kind="transition", to_state="repair").get()
    assert moved.from_state == "servicing" and moved.step == "firmware_update_wait"
    assert moved.message == f"firmware_update failed at firmware_update_wait: firmware update of bmc failed: " \
                            f"{FIRMWARE_UPDATE_FAILURE}"
    evidence = moved.data["evidence"]["firmware_update"]
    assert evidence["task_state"] == "Exception" and evidence["messages"] == [FIRMWARE_UPDATE_FAILURE]
    assert evidence["before"] == "1.10.2" and evidence["image_url"].endswith("bmc-1.11.0.bin")
    assert site.redfish.state("gpu-02")["firmware"]["BMC"] == "1.10.2"  # unchanged


@pytest.mark.django_db(transaction=True)
def test_a_setting_the_node_type_gained_after_intake_is_applied_before_the_provision_and_verified(
        firmware_lab, celery_worker_process, apply):
    site = firmware_lab(hosts=1, gpu_hosts=1, tenants=["one"], disk_bytes=96 * 1024 * 1024,
                        firmware={"settings": {"ProcVirtualization": "Enabled"}})
    wait_hosts("available", 1, timeout=120)
    assert site.redfish.state("gpu-01")["bios"]["SriovGlobalEnable"] == "Disabled"
    NodeType.objects.filter(name="gpu-server").update(firmware={"settings": SETTINGS})  # asked for after its intake

    apply(gpu_pool(1), tenant="one")
    _wait(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 1, timeout=180)
    host = BareMetalHost.objects.get(name="gpu-01")
    steps = {e.step: e.data for e in Event.objects.filter(host=host, kind="step", data__flow="provision")
             .exclude(message="started")}
    assert steps["bios_apply"]["changed"] == {"SriovGlobalEnable": {"wanted": "Enabled", "actual": "Disabled"}}
    assert steps["bios_verify"]["verified"] == sorted(SETTINGS)
    assert site.redfish.state("gpu-01")["bios"]["SriovGlobalEnable"] == "Enabled"
    assert host.state == "provisioned" and host.firmware["settings"]["SriovGlobalEnable"] == "Enabled"
