"""VM servers in the lab (lab/vm.py): a QEMU machine (TCG) per server behind the lab's Redfish BMC, driven the way
the console drives any server, through its BMC client (hosts/bmc/client.py, sushy). Network boot goes QEMU's DHCP and
TFTP → iPXE → the console's per-host script on the live agent listener; the disk is an emulated NVMe; virtual
media is a CD-ROM; the process is the power."""
import os
import shutil
import time

import pytest
from django.core.management import call_command

from conftest import DEMO, wait_for
from hosts.bmc.client import BMC
from hosts.boot.ramdisk import ramdisk_boot_start
from hosts.models import BareMetalHost, RamdiskBoot
from hosts.preflight import hosts_preflight
from lab.redfish import GUEST_HOST
from lab.site import LabSite
from pools.matching import label_selector_matches
from pools.models import NodeType

from .lab_conftest import FAST, lab_report

pytest_plugins = ["tests.lab_conftest"]
pytestmark = [
    pytest.mark.vm, pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not shutil.which("qemu-system-x86_64"),
                       reason="qemu-system-x86_64 is not installed (Debian: qemu-system-x86, ipxe-qemu): no VM servers"),
]
VM = "vm-01"


def boot_sector(message: bytes, *, power_off: bool = False) -> bytes:
    """A 512-byte x86 boot sector that writes `message` to COM1 and halts, or powers the machine off through
    ACPI (PM1a control at 0x604, S5, as QEMU's pc machine has it under SeaBIOS): what a disk or CD "boots"."""
    tail = bytes.fromhex("ba0406" "b80020" "ef") if power_off else b""  # mov dx,0x604; mov ax,0x2000; out dx,ax
    code_len = 1 + 4 + 3 + 3 + 1 + 2 + 2 + 1 + 2 + len(tail) + 2
    start = 0x7C00 + code_len
    code = (bytes.fromhex("fc" "31c0" "8ed8")  # cld; xor ax,ax; mov ds,ax
            + bytes([0xBE, start & 0xFF, start >> 8])  # mov si, message
            + bytes.fromhex("baf803" "ac" "84c0")  # mov dx,0x3f8; lodsb; test al,al
            + bytes([0x74, 0x03]) + bytes.fromhex("ee" "ebf8")  # jz +3; out dx,al; jmp lodsb
            + tail + bytes.fromhex("faf4"))  # cli; hlt
    assert len(code) == code_len
    sector = bytearray(512)
    sector[:code_len + len(message) + 1] = code + message + b"\0"
    sector[510:512] = b"\x55\xaa"
    return bytes(sector)


@pytest.fixture
def vm_console(agent_server, settings, worker_settings):
    """The console's AGENT_BOOT_URL is its agent listener as a VM reaches it: 10.0.2.2, QEMU's address of this
    host (for workers started after this too)."""
    url = agent_server.url.replace("127.0.0.1", GUEST_HOST)
    settings.AGENT_BOOT_URL = worker_settings["AGENT_BOOT_URL"] = url
    # The console checks its boot path (preflight) where it reaches it itself.
    settings.AGENT_BOOT_CHECK_URL = worker_settings["AGENT_BOOT_CHECK_URL"] = agent_server.url
    return url


@pytest.fixture
def vm_lab(vm_console, agent_server, tmp_path):
    """vm_lab(**LabSite kwargs) → a started lab with one VM server, registered."""
    sites = []

    def make(**kwargs):
        kwargs = {"hosts": 0, "vms": 1, "power_delay": (0.1, 0.2), "disk_bytes": 64 * 1024 * 1024, **kwargs}
        site = LabSite(console_url=vm_console, var_dir=tmp_path / "lab", **kwargs).start()
        sites.append(site)
        assert site.console_url == agent_server.url and site.vm_console_url == vm_console
        call_command("apply", "-f", str(DEMO / "site.yaml"), verbosity=0)
        site.register()
        return site

    yield make
    for site in sites:
        print(f"--- {VM}'s serial console ---\n{site.hosts[VM].vm.console_text()[-3000:]}")
        site.stop()


def bmc_of(site: LabSite) -> BMC:
    host = BareMetalHost.objects.get(name=VM)
    return BMC(host.bmc_address, "admin", site.hosts[VM].password, timeout=5)


