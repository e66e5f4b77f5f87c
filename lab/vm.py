"""A VM server of the lab: one QEMU process per power-on, behind the lab's Redfish BMC (lab/site.py maps power).

What the server is made of (everything under var/lab/<host>/):
- firmware: SeaBIOS (`-machine pc`), its text console on the serial port (SeaBIOS's sercon), so the firmware's,
  iPXE's and the guest kernel's output all land in console.log;
- disk: an emulated NVMe controller (`-device nvme`, the host's serial number) on a raw file, nvme0n1.img;
- NIC: virtio with the host's boot MAC and QEMU's own iPXE option ROM (Debian's ipxe-qemu: efi-virtio.rom
  holds the BIOS and the UEFI image; naming it with `romfile=` makes SeaBIOS skip it, so the default is kept);
- network: QEMU's user-mode network only: its DHCP gives one boot file per VM (`bootfile=`) from the VM's
  own TFTP directory (tftp/), and the guest reaches the host's 127.0.0.1 as 10.0.2.2 (GUEST_HOST);
- CD: an IDE CD-ROM drive, with the BMC's virtual-media ISO in it when one is inserted;
- boot order: the BMC's boot target at power-on (Pxe → network, Hdd → the NVMe, Cd → the CD-ROM); a one-time
  override is `-boot once=…`: a reset of the guest then boots from the disk, as a BMC's "Once" does;
- power: the process is the power. Off: kill it; graceful: ACPI power button through the monitor (stdin),
  then kill after a grace period; a guest that powers itself off ends the process, which the lab reports to
  the BMC (`exited_by_itself`).

Acceleration: TCG unless a short probe boot under KVM reaches the kernel's root mount (nested KVM here
stalls guest kernels early), answered once per process (`accelerator`)."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .redfish import GUEST_HOST  # the host's loopback as a guest sees it

log = logging.getLogger("lab.vm")
QEMU = "qemu-system-x86_64"
BOOT_FILE = "vmetal.ipxe"  # the VM's DHCP boot file, in its TFTP directory
BOOT_ORDER = {"Pxe": "n", "Hdd": "c", "Cd": "d"}  # Redfish BootSourceOverrideTarget → QEMU's -boot letter
SERCON_PORT = b"\xf8\x03"  # 0x3f8, little-endian: SeaBIOS's text console on COM1
GRACE_S = 10.0  # a graceful shutdown the guest ignores ends as a forced one (firmware has no ACPI handler)
RAM_MIB = 768

_accel_lock = threading.Lock()
_accel: str | None = None


class VMError(RuntimeError):
    """QEMU is missing or refused to start the VM."""


def qemu_available() -> bool:
    return shutil.which(QEMU) is not None


def accelerator(probe_kernel: str | Path | None = None) -> str:
    """"kvm" when /dev/kvm opens and a probe boot of `probe_kernel` under KVM gets to the kernel's root mount
    within seconds, else "tcg". VMETAL_LAB_ACCEL=tcg|kvm decides without a probe. Cached per process: the
    first answer holds (a probe costs seconds)."""
    global _accel
    forced = os.environ.get("VMETAL_LAB_ACCEL", "").lower()
    if forced in ("tcg", "kvm"):
        return forced
    with _accel_lock:
        if _accel is None:
            _accel = "kvm" if _kvm_probe(probe_kernel) else "tcg"
            log.info("QEMU accelerator: %s", _accel)
        return _accel


def _kvm_probe(kernel: str | Path | None, timeout: float = 10.0) -> bool:
    """A kernel without an initramfs, under KVM: it either panics at its root mount (it booted: KVM works; with
    panic=-1 and -no-reboot QEMU exits at once, ~2 s) or stalls (nested KVM here: not one line on the serial
    console in 10 s; the same kernel under TCG gets to the panic in ~30 s). Without a kernel to try, no KVM: a
    firmware-only probe passes where kernels stall."""
    if not kernel or not Path(kernel).is_file() or not os.access("/dev/kvm", os.R_OK | os.W_OK) or not qemu_available():
        return False
    with tempfile.TemporaryDirectory(prefix="vmetal-kvm-probe-") as tmp:
        serial = Path(tmp) / "serial.log"
        try:
            subprocess.run([QEMU, "-accel", "kvm", "-machine", "pc", "-m", "256", "-display", "none", "-nodefaults",
                            "-no-reboot", "-kernel", str(kernel), "-append", "console=ttyS0 panic=-1",
                            "-serial", f"file:{serial}"],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout, check=False)
        except (subprocess.TimeoutExpired, OSError):
            return False
        text = serial.read_text(errors="replace") if serial.exists() else ""
        return "Kernel panic" in text or "Unable to mount root" in text


class VMServer:
    """One VM server: its files, and its QEMU process while it is powered on."""

    def __init__(self, name: str, mac: str, directory: Path, *, disk_bytes: int, disk_serial: str,
                 ram_mib: int = RAM_MIB, probe_kernel: str | Path | None = None, grace_s: float = GRACE_S):
        self.name, self.mac, self.directory = name, mac.lower(), Path(directory)
        self.disk_bytes, self.disk_serial, self.ram_mib = disk_bytes, disk_serial, ram_mib
        self.probe_kernel, self.grace_s = probe_kernel, grace_s
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.boot: str = ""
        self._lock = threading.Lock()

    # files

    @property
    def disk(self) -> Path:
        return self.directory / "nvme0n1.img"

    @property
    def tftp_dir(self) -> Path:
        return self.directory / "tftp"

    @property
    def console_log(self) -> Path:
        return self.directory / "console.log"

    @property
    def qemu_log(self) -> Path:
        return self.directory / "qemu.log"

    @property
    def cd_image(self) -> Path:
        return self.directory / "cd.iso"

    def prepare(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tftp_dir.mkdir(exist_ok=True)
        with open(self.disk, "ab") as f:  # sparse: costs nothing until written
            f.truncate(self.disk_bytes)
        (self.directory / "sercon.bin").write_bytes(SERCON_PORT)
        if qemu_available():
            accelerator(self.probe_kernel)  # the probe (if any) now, not in the first power-on

    def console_text(self) -> str:
        """The serial console so far, as a person reads it (iPXE's status spinner and padding gone)."""
        try:
            raw = self.console_log.read_bytes().decode(errors="replace")
        except OSError:
            return ""
        raw = raw.replace("\r", "\n").replace("\b", "")
        return "\n".join(" ".join(line.split()) for line in raw.splitlines() if line.strip())

    # power

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self, *, boot: str, once: bool, cd: bool) -> list[str]:
        letter = BOOT_ORDER.get(boot, "c")
        # Once: this boot from the target, every reset after it from the disk (the BMC's override is spent).
        order = f"once={letter},order=c" if once and letter != "c" else f"order={letter}"
        cd_drive = (f"file={self.cd_image},format=raw,media=cdrom,readonly=on,if=none,id=cd0" if cd
                    else "media=cdrom,if=none,id=cd0")
        return [
            QEMU, "-name", self.name, "-machine", "pc", "-accel", accelerator(self.probe_kernel),
            "-m", str(self.ram_mib), "-smp", "1", "-nodefaults", "-display", "none", "-vga", "none",
            "-serial", f"file:{self.console_log}", "-monitor", "stdio",
            "-fw_cfg", f"name=etc/sercon-port,file={self.directory / 'sercon.bin'}",
            "-drive", f"file={self.disk},format=raw,if=none,id=d0,cache=none,aio=threads",
            "-device", f"nvme,drive=d0,serial={self.disk_serial}",
            "-drive", cd_drive, "-device", "ide-cd,drive=cd0",
            "-netdev", f"user,id=n0,tftp={self.tftp_dir},bootfile={BOOT_FILE}",
            "-device", f"virtio-net-pci,netdev=n0,mac={self.mac}",
            "-boot", order,
        ]

    def power_on(self, *, boot: str, once: bool = False, chain_script: str | None = None,
                 cd_file: str | None = None) -> None:
        """Start QEMU booting `boot` (Pxe, Hdd, Cd). chain_script: the VM's DHCP boot file (what iPXE runs);
        None leaves the TFTP directory empty (nothing answers the boot). cd_file: the inserted virtual media."""
        if not qemu_available():
            raise VMError(f"{QEMU} is not installed (Debian: qemu-system-x86, ipxe-qemu)")
        with self._lock:
            self._kill(self.proc)
            for stale in self.tftp_dir.glob("*"):  # none where the VM has no TFTP (a KubeVirt guest)
                stale.unlink()
            if chain_script is not None:
                (self.tftp_dir / BOOT_FILE).write_text(chain_script)
            self.cd_image.unlink(missing_ok=True)
            if cd_file:
                shutil.copyfile(cd_file, self.cd_image)  # the BMC's copy may be ejected while the VM reads it
            self.console_log.write_bytes(b"")  # one boot per log: what a test or a person reads is this boot
            # The VM dies with the lab (its controller thread, which starts it): no QEMU left behind by a killed test.
            setpriv = shutil.which("setpriv")
            guard = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
            with open(self.qemu_log, "ab") as out:
                self.proc = subprocess.Popen(guard + self.command(boot=boot, once=once, cd=bool(cd_file)),
                                             cwd=self.directory,
                                             stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            self.started_at, self.boot = time.monotonic(), boot
        log.info("%s: VM powered on (boot %s%s, pid %s)", self.name, boot, " once" if once else "", self.proc.pid)

    def power_off(self, *, graceful: bool = False) -> None:
        """ForceOff: the process is killed now. GracefulShutdown: the ACPI power button, then killed after the
        grace period if the guest has not powered off (firmware and iPXE ignore the button)."""
        with self._lock:
            proc, self.proc = self.proc, None
            if proc is None or proc.poll() is not None:
                return
        if not graceful:
            self._kill(proc)
            return
        try:
            proc.stdin.write(b"system_powerdown\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        threading.Thread(target=self._reap, args=(proc,), name=f"vm-off-{self.name}", daemon=True).start()

    def _reap(self, proc: subprocess.Popen) -> None:
        try:
            proc.wait(self.grace_s)
        except subprocess.TimeoutExpired:
            self._kill(proc)

    def _kill(self, proc: subprocess.Popen | None) -> None:
        if proc is None:
            return
        if proc.poll() is None:
            try:
                proc.kill()
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass

    def exited_by_itself(self) -> bool:
        """True once when the VM's process ended without the BMC asking (the guest powered off, or QEMU died):
        the BMC must then show Off. (A VM the BMC powers off is no longer self.proc by then.)"""
        with self._lock:
            proc = self.proc
            if proc is None or proc.poll() is None:
                return False
            self.proc = None
        if proc.stdin:
            proc.stdin.close()
        log.info("%s: VM powered off by itself (QEMU exit %s)", self.name, proc.returncode)
        return True


def site_manifests(image_url: str, checksum: str, *, image: str = "vmetal-os",
                   addresses: str = "10.0.2.50-10.0.2.99") -> str:
    """The OSImage a lab VM installs (the OS image lab/vmimage.py builds, served by the console) and the servers'
    NodeEnvironment on QEMU's user-mode net (10.0.2.0/24, the host at 10.0.2.2, its DNS at 10.0.2.3)."""
    return f"""\
apiVersion: management.loft.sh/v1
kind: OSImage
metadata:
  name: {image}
spec:
  displayName: vMetal OS (lab VM image)
  format: raw
  properties:
    metal3.vcluster.com/image-url: {image_url}
    metal3.vcluster.com/image-checksum: {checksum}
    metal3.vcluster.com/image-checksum-type: sha256
---
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata:
  name: servers
  namespace: p-default
spec:
  providerRef: metal3
  properties:
    metal3.vcluster.com/network-cidr: {GUEST_HOST}/24
    metal3.vcluster.com/network-ip-range: {addresses}
    metal3.vcluster.com/dns-servers: 10.0.2.3
"""
