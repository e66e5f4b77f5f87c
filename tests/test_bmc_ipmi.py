"""hosts.bmc.ipmi against the lab's real IPMI LAN servers (pyghmi's BMC server class on the lab's power and boot
events), cross-checked with Debian's ipmitool, a second and independent IPMI client: power, boot override, the
system event log, errors that never heal and those that do, preflight and registration."""
import os
import shutil
import subprocess
import time

import pytest

from hosts.bmc.client import BMCError
from hosts.bmc.factory import bmc_client
from hosts.bmc.ipmi import IpmiBMC
from lab.redfish import RedfishLab

USER, PASSWORD = "admin", "lab-ipmi-pw-5e1f"  # IPMI 2.0: 20 bytes at most
SYSTEMS = [
    {"name": "cpu-01", "mac": "52:54:00:00:01:01", "ipmi": True},
    {"name": "cpu-02", "mac": "52:54:00:00:01:02", "ipmi": True},
    {"name": "cpu-03", "mac": "52:54:00:00:01:03", "ipmi": True, "ipmi_ciphers": False},
    {"name": "cpu-04", "mac": "52:54:00:00:01:04", "ipmi": True,
     # A memory error the BMC logged before the console knew the server: SEL sensor type 0x0C, offset 1.
     "sel": [{"sensor_type": 0x0C, "offset": 1, "sensor": 3}]},
    {"name": "cpu-05", "mac": "52:54:00:00:01:05", "ipmi": True, "fault": "bmc-down"},  # down from the start
]


@pytest.fixture(scope="module")
def lab():
    with RedfishLab(SYSTEMS, USER, PASSWORD, power_delay=(0.2, 0.4)) as lab:
        yield lab


@pytest.fixture(autouse=True)
def no_faults_left(request):
    yield
    if "lab" in request.fixturenames:
        lab = request.getfixturevalue("lab")
        for name in lab.faults():
            if name != "cpu-05":
                lab.clear_fault(name)


def client(lab, name: str, password: str = PASSWORD, **options) -> IpmiBMC:
    return IpmiBMC(lab.system_address(name), USER, password, **options)