def console_shows(site: LabSite, *texts: str, timeout: float = 45) -> str:
    vm = site.hosts[VM].vm
    try:
        wait_for(lambda: all(t in vm.console_text() for t in texts), timeout=timeout, interval=0.2)
    except AssertionError:
        raise AssertionError(f"serial console never showed {texts}:\n{vm.console_text()[-3000:]}") from None
    return vm.console_text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read().lower()


def test_a_vm_powered_on_into_pxe_fetches_its_own_boot_script_from_the_console_and_power_off_ends_it(vm_lab):
    site = vm_lab()
    vm = site.hosts[VM].vm
    host = BareMetalHost.objects.get(name=VM)
    assert host.boot_mac == vm.mac
    assert [t.name for t in NodeType.objects.all() if label_selector_matches(t.host_selector, host.labels)] == ["vm-server"]
    # Preflight is green: the boot path is checked where the console reaches it, not at 10.0.2.2.
    hosts_preflight(hosts=[host], actor="user:test")
    host.refresh_from_db()
    assert (host.preflight_ok, host.preflight_reason) == (True, ""), host.preflight
    boot = ramdisk_boot_start(host=host, flow_id="test")
    bmc = bmc_of(site)
    assert bmc.power_state() == "off" and not vm.running
    bmc.set_boot_once("pxe")
    bmc.power_on()
    wait_for(lambda: vm.running, timeout=10)
    started = time.monotonic()
    pid = vm.proc.pid
    boot = wait_for(lambda: RamdiskBoot.objects.filter(pk=boot.pk, delivered_at__isnull=False).first(), timeout=60)
    fetched_after = time.monotonic() - started
    print(f"QEMU start → iPXE script delivered: {fetched_after:.1f}s")
    assert boot.delivered_via == "ipxe"
    mac = vm.mac.replace(":", "-")
    text = console_shows(site, f"{site.vm_console_url}/boot/{mac}.ipxe")
    # The chain came from the VM's own DHCP boot file over TFTP, rendered from the console's DHCP rules.
    assert "tftp://10.0.2.2/vmetal.ipxe" in text and "${mac:hexhyp}" in (vm.tftp_dir / "vmetal.ipxe").read_text()
    assert bmc.power_state() == "on"

    bmc.power_off()
    wait_for(lambda: bmc.power_state() == "off", timeout=10)
    wait_for(lambda: not alive(pid), timeout=10)
    assert not vm.running


def test_a_one_time_pxe_boot_is_spent_so_a_reset_boots_the_nvme_and_a_graceful_shutdown_ends_in_off(vm_lab):
    site = vm_lab()
    vm = site.hosts[VM].vm
    vm.grace_s = 1.0
    with open(vm.disk, "r+b") as disk:
        disk.write(boot_sector(b"VMETAL NVME BOOTED"))
    bmc = bmc_of(site)
    bmc.set_boot_once("pxe")
    bmc.power_on()
    console_shows(site, "Configuring (net0")  # iPXE boots from the network first
    first = vm.proc.pid

    bmc.reset()  # ForceRestart: the override was spent by the first power-on, so now the disk
    wait_for(lambda: vm.running and vm.proc.pid != first, timeout=15)
    text = console_shows(site, "VMETAL NVME BOOTED")
    boots = [line for line in text.splitlines() if line.startswith("Booting from")]
    assert boots[0].startswith("Booting from Hard Disk"), text
    assert "Configuring (net0" not in text and not alive(first)
    assert site.redfish.state(VM)["boot_target"] == "Hdd"
    second = vm.proc.pid

    bmc.power_off(force=False)  # the firmware has no ACPI handler: off after the grace period
    wait_for(lambda: bmc.power_state() == "off", timeout=10)
    wait_for(lambda: not alive(second), timeout=10)


