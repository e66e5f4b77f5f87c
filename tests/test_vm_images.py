"""The VM artefacts built from Debian packages (lab/vmimage.py) boot under QEMU (TCG) on their own.

- the agent ramdisk (`-kernel/-initrd`, `vmetal.selftest`): the agent's inventory names the emulated NVMe's model,
  serial and size and the NIC's MAC as QEMU was given them; `nvme id-ctrl` and `nvme format --ses=1` run against
  the emulated controller (what it offers for sanitize and crypto erase is printed);
- the console's virtual-media ISO (hosts/boot/ramdisk.py boot_iso with the ramdisk in IMAGE_DIR/agent) boots from the CD
  and the agent, reading VMETAL.CFG from it, looks itself up at the console with the boot's secret;
- the OS image, written to an NVMe backing file with a seed from agent/seed.py in its last 64 MiB, boots from the
  disk under SeaBIOS, takes the static address of its network-config and joins a lab tenant API with the
  bootstrap token of its runcmd: the Node is Ready, and its status is posted again while the VM runs.

The build runs once per session (cached by content hash under VM_IMAGE_CACHE; the first build downloads the
packages). The guest reaches the host's loopback as 10.0.2.2 (QEMU's user-mode network).
"""
from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from agent.seed import build_seed_iso, write_seed_to_disk
from claims.tenant_api import TenantAPI, join_command
from hosts.boot.ramdisk import boot_iso
from lab import vmimage
from lab.kube import TenantAPIServer

pytest_plugins = ["tests.vm_conftest"]
pytestmark = pytest.mark.vm

MiB = 1024 * 1024
DISK_BYTES = 256 * MiB
NVME_SERIAL = "VMETAL-NVME-0042"
MAC = "52:54:00:5e:00:42"
BOOT_TIMEOUT_S = 240  # TCG: 25-45 s on 2 idle cores, up to ~125 s measured at a load average of 27