def ipmitool(lab, name: str, *args: str) -> str:
    """ipmitool over lanplus, its password from the environment (-E), never in argv. Cipher suite 3: pyghmi's
    server speaks that one (ipmitool's default is 17)."""
    tool = shutil.which("ipmitool")
    if tool is None:
        if os.environ.get("CI"):
            pytest.fail("ipmitool is not installed (.ci/run installs Debian's ipmitool)")
        pytest.skip("ipmitool is not installed (Debian: apt-get install ipmitool)")
    host, port = lab.system_address(name).removeprefix("ipmi://").rsplit(":", 1)
    done = subprocess.run([tool, "-I", "lanplus", "-C", "3", "-H", host, "-p", port, "-U", USER, "-E", *args],
                          env={**os.environ, "IPMI_PASSWORD": PASSWORD}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_factory_gives_an_ipmi_address_the_ipmi_client_and_a_redfish_one_the_redfish_client(settings):
    ipmi = bmc_client("ipmi://10.0.0.5", USER, PASSWORD, verify_tls=True, boot_mac=None)
    redfish = bmc_client("redfish+http://10.0.0.5/redfish/v1/Systems/1", USER, PASSWORD, verify_tls=True,
                         boot_mac=None)
    assert isinstance(ipmi, IpmiBMC) and (ipmi.host, ipmi.port, ipmi.virtual_media_boot) == ("10.0.0.5", 623, False)
    assert type(redfish).__name__ == "BMC"


def test_power_on_off_soft_off_and_reset_land_as_lab_power_events_and_ipmitool_agrees(lab):
    with client(lab, "cpu-01") as bmc:
        assert bmc.check()["power_state"] == "off"
        assert ipmitool(lab, "cpu-01", "power", "status").strip() == "Chassis Power is off"
        since = lab.events()[-1]["seq"] if lab.events() else 0
        bmc.power_on()
        bmc.wait_power("on", deadline_s=10, poll_s=0.1)
        assert ipmitool(lab, "cpu-01", "power", "status").strip() == "Chassis Power is on"
        bmc.reset()
        reset = lab.wait_event("cpu-01", "On", since=lab.wait_event("cpu-01", "Off", since=since)["seq"])
        assert reset["cause"] == "reset" and bmc.power_state() == "on"
        bmc.power_off(force=False)  # soft off: ACPI, the OS powers the server down
        bmc.wait_power("off", deadline_s=10, poll_s=0.1)
        soft = [e for e in lab.events(since) if e["system"] == "cpu-01"][-1]
        assert (soft["power_state"], soft["request"]) == ("Off", "GracefulShutdown")
        assert ipmitool(lab, "cpu-01", "power", "status").strip() == "Chassis Power is off"
        bmc.power_on()
        bmc.wait_power("on", deadline_s=10, poll_s=0.1)
        bmc.power_off()
        bmc.wait_power("off", deadline_s=10, poll_s=0.1)
        hard = [e for e in lab.events(since) if e["system"] == "cpu-01"][-1]
        assert (hard["power_state"], hard["request"]) == ("Off", "ForceOff")
    # And the other way round: ipmitool powers it on, the console reads it.
    ipmitool(lab, "cpu-01", "power", "on")
    with client(lab, "cpu-01") as bmc:
        bmc.wait_power("on", deadline_s=10, poll_s=0.1)
        bmc.power_off()
        bmc.wait_power("off", deadline_s=10, poll_s=0.1)


def test_a_boot_override_is_pxe_or_disk_once_or_persistent_uefi_or_legacy_and_once_is_spent_by_the_power_on(lab):
    with client(lab, "cpu-02") as bmc:
        bmc.set_boot_device("disk", persistent=True, uefi=False)
        assert bmc.boot_device() == {"target": "disk", "persistent": True, "uefi": False}
        assert lab.state("cpu-02")["boot_target"] == "Hdd" and lab.state("cpu-02")["boot_enabled"] == "Continuous"
        assert "Boot Flag Valid" in ipmitool(lab, "cpu-02", "chassis", "bootparam", "get", "5")
        bmc.set_boot_once("pxe")
        assert bmc.boot_device() == {"target": "pxe", "persistent": False, "uefi": True}  # the client's mode: UEFI
        assert bmc.quirks() == {"virtual_media": False, "boot_once": True, "pxe_boot": True, "boot_mode": "UEFI",
                                "boot_targets": ["Pxe", "Hdd"]}
        since = lab.events()[-1]["seq"] if lab.events() else 0
        bmc.power_on()
        landed = lab.wait_event("cpu-02", "On", since=since)
        assert (landed["boot_target"], landed["boot_once"]) == ("Pxe", True)  # the lab's server boots the agent
        assert bmc.boot_device()["target"] == ""  # spent by that power-on
        bmc.power_off()
        bmc.wait_power("off", deadline_s=10, poll_s=0.1)


def test_what_ipmi_cannot_do_is_refused_with_the_reason_and_nothing_is_sent(lab):
    with client(lab, "cpu-02") as bmc:
        for call in (lambda: bmc.insert_virtual_media("http://127.0.0.1/agent.iso"), lambda: bmc.set_boot_once("cd")):
            with pytest.raises(BMCError) as refused:
                call()
            assert refused.value.kind == "unsupported" and "redfish-virtualmedia://" in str(refused.value)
        assert bmc.drives() is None  # no drive census over IPMI: the inventory of record alone


def test_the_system_event_log_is_read_and_decoded_as_ipmitool_lists_it(lab):
    lab.add_sel("cpu-04", 0x08, offset=1, sensor=7)  # power supply: failure detected
    with client(lab, "cpu-04") as bmc:
        log = bmc.event_log()
    assert [(e["id"], e["sensor_type"], e["sensor"], e["event"], e["direction"]) for e in log] == [
        (1, "Memory", 3, "Uncorrectable error", "asserted"),
        (2, "Power Supply", 7, "Failure", "asserted")]
    assert all(e["time"] for e in log)
    listed = ipmitool(lab, "cpu-04", "sel", "list").strip().splitlines()
    assert len(listed) == 2 and "Memory #0x03" in listed[0] and "Power Supply #0x07" in listed[1], listed


@pytest.mark.parametrize("name, password, kind, message", [
    ("cpu-01", "not-the-password", "auth", "BMC rejected credentials (IPMI: incorrect password)"),
    ("cpu-03", PASSWORD, "unsupported", "the BMC offers no IPMI cipher suite this console speaks (IPMI: No Cipher "
                                        "suite match with proposed security algorithms): enable cipher suite 3 or "
                                        "17 for the user on the BMC"),
])
def test_an_error_that_never_heals_is_raised_at_once_without_retries(lab, name, password, kind, message):
    started = time.monotonic()
    with pytest.raises(BMCError) as error:
        client(lab, name, password, retries=3, backoff=1).power_state()
    assert (error.value.kind, error.value.transient, str(error.value)) == (kind, False, message)
    assert time.monotonic() - started < 1  # no back-off spent on it
    assert password not in str(error.value) and PASSWORD not in str(error.value)


def test_an_unknown_user_is_refused_as_credentials(lab):
    with pytest.raises(BMCError) as error:
        IpmiBMC(lab.system_address("cpu-01"), "nobody", PASSWORD, retries=0).power_state()
    assert (error.value.kind, str(error.value)) == ("auth", "BMC rejected credentials (IPMI: unknown user)")


def test_a_bmc_that_does_not_answer_is_unreachable_and_transient_after_the_clients_retries(lab):
    lab.set_fault("cpu-02", "bmc-down")
    with pytest.raises(BMCError) as error:
        client(lab, "cpu-02", retries=1, backoff=0.1).power_state()
    assert (error.value.kind, error.value.transient) == ("unreachable", True)
    assert str(error.value) == f"BMC unreachable: no IPMI answer from {lab.system_address('cpu-02')[7:]}"


def test_a_bmc_down_from_the_labs_start_does_not_answer(lab):
    with pytest.raises(BMCError) as error:
        client(lab, "cpu-05", retries=0).power_state()
    assert error.value.kind == "unreachable"


def test_a_busy_bmc_is_retried_and_then_answers(lab):
    lab.set_fault("cpu-02", "bmc-500", requests=2)  # "node busy" (0xC0) to the next two commands
    assert client(lab, "cpu-02", retries=3, backoff=0.05).power_state() == "off"
    assert "cpu-02" not in lab.faults()


# --- through the console: registration's step, preflight -------------------------------------------------------

def registered(lab, name: str, *, password: str = PASSWORD):
    from hosts.services import host_create

    mac = next(s["mac"] for s in SYSTEMS if s["name"] == name)
    return host_create(values={"name": f"host-{name}", "bmc_address": lab.system_address(name),
                               "bmc_username": USER, "bmc_password": password, "boot_mac": mac}, actor="test")


def drive(host) -> None:
    from hosts.engine.drive import drive as engine_drive

    engine_drive(host.pk)
    host.refresh_from_db()


@pytest.mark.django_db
def test_a_wrong_ipmi_password_fails_registration_at_once_with_the_reason(lab):
    from events.models import Event

    host = registered(lab, "cpu-01", password="not-the-password")
    drive(host)
    reason = "BMC rejected credentials (IPMI: incorrect password)"
    assert (host.state, host.error_type, host.error_message) == (
        "error", "register error", f"register failed at bmc_check: {reason}")
    assert "last_error" not in host.flow  # never retried
    assert Event.objects.filter(host=host, kind="step", step="bmc_check", message=f"failed: {reason}").exists()


@pytest.mark.django_db
def test_an_unreachable_ipmi_bmc_is_retried_until_the_step_deadline_then_fails_with_its_last_error(lab, settings):
    from datetime import timedelta

    from django.utils import timezone

    from hosts.models import BareMetalHost

    host = registered(lab, "cpu-02")
    lab.set_fault("cpu-02", "bmc-down")
    unreachable = f"BMC unreachable: no IPMI answer from {lab.system_address('cpu-02')[7:]}"
    drive(host)
    assert host.state == "registering" and host.error_message == "" and host.flow["step"] == "bmc_check"
    assert host.flow["last_error"] == unreachable
    started = timezone.now() - timedelta(seconds=settings.POWER_DEADLINE_S + 1)  # the step's deadline passes
    BareMetalHost.objects.filter(pk=host.pk).update(flow={**host.flow, "step_started_at": started.isoformat()})
    drive(host)
    assert (host.state, host.error_type) == ("error", "register error")
    assert host.error_message == (f"register failed at bmc_check: bmc_check did not finish within "
                                  f"{int(settings.POWER_DEADLINE_S)}s; last error: {unreachable}")


def test_preflight_checks_an_ipmi_bmc_as_it_checks_a_redfish_one(lab, settings):
    from hosts.preflight import check_bmc

    def check(name, password=PASSWORD):
        return check_bmc(address=lab.system_address(name), username=USER, password=password, verify_tls=True,
                         boot_mac=next(s["mac"] for s in SYSTEMS if s["name"] == name))

    good = check("cpu-01")
    assert (good["ok"], good["reason"], good["tls"]) == (True, "", "none (IPMI: RMCP+ session encryption)")
    assert good["system"] == lab.system_id("cpu-01")  # the BMC's system GUID
    assert good["quirks"]["virtual_media"] is False and good["quirks"]["boot_once"] is True
    wrong = check("cpu-01", "not-the-password")
    assert (wrong["ok"], wrong["kind"], wrong["reason"]) == (False, "auth",
                                                             "BMC rejected credentials (IPMI: incorrect password)")
    cipher = check("cpu-03")
    assert (cipher["ok"], cipher["kind"]) == (False, "unsupported") and "cipher suite" in cipher["reason"]