def test_a_cd_boot_boots_the_inserted_virtual_media(vm_lab):
    import io

    import pycdlib

    site = vm_lab()
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident="VMETAL_TEST")
    sector = boot_sector(b"VMETAL CD BOOTED")
    iso.add_fp(io.BytesIO(sector * 4), 2048, "/BOOT.IMG;1")
    iso.add_eltorito("/BOOT.IMG;1", bootcatfile="/BOOT.CAT;1", media_name="noemul", boot_load_size=4)
    iso.write(str(site.var_dir / "images" / "boot-test.iso"))
    iso.close()
    # Named as a VM would reach it: the lab's BMC (on this host) downloads it from 127.0.0.1.
    url = f"http://10.0.2.2:{site._image_server.server_address[1]}/boot-test.iso"
    bmc = bmc_of(site)
    bmc.insert_virtual_media(url)
    bmc.set_boot_once("cd")
    bmc.power_on()
    console_shows(site, "Booting from DVD/CD", "VMETAL CD BOOTED")
    bmc.power_off()
    wait_for(lambda: bmc.power_state() == "off", timeout=10)


def test_a_guest_that_powers_itself_off_shows_off_on_its_bmc(vm_lab):
    site = vm_lab()
    vm = site.hosts[VM].vm
    with open(vm.disk, "r+b") as disk:
        disk.write(boot_sector(b"VMETAL POWERING OFF", power_off=True))
    bmc = bmc_of(site)
    bmc.set_boot_once("disk")
    bmc.power_on()
    wait_for(lambda: vm.running, timeout=10)
    console_shows(site, "VMETAL POWERING OFF")
    wait_for(lambda: bmc.power_state() == "off", timeout=20)
    assert not vm.running
    assert any(e["cause"] == "guest-power-off" and e["power_state"] == "Off" for e in site.redfish.events())


@pytest.fixture
def fast_worker_settings(vm_console, worker_settings, settings):
    """Short deadlines for the worker started after this (and this process): a failed boot shows in seconds."""
    values = {**FAST, "AGENT_LOOKUP_DEADLINE_S": "12"}
    worker_settings["WITH_BEAT"] = "1"  # the periodic re-drive (DRIVE_STALE_EVERY_S) checks the lookup deadline
    worker_settings.update(values)
    for key, value in values.items():
        if hasattr(settings, key):
            setattr(settings, key, type(getattr(settings, key))(float(value)))


def test_a_vm_whose_network_boot_finds_no_boot_file_ends_in_error_within_the_lookup_deadline(
        fast_worker_settings, celery_worker_process, vm_lab):
    site = vm_lab(faults={VM: "no-tftp"})  # registered: the console inspects it (power on into PXE)
    host = BareMetalHost.objects.get(name=VM)
    started = time.monotonic()
    try:
        wait_for(lambda: BareMetalHost.objects.get(pk=host.pk).state == "error", timeout=60, interval=0.5)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    host.refresh_from_db()
    assert "agent_lookup" in (host.flow or {}).get("step", "") or "agent" in host.error_message.lower(), lab_report()
    assert host.error_message, lab_report()
    print(f"powered on → error in {time.monotonic() - started:.1f}s: {host.error_message}")
    text = site.hosts[VM].vm.console_text()
    assert "tftp://10.0.2.2/vmetal.ipxe" in text, text[-2000:]  # iPXE asked, nothing answered
    assert not RamdiskBoot.objects.filter(host=host, delivered_at__isnull=False).exists()


def test_a_simulated_server_beside_vms_still_boots_its_agent_through_127_0_0_1(
        fast_worker_settings, celery_worker_process, vm_lab):
    """The console names itself 10.0.2.2 in every boot script (what the VMs reach); the lab's simulated servers run
    on this host, so their agent calls 127.0.0.1 instead, and they are inspected and available as before."""
    site = vm_lab(hosts=1, faults={VM: "no-tftp"})  # the VM fails its own boot: not what this test is about
    try:
        wait_for(lambda: BareMetalHost.objects.filter(name="cpu-01", state="available").exists(), timeout=60,
                 interval=0.5)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    boot = RamdiskBoot.objects.get(host__name="cpu-01")
    assert boot.delivered_via == "ipxe" and boot.looked_up_at is not None
    cmdline = (site.hosts["cpu-01"].directory / "ramdisk" / "cmdline").read_text()
    assert f"vmetal.console={site.console_url} " in cmdline and GUEST_HOST not in cmdline