class VM:
    """One QEMU process (TCG, 1 CPU, 512 MiB, an NVMe disk, a virtio NIC on user-mode networking), its serial
    console in a file."""

    def __init__(self, directory: Path, args: list[str], disk: Path) -> None:
        self.log_path = directory / "serial.log"
        argv = ["qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-smp", "1", "-nographic", "-no-reboot",
                "-drive", f"file={disk},if=none,id=d0,format=raw", "-device", f"nvme,serial={NVME_SERIAL},drive=d0",
                "-netdev", "user,id=n0", "-device", f"virtio-net-pci,netdev=n0,mac={MAC},romfile=", *args]
        self.started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    @property
    def serial(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace").replace("\r", "")

    def wait(self, condition, what: str, timeout: float = BOOT_TIMEOUT_S):
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if value := condition():
                return value
            if self.proc.poll() is not None and not condition():
                break
            time.sleep(0.2)
        pytest.fail(f"{what}: not within {timeout:.0f} s (QEMU {'exited ' + str(self.proc.returncode) if self.proc.poll() is not None else 'running'}); "
                    f"serial console ends:\n{self.serial[-3000:]}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def vm(tmp_path):
    vms = []

    def start(args: list[str], disk: Path | None = None) -> VM:
        if disk is None:
            disk = tmp_path / "nvme.raw"
            with open(disk, "wb") as fh:
                fh.truncate(DISK_BYTES)
        machine = VM(tmp_path, args, disk)
        vms.append(machine)
        return machine

    yield start
    for machine in vms:
        machine.stop()


def section(serial: str, name: str) -> str:
    match = re.search(rf"^=== {re.escape(name)}\n(.*?)^=== end", serial, re.DOTALL | re.MULTILINE)
    assert match, f"no '{name}' section on the serial console:\n{serial[-3000:]}"
    return match.group(1)


def test_the_ramdisk_boots_and_the_agent_reports_the_nvme_and_the_nic_as_qemu_was_given_them(images, vm):
    machine = vm(["-kernel", str(images.path("vmlinuz")), "-initrd", str(images.path("initrd")),
                  "-append", "console=ttyS0 panic=-1 quiet vmetal.selftest"])
    machine.wait(lambda: machine.proc.poll() is not None, "the selftest powers the VM off")
    serial = machine.serial
    assert re.search(r"^vmetal-init \[[\d.]+ s\]: selftest done$", serial, re.MULTILINE), serial[-3000:]
    inventory = json.loads(section(serial, "inventory"))
    [disk] = inventory["disks"]
    assert (disk["name"], disk["model"], disk["serial"], disk["size_bytes"], disk["type"]) == \
        ("nvme0n1", "QEMU NVMe Ctrl", NVME_SERIAL, DISK_BYTES, "nvme")
    assert [nic["mac"] for nic in inventory["nics"]] == [MAC]
    ctrl = json.loads(section(serial, "id-ctrl /dev/nvme0n1"))
    assert ctrl["sn"].strip() == NVME_SERIAL and ctrl["mn"].strip() == "QEMU NVMe Ctrl"
    assert ctrl["oacs"] & 0x2, "the controller offers Format NVM"
    assert section(serial, "format --ses=1 /dev/nvme0n1").strip().startswith("Success formatting")
    crypto = section(serial, "format --ses=2 /dev/nvme0n1").strip()
    agent_at = re.search(r"vmetal-init \[([\d.]+) s\]: selftest: inventory", serial)
    print(f"QEMU {ctrl['fr'].strip()} NVMe: sanicap={ctrl['sanicap']:#x} (sanitize {'offered' if ctrl['sanicap'] else 'not offered'}), "
          f"fna={ctrl['fna']:#x} (crypto erase {'offered' if ctrl['fna'] & 0x4 else 'not offered'}; "
          f"format --ses=2 answered {crypto!r}); "
          f"ramdisk up to the agent in {agent_at.group(1) if agent_at else '?'} s guest time, "
          f"powered off after {machine.elapsed():.1f} s wall")


class Console(http.server.BaseHTTPRequestHandler):
    """Stands in for the console's agent listener: records each lookup, answers 503 (the agent tries again)."""

    lookups: ClassVar[list[dict]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path == "/agent/lookup":
            self.lookups.append(json.loads(body))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def console_listener():
    Console.lookups = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Console)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], Console.lookups
    server.shutdown()


def test_the_virtual_media_iso_of_a_boot_starts_the_agent_which_looks_up_with_the_secret_on_the_cd(
        images, vm, tmp_path, settings, console_listener):
    port, lookups = console_listener
    settings.IMAGE_DIR = tmp_path / "images"
    vmimage.copy_out(images, settings.IMAGE_DIR)
    secret = "vm-media-boot-secret-7f3a"
    iso = tmp_path / "boot.iso"
    iso.write_bytes(boot_iso(f"vmetal.console=http://10.0.2.2:{port} vmetal.boot_secret={secret} vmetal.host=vm-1"))
    machine = vm(["-cdrom", str(iso), "-boot", "d"])
    machine.wait(lambda: lookups, "the agent's lookup at the console")
    assert lookups[0]["macs"] == [MAC] and lookups[0]["boot_secret"] == secret
    assert "/mnt/cd/vmetal.cfg" in machine.serial  # read from the CD, not the kernel command line
    print(f"virtual media: ISO {iso.stat().st_size / MiB:.1f} MiB; first lookup {machine.elapsed():.1f} s after "
          f"power on")


def test_the_os_image_boots_from_nvme_takes_its_seeds_address_and_joins_the_tenant_with_the_token(
        images, vm, tmp_path):
    disk = tmp_path / "os.raw"
    shutil.copyfile(images.path(vmimage.OS_IMAGE), disk)
    os.truncate(disk, DISK_BYTES)
    with TenantAPIServer("one") as tenant:
        token = TenantAPI(tenant.kubeconfig(), timeout=5).create_bootstrap_token().token
        # As claims/steps.py writes the seed: the join command in runcmd, the static address from the console's IPAM.
        command = join_command("vcluster", f"10.0.2.2:{tenant.port}", token, scheme="http")
        user_data = "#cloud-config\n" + yaml.safe_dump({"hostname": "vm-one-1", "runcmd": [command]}, sort_keys=False)
        meta_data = yaml.safe_dump({"instance-id": "claim-1", "local-hostname": "vm-one-1"}, sort_keys=False)
        network = yaml.safe_dump({"version": 2, "ethernets": {"eth0": {
            "match": {"macaddress": MAC}, "set-name": "eth0", "addresses": ["10.0.2.50/24"],
            "routes": [{"to": "default", "via": "10.0.2.2"}]}}}, sort_keys=False)
        write_seed_to_disk(str(disk), build_seed_iso(user_data, meta_data, network))
        machine = vm(["-boot", "c"], disk=disk)

        def ready_node():
            for node in tenant.objects("nodes"):
                conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
                if conditions.get("Ready", {}).get("status") == "True":
                    return node
            return None

        node = machine.wait(ready_node, "the OS's node Ready in the tenant API")
        joined_after = machine.elapsed()
        assert node["metadata"]["name"] == "vm-one-1"
        assert {"type": "InternalIP", "address": "10.0.2.50"} in node["status"]["addresses"]
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "vm-one-1"
        first_beat = node["status"]["conditions"][0]["lastHeartbeatTime"]
        machine.wait(lambda: (n := ready_node()) and n["status"]["conditions"][0]["lastHeartbeatTime"] != first_beat,
                     "a heartbeat after the join", timeout=joined_after + 30)
    assert "ISOLINUX" in machine.serial and "seed found on /dev/nvme0n1" in machine.serial
    print(f"OS image {images.path(vmimage.OS_IMAGE).stat().st_size / MiB:.1f} MiB: node Ready {joined_after:.1f} s "
          f"after power on")


def test_a_second_build_with_nothing_changed_reuses_everything(images):
    again = vmimage.build(list(vmimage.TARGETS))
    assert again.key == images.key and again.built == [] and set(again.reused) == set(vmimage.TARGETS)
    assert again.seconds < 15
