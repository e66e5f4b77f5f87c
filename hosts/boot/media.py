"""Bootable ISO 9660 images made with pycdlib: isolinux (El Torito), a kernel and an initramfs."""
# Bootable ISO 9660 images made with pycdlib: isolinux (El Torito, no emulation), a kernel and an initramfs.
#
# No Django here: the console's per-boot virtual-media ISO (hosts/boot/ramdisk.py boot_iso) and the lab's image builder
# (lab/vmimage.py: the agent's ISO and the OS disk image, an isohybrid) assemble their media with it.
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

# isolinux finds its configuration at /isolinux/isolinux.cfg; ISO level-1 names with Rock Ridge names beside them.
ISOLINUX_DIR = "/ISOLINUX"
FILES = {  # role: (ISO 9660 path, Rock Ridge name)
    "isolinux": ("/ISOLINUX/ISOLINUX.BIN;1", "isolinux.bin"),
    "ldlinux": ("/ISOLINUX/LDLINUX.C32;1", "ldlinux.c32"),
    "kernel": ("/VMLINUZ.;1", "vmlinuz"),
    "initrd": ("/INITRD.;1", "initrd"),
}
CONFIG = ("/ISOLINUX/ISOLINUX.CFG;1", "isolinux.cfg")
BOOT_CATALOG = ("/ISOLINUX/BOOT.CAT;1", "boot.cat")


@dataclass
class BootFiles:
    """What a boot needs: the kernel and initramfs, and isolinux's boot sector and its ldlinux.c32."""

    kernel: Path
    initrd: Path
    isolinux: Path
    ldlinux: Path

    @classmethod
    def in_directory(cls, directory: Path) -> BootFiles:
        return cls(kernel=directory / "vmlinuz", initrd=directory / "initrd", isolinux=directory / "isolinux.bin",
                   ldlinux=directory / "ldlinux.c32")

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.kernel, self.initrd, self.isolinux, self.ldlinux))


def isolinux_config(kernel_args: str) -> str:
    return (f"DEFAULT vmetal\nPROMPT 0\nTIMEOUT 0\nLABEL vmetal\n  KERNEL /vmlinuz\n"
            f"  APPEND initrd=/initrd {kernel_args}\n")


def bootable_iso(files: BootFiles, out: BinaryIO, *, kernel_args: str, volume: str = "VMETAL_AGENT",
                 extra: dict[str, bytes] | None = None, hybrid: bool = False) -> None:
    """Write to `out` an ISO that boots `files` with `kernel_args`. extra: {"/NAME.EXT;1": data} (level-1 names,
    e.g. VMETAL.CFG). hybrid: also an MBR with one partition (isohybrid), so the image boots written to a disk."""
    import pycdlib  # a third-party library, loaded where an ISO is made only

    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident=volume, rock_ridge="1.09")
    with contextlib.ExitStack() as stack:
        iso.add_directory(ISOLINUX_DIR, rr_name="isolinux")
        for role, (path, rr_name) in FILES.items():
            source: Path = getattr(files, role)
            fh = stack.enter_context(open(source, "rb"))
            iso.add_fp(fh, source.stat().st_size, path, rr_name=rr_name)
        config = isolinux_config(kernel_args).encode()
        iso.add_fp(io.BytesIO(config), len(config), CONFIG[0], rr_name=CONFIG[1])
        for path, data in (extra or {}).items():
            iso.add_fp(io.BytesIO(data), len(data), path, rr_name=path.lstrip("/").split(";")[0].lower())
        iso.add_eltorito(FILES["isolinux"][0], bootcatfile=BOOT_CATALOG[0], rr_bootcatname=BOOT_CATALOG[1],
                         boot_load_size=4, boot_info_table=True)
        if hybrid:
            iso.add_isohybrid()
        iso.write_fp(out)
    iso.close()
