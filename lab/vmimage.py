"""Build the lab's VM artefacts from Debian packages: the agent ramdisk, its virtual-media ISO and a small OS image.

    python -m lab.vmimage ramdisk|os-image|iso|all [--out DIR]

Like Ironic's ramdisk builder, from a fixed list of Debian packages (`apt-get download`, `dpkg-deb -x`; no root,
no chroot, no loop mounts):

- ramdisk: Debian's kernel (`linux-image-amd64`, resolved to its versioned package) and an initramfs (cpio newc,
  uncompressed: see write_cpio) with busybox-static as /init's shell and DHCP client, python3.11-minimal with the
  part of the standard library the agent uses (bytecode only; each agent module is imported by the image's own
  Python at build time), pycdlib, nvme-cli, hdparm and util-linux's rtcwake, the shared libraries they need
  (every ELF's DT_NEEDED is checked at build time), the kernel modules for virtio NICs, NVMe and CD-ROMs (loaded
  in dependency order read from each module's own `depends=`), and the agent package. /init (lab/vmguest/init)
  starts `python3 -m agent --allow-reboot` with the boot configuration from the kernel command line (iPXE) or
  VMETAL.CFG on a CD (virtual media), and powers off when the agent leaves without a reboot. `vmetal.selftest`
  on the command line prints the inventory, `nvme id-ctrl` and a `nvme format --ses=1` instead.
- iso: the same kernel and initrd behind isolinux (El Torito, made with pycdlib) for redfish-virtualmedia hosts;
  hosts/boot/media.py assembles it, and the console's per-boot ISO embeds it the same way when the agent's
  isolinux files sit beside its kernel in IMAGE_DIR/agent.
- os-image: a raw disk image (isohybrid: an MBR with one partition, isolinux, the kernel and an OS initramfs)
  that boots from an NVMe disk under SeaBIOS; its first-boot service (lab/vmguest/firstboot.py) reads the
  NoCloud seed the agent wrote, configures the network and joins the tenant with the bootstrap token. With it:
  its sha256 (the OSImage's checksum) and a qcow2 when qemu-img is there.

Everything is cached by content: the key covers the package list, the resolved versions, the agent's sources, the
guest files and this script. Outputs go to $VM_IMAGE_CACHE/<key>/ (default ~/.cache/vmetal/vm-images) and are
reused when present; downloaded packages are kept in $VM_IMAGE_CACHE/debs. `--out DIR` copies them in the layout
the console serves from IMAGE_DIR: DIR/agent/{vmlinuz,initrd,isolinux.bin,ldlinux.c32}, DIR/agent.iso,
DIR/vmetal-os.img (+ .sha256, .qcow2).
"""
from __future__ import annotations

import argparse
import compileall
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hosts.boot.media import BootFiles, bootable_iso

log = logging.getLogger("lab.vmimage")

ROOT = Path(__file__).resolve().parent.parent
GUEST = Path(__file__).resolve().parent / "vmguest"
KERNEL_META = "linux-image-amd64"
# Shared by both images: the shell, Python and the libraries Python's extension modules need.
BASE_PACKAGES = [
    "busybox-static", "python3.11-minimal", "libpython3.11-minimal", "libpython3.11-stdlib", "python3-pycdlib",
    "libc6", "libgcc-s1", "zlib1g", "libexpat1", "libssl3", "libffi8", "libbz2-1.0", "liblzma5", "libuuid1",
]
AGENT_PACKAGES = ["nvme-cli", "libnvme1", "libjson-c5", "libdbus-1-3", "libsystemd0", "libcap2", "libgcrypt20",
                  "libgpg-error0", "liblz4-1", "libzstd1", "hdparm", "util-linux"]
OS_PACKAGES = ["python3-yaml", "libyaml-0-2"]
BOOT_PACKAGES = ["isolinux", "syslinux-common"]
# The agent's tools, as the packages install them (util-linux: only what the agent calls).
AGENT_PROGRAMS = ["usr/sbin/nvme", "sbin/hdparm", "usr/sbin/rtcwake"]
# Kernel modules (Debian builds these as modules; their dependencies come along): virtio and e1000 NICs, NVMe,
# CD-ROMs on IDE (pc) and AHCI (q35), ISO 9660.
MODULES = ["virtio_pci", "virtio_net", "e1000", "virtio_blk", "nvme", "ata_piix", "ahci", "sr_mod", "isofs"]
# The standard library minus what a headless ramdisk never imports (saves ~40% of it).
STDLIB_DROP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "distutils", "venv", "sqlite3",
               "dbm", "curses", "pydoc_data", "unittest", "turtle.py", "config-3.11-x86_64-linux-gnu", "__phello__",
               "site-packages", "dist-packages", "asyncio", "xmlrpc", "wsgiref", "multiprocessing", "_pydecimal.py",
               "pydoc.py", "doctest.py", "mailbox.py", "imaplib.py", "nntplib.py", "smtplib.py", "ftplib.py",
               "tomllib", "xml", "msilib", "lib-tk", "_pyio.py", "pdb.py"}
DYNLOAD_DROP = ("_test", "_xx", "xx", "_curses", "readline", "_sqlite3", "_dbm", "_gdbm", "nis", "_crypt",
                "_tkinter", "audioop", "ossaudiodev", "_ctypes_test", "_lsprof", "_codecs_", "_asyncio",
                "_multiprocessing", "_posixshmem", "_decimal", "_multibytecodec")
# Codecs: what Python's startup, the file system, JSON, HTTP and ISO 9660 names (Joliet: UTF-16) use.
ENCODINGS_KEEP = {"__init__", "aliases", "ascii", "latin_1", "utf_8", "utf_8_sig", "utf_16", "utf_16_be",
                  "utf_16_le", "utf_32", "idna", "punycode", "raw_unicode_escape", "unicode_escape", "cp437", "hex_codec",
                  "base64_codec"}
LIB_DIRS = ("lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu")
ALWAYS_LIBS = ["libgcc_s.so.1"]  # dlopened by glibc when a thread exits, never in a DT_NEEDED
AGENT_FILES = ["agent"]
OS_AGENT_FILES = ["agent/__init__.py", "agent/seed.py", "agent/disks.py", "agent/hardware.py"]  # the seed reader
TARGETS = ("ramdisk", "iso", "os-image")
KEEP_BUILDS = 3
OS_IMAGE = "vmetal-os.img"
KERNEL_ARGS = "console=ttyS0 quiet"


class BuildError(Exception):
    """A step of the build failed: a package that cannot be resolved or fetched, a missing library."""


# -- packages ---------------------------------------------------------------------------------------------------


def _run(argv: list[str], **kwargs) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    except OSError as exc:
        raise BuildError(f"{argv[0]}: {exc.strerror}") from None
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(argv[:3])}… exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return proc.stdout


def apt_options(cache: Path) -> list[str]:
    """apt-cache with its binary package cache kept in ours: without one (Debian's container images turn it off)
    every call parses all the package lists again, 3 s or more here."""
    (cache / "apt").mkdir(parents=True, exist_ok=True)
    return ["-o", f"Dir::Cache::pkgcache={cache / 'apt/pkgcache.bin'}",
            "-o", f"Dir::Cache::srcpkgcache={cache / 'apt/srcpkgcache.bin'}"]


def resolve_versions(packages: list[str], cache: Path) -> tuple[str, dict[str, str]]:
    """(the versioned kernel package `linux-image-amd64` depends on, {package: candidate version}) from one
    apt-cache call; a package apt does not know is an error."""
    out = _run(["apt-cache", *apt_options(cache), "show", "--no-all-versions", KERNEL_META, *packages])
    versions, kernel = {}, None
    name = None
    for line in out.splitlines():
        if line.startswith("Package: "):
            name = line.split(": ", 1)[1].strip()
        elif line.startswith("Version: ") and name:
            versions.setdefault(name, line.split(": ", 1)[1].strip())
        elif (line.startswith("Depends: ") and name == KERNEL_META
              and (match := re.search(r"(linux-image-[0-9][^\s,]*)\s*\(=\s*([^)\s]+)\)", line))):
            kernel = match.group(1)
            versions[kernel] = match.group(2)
    if kernel is None:
        raise BuildError(f"apt-cache show {KERNEL_META}: no versioned linux-image package in its Depends")
    missing = [p for p in packages if p not in versions]
    if missing:
        raise BuildError(f"apt-cache knows no candidate for {', '.join(missing)} (apt-get update?)")
    versions.pop(KERNEL_META, None)
    return kernel, versions


def fetch(versions: dict[str, str], debs_dir: Path) -> dict[str, Path]:
    """The .deb of each package at its version, downloaded into debs_dir unless already there."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    found, wanted = {}, []
    for name, version in versions.items():
        matches = sorted(debs_dir.glob(f"{name}_{version.replace(':', '%3a')}_*.deb"))
        if matches:
            found[name] = matches[0]
        else:
            wanted.append(f"{name}={version}")
    if wanted:
        log.info("downloading %d packages", len(wanted))
        _run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *wanted], cwd=debs_dir, timeout=900)
        return fetch(versions, debs_dir)
    return found


def extract(debs: dict[str, Path], into: Path) -> None:
    for deb in debs.values():
        _run(["dpkg-deb", "-x", str(deb), str(into)])


# -- ELF and kernel modules -------------------------------------------------------------------------------------


def elf_needed(path: Path) -> list[str] | None:
    """DT_NEEDED sonames of an ELF64 file (None when it is not one), read from its .dynamic section."""
    with open(path, "rb") as fh:
        head = fh.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        fh.seek(shoff)
        table = fh.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        needed = []
        for _, sh_type, _, _, offset, size, link, _, _, _ in sections:
            if sh_type != 6:  # SHT_DYNAMIC
                continue
            strtab = sections[link]
            fh.seek(strtab[4])
            strings = fh.read(strtab[5])
            fh.seek(offset)
            dynamic = fh.read(size)
            for i in range(0, len(dynamic), 16):
                tag, value = struct.unpack_from("<qQ", dynamic, i)
                if tag == 0:
                    break
                if tag == 1:  # DT_NEEDED
                    needed.append(strings[value:strings.index(b"\0", value)].decode())
        return needed


def module_index(modules_dir: Path) -> dict[str, Path]:
    return {p.name[:-3].replace("-", "_"): p for p in modules_dir.rglob("*.ko")}


def module_order(names: list[str], index: dict[str, Path]) -> list[Path]:
    """The modules and everything they depend on (each module's own `depends=`), dependencies first."""
    order: list[Path] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        if name not in index:
            raise BuildError(f"kernel module {name} not in the kernel package (built in?)")
        match = re.search(rb"(?:^|\0)depends=([^\0]*)\0", index[name].read_bytes())
        for dep in (match.group(1).decode().split(",") if match and match.group(1) else []):
            visit(dep)
        order.append(index[name])

    for name in names:
        visit(name)
    return order


# -- the initramfs ----------------------------------------------------------------------------------------------


def write_cpio(root: Path, out: Path) -> None:
    """root as a cpio newc archive owned by root (the build itself needs no root). Uncompressed on purpose: under
    TCG the kernel took ~6 s to gunzip a 14 MiB initramfs and reached /init 6.5 s later than with the plain 35
    MiB archive, which the console hands out over its own network in less."""
    entries = sorted(root.rglob("*"), key=lambda p: str(p.relative_to(root)))
    with open(out, "wb") as fh:
        for ino, path in enumerate(entries, start=1):
            st = path.lstat()
            name = str(path.relative_to(root)).encode() + b"\0"
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(path).encode()
            elif stat.S_ISREG(st.st_mode):
                data = path.read_bytes()
            else:
                data = b""
            _cpio_entry(fh, name, ino, st.st_mode, len(data), int(st.st_mtime))
            fh.write(data + b"\0" * (-len(data) % 4))
        _cpio_entry(fh, b"TRAILER!!!\0", 0, 0, 0, 0)


def _cpio_entry(out, name: bytes, ino: int, mode: int, size: int, mtime: int) -> None:
    nlink = 2 if stat.S_ISDIR(mode) else 1
    header = b"070701" + b"".join(b"%08X" % v for v in (ino, mode, 0, 0, nlink, mtime, size, 0, 0, 0, 0,
                                                         len(name), 0))
    out.write(header + name + b"\0" * (-(len(header) + len(name)) % 4))


@dataclass
class Tree:
    """The initramfs being assembled in a directory (merged /usr: /bin, /sbin, /lib, /lib64 are links)."""

    sysroot: Path
    root: Path
    libs: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        for d in ("usr/bin", "usr/sbin", "usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/local/sbin", "etc/vmetal",
                  "proc", "sys", "dev", "tmp", "run", "mnt/cd", "root", "opt/vmetal"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for link in ("bin", "sbin", "lib", "lib64"):
            (self.root / link).symlink_to(f"usr/{link}")

    def dest(self, rel: str) -> Path:
        rel = rel.lstrip("/")
        if not rel.startswith("usr/") and rel.split("/", 1)[0] in ("bin", "sbin", "lib", "lib64"):
            rel = f"usr/{rel}"
        return self.root / rel

    def copy(self, rel: str, dest: str | None = None) -> Path:
        """A file or tree of the sysroot into the initramfs (symlinks kept as links)."""
        src = self.sysroot / rel.lstrip("/")
        if not src.exists() and not src.is_symlink():
            raise BuildError(f"{rel} is not in the extracted packages")
        target = self.dest(dest or rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, target, follow_symlinks=False)
        return target

    def put(self, rel: str, data: bytes | str, mode: int = 0o644) -> None:
        target = self.dest(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)

    def add_library(self, soname: str) -> None:
        if soname in self.libs:
            return
        for d in LIB_DIRS:
            src = self.sysroot / d / soname
            if src.exists():
                self.libs.add(soname)
                self.copy(f"{d}/{soname}", f"usr/lib/x86_64-linux-gnu/{soname}")
                if src.is_symlink():  # the soname link and the file it names
                    self.copy(f"{d}/{os.path.basename(os.readlink(src))}",
                              f"usr/lib/x86_64-linux-gnu/{os.path.basename(os.readlink(src))}")
                return
        raise BuildError(f"shared library {soname} is in none of the packages: add its package to the list")

    def resolve_libraries(self) -> None:
        """Every ELF file's DT_NEEDED, transitively, from the packages; a missing one fails the build."""
        loader = "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"  # PT_INTERP is /lib64/…: a link to the real file
        shutil.copy2(self.sysroot / loader, self.dest(loader))
        (self.root / "usr/lib64/ld-linux-x86-64.so.2").symlink_to(f"../{loader}")
        for soname in ALWAYS_LIBS:
            self.add_library(soname)
        while True:
            before = len(self.libs)
            for path in list(self.root.rglob("*")):
                if path.is_file() and not path.is_symlink() and path.suffix not in (".py", ".pyc", ".ko"):
                    for soname in elf_needed(path) or []:
                        if soname != "ld-linux-x86-64.so.2":
                            self.add_library(soname)
            if len(self.libs) == before:
                return


def python_tree(tree: Tree) -> None:
    """python3.11 with the trimmed standard library, bytecode precompiled (a TCG guest compiles slowly)."""
    tree.copy("usr/bin/python3.11")
    (tree.root / "usr/bin/python3").symlink_to("python3.11")
    stdlib = tree.sysroot / "usr/lib/python3.11"
    for entry in sorted(stdlib.iterdir()):
        if entry.name in STDLIB_DROP:
            continue
        if entry.name == "encodings":
            for codec in sorted(entry.glob("*.py")):
                if codec.stem in ENCODINGS_KEEP:
                    tree.copy(f"usr/lib/python3.11/encodings/{codec.name}")
            continue
        if entry.name == "lib-dynload":
            for ext in sorted(entry.iterdir()):
                if not ext.name.startswith(DYNLOAD_DROP):
                    tree.copy(f"usr/lib/python3.11/lib-dynload/{ext.name}")
            continue
        tree.copy(f"usr/lib/python3.11/{entry.name}")
    for rel in ("usr/lib/python3/dist-packages/pycdlib",):
        tree.copy(rel)


def precompile(tree: Tree) -> None:
    """Bytecode for everything Python in the tree, made by this interpreter when it is 3.11 (the guest's): a TCG
    guest compiles slowly. The libraries keep only their bytecode (a smaller initramfs unpacks faster); the
    project's own files keep their sources beside it, for tracebacks."""
    if sys.version_info[:2] != (3, 11):
        log.warning("python %d.%d builds no 3.11 bytecode: the guest compiles on import (slower boot)",
                    *sys.version_info[:2])
        return
    mode = compileall.py_compile.PycInvalidationMode.UNCHECKED_HASH
    for d in ("usr/lib/python3.11", "usr/lib/python3/dist-packages"):
        if (tree.root / d).exists():
            if not compileall.compile_dir(str(tree.root / d), quiet=1, workers=0, ddir=f"/{d}", legacy=True,
                                          invalidation_mode=mode):
                raise BuildError(f"compiling /{d} failed")
            for source in (tree.root / d).rglob("*.py"):
                source.unlink()
    compileall.compile_dir(str(tree.root / "opt/vmetal"), quiet=1, workers=0, ddir="/opt/vmetal",
                           invalidation_mode=mode)


def check_imports(tree: Tree, modules: list[str]) -> None:
    """Import `modules` with the image's own Python and libraries, run here through the image's loader: a module
    the trimmed standard library or a missing library breaks fails the build, not the boot."""
    usr = tree.root / "usr"
    argv = [str(usr / "lib64/ld-linux-x86-64.so.2"), "--library-path", str(usr / "lib/x86_64-linux-gnu"),
            str(usr / "bin/python3.11"), "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)",
            *modules]
    env = {"PYTHONHOME": str(usr), "PYTHONPATH": str(tree.root / "opt/vmetal"), "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": os.environ.get("PATH", "")}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    if proc.returncode != 0:
        raise BuildError(f"the image's python cannot import its modules: {proc.stderr.strip()[-800:]}")


def agent_modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                  for p in (ROOT / "agent").rglob("*.py") if "__pycache__" not in p.parts and p.name != "__main__.py")


def guest_common(tree: Tree, role: str, kernel_version: str, modules: list[Path]) -> None:
    tree.copy("bin/busybox")
    (tree.root / "usr/bin/sh").symlink_to("busybox")  # /init's interpreter; the other applets are linked by /init
    tree.put("init", (GUEST / "init").read_text(), 0o755)
    tree.put("etc/udhcpc.script", (GUEST / "udhcpc.script").read_text(), 0o755)
    tree.put("usr/local/sbin/reboot", (GUEST / "reboot").read_text(), 0o755)
    tree.put("etc/vmetal/role", role + "\n")
    tree.put("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
    tree.put("etc/group", "root:x:0:\n")
    tree.put("etc/hosts", "127.0.0.1 localhost\n")
    base = f"lib/modules/{kernel_version}"
    listed = []
    for module in modules:
        rel = str(module.relative_to(tree.sysroot))
        tree.copy(rel)
        listed.append(rel[len(base) + 1:] if rel.startswith(base) else rel)
    tree.put("etc/vmetal/modules", "".join(f"{kernel_version}/{m}\n" for m in listed))
    python_tree(tree)


def copy_sources(tree: Tree, paths: list[str]) -> None:
    for rel in paths:
        src = ROOT / rel
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*.py") if "__pycache__" not in p.parts)
        for f in files:
            tree.put(f"opt/vmetal/{f.relative_to(ROOT)}", f.read_bytes())


# -- the build --------------------------------------------------------------------------------------------------


def source_files() -> list[Path]:
    agent = sorted(p for p in (ROOT / "agent").rglob("*.py") if "__pycache__" not in p.parts)
    guest = sorted(p for p in GUEST.iterdir() if p.is_file() and p.suffix != ".pyc")
    return [Path(__file__).resolve(), ROOT / "hosts/boot/media.py", *agent, *guest]


def cache_key(versions: dict[str, str]) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({"versions": versions, "modules": MODULES, "python": sys.version_info[:2]},
                             sort_keys=True).encode())
    for path in source_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("VM_IMAGE_CACHE") or "~/.cache/vmetal/vm-images").expanduser()


@dataclass
class Build:
    key: str
    directory: Path
    versions: dict[str, str]
    kernel_version: str
    built: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def files(self) -> dict[str, Path]:
        names = {"vmlinuz": "vmlinuz", "initrd": "initrd", "os_initrd": "os-initrd", "iso": "agent.iso",
                 "isolinux": "isolinux.bin", "ldlinux": "ldlinux.c32", "os_image": OS_IMAGE,
                 "os_image_sha256": f"{OS_IMAGE}.sha256", "os_qcow2": "vmetal-os.qcow2"}
        return {k: self.directory / v for k, v in names.items() if (self.directory / v).exists()}


OUTPUTS = {"ramdisk": ["vmlinuz", "initrd", "isolinux.bin", "ldlinux.c32"], "iso": ["agent.iso"],
           "os-image": [OS_IMAGE, f"{OS_IMAGE}.sha256"]}


def build(targets: list[str], *, cache: Path | None = None) -> Build:
    """Build what `targets` need that the cache does not hold yet; returns where the artefacts are."""
    started = time.monotonic()
    cache = cache or cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    kernel, versions = resolve_versions([*BASE_PACKAGES, *AGENT_PACKAGES, *OS_PACKAGES, *BOOT_PACKAGES], cache)
    key = cache_key(versions)
    directory = cache / key
    result = Build(key=key, directory=directory, versions=versions,
                   kernel_version=kernel.removeprefix("linux-image-"))
    wanted = [t for t in TARGETS if t in targets or (t == "ramdisk" and "iso" in targets)]
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test workers building at once: the second waits, then reuses
        missing = [t for t in wanted if not all((directory / n).exists() for n in OUTPUTS[t])]
        result.reused = [t for t in wanted if t not in missing]
        if missing:
            directory.mkdir(parents=True, exist_ok=True)
            debs = fetch(versions, cache / "debs")
            with tempfile.TemporaryDirectory(prefix="vmimage-", dir=cache) as work:
                sysroot = Path(work) / "sysroot"
                sysroot.mkdir()
                extract(debs, sysroot)
                for target in missing:
                    BUILDERS[target](result, sysroot, Path(work))
                    result.built.append(target)
            (directory / "manifest.json").write_text(json.dumps(
                {"key": key, "kernel": kernel, "versions": versions, "modules": MODULES}, indent=2, sort_keys=True))
            prune(cache, keep=directory)
        else:
            os.utime(directory)  # recently used: the last to be pruned
    result.seconds = time.monotonic() - started
    return result


def prune(cache: Path, keep: Path, builds: int = KEEP_BUILDS) -> None:
    """Old builds beyond the newest `builds` (each ~150 MiB) go; so do packages no recent build named."""
    done = sorted((d for d in cache.iterdir() if (d / "manifest.json").exists() and d != keep),
                  key=lambda d: d.stat().st_mtime, reverse=True)
    for old in done[builds - 1:]:
        shutil.rmtree(old, ignore_errors=True)
        (cache / f"{old.name}.lock").unlink(missing_ok=True)
    named = set()
    for d in [keep, *done[:builds - 1]]:
        try:
            named.update(f"{n}_{v.replace(':', '%3a')}_" for n, v in
                         json.loads((d / "manifest.json").read_text())["versions"].items())
        except (OSError, ValueError, KeyError):
            return  # unreadable: keep every package rather than guess
    for deb in (cache / "debs").glob("*.deb"):
        if not any(deb.name.startswith(prefix) for prefix in named):
            deb.unlink()


def _publish(result: Build, name: str, data_path: Path) -> None:
    """Into the cache dir atomically: a reader never sees half a file."""
    os.replace(data_path, result.path(name))


def build_ramdisk(result: Build, sysroot: Path, work: Path) -> None:
    tree = Tree(sysroot, work / "ramdisk")
    modules = module_order(MODULES, module_index(sysroot / "lib/modules" / result.kernel_version))
    guest_common(tree, "agent", result.kernel_version, modules)
    for program in AGENT_PROGRAMS:
        tree.copy(program)
    copy_sources(tree, AGENT_FILES)
    tree.put("opt/vmetal/writebench.py", (GUEST / "writebench.py").read_bytes())  # bench/vm.py's write benchmark
    tree.resolve_libraries()
    precompile(tree)
    check_imports(tree, [*agent_modules(), "pycdlib", "ssl", "hashlib"])
    write_cpio(tree.root, work / "initrd")
    shutil.copy2(sysroot / f"boot/vmlinuz-{result.kernel_version}", work / "vmlinuz")
    shutil.copy2(sysroot / "usr/lib/ISOLINUX/isolinux.bin", work / "isolinux.bin")
    shutil.copy2(sysroot / "usr/lib/syslinux/modules/bios/ldlinux.c32", work / "ldlinux.c32")
    for name in ("initrd", "vmlinuz", "isolinux.bin", "ldlinux.c32"):
        _publish(result, name, work / name)


def boot_files(result: Build) -> BootFiles:
    return BootFiles(kernel=result.path("vmlinuz"), initrd=result.path("initrd"),
                     isolinux=result.path("isolinux.bin"), ldlinux=result.path("ldlinux.c32"))


def build_iso(result: Build, sysroot: Path, work: Path) -> None:
    with open(work / "agent.iso", "wb") as out:
        bootable_iso(boot_files(result), out, kernel_args=KERNEL_ARGS)
    _publish(result, "agent.iso", work / "agent.iso")


def build_os_image(result: Build, sysroot: Path, work: Path) -> None:
    tree = Tree(sysroot, work / "os")
    modules = module_order(MODULES, module_index(sysroot / "lib/modules" / result.kernel_version))
    guest_common(tree, "os", result.kernel_version, modules)
    tree.copy("usr/lib/python3/dist-packages/yaml")
    tree.copy("usr/lib/python3/dist-packages/_yaml")
    copy_sources(tree, OS_AGENT_FILES)
    tree.put("opt/vmetal/firstboot.py", (GUEST / "firstboot.py").read_bytes())
    tree.resolve_libraries()
    precompile(tree)
    check_imports(tree, ["firstboot", "agent.seed", "pycdlib", "yaml", "ssl"])
    write_cpio(tree.root, work / "os-initrd")
    files = BootFiles(kernel=sysroot / f"boot/vmlinuz-{result.kernel_version}", initrd=work / "os-initrd",
                      isolinux=sysroot / "usr/lib/ISOLINUX/isolinux.bin",
                      ldlinux=sysroot / "usr/lib/syslinux/modules/bios/ldlinux.c32")
    with open(work / OS_IMAGE, "wb") as out:
        bootable_iso(files, out, kernel_args=KERNEL_ARGS, volume="VMETAL_OS", hybrid=True)
    digest = hashlib.sha256()
    with open(work / OS_IMAGE, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    (work / f"{OS_IMAGE}.sha256").write_text(f"{digest.hexdigest()}  {OS_IMAGE}\n")
    if shutil.which("qemu-img"):
        _run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(work / OS_IMAGE), str(work / "vmetal-os.qcow2")])
        _publish(result, "vmetal-os.qcow2", work / "vmetal-os.qcow2")
    for name in ("os-initrd", OS_IMAGE, f"{OS_IMAGE}.sha256"):
        _publish(result, name, work / name)


BUILDERS = {"ramdisk": build_ramdisk, "iso": build_iso, "os-image": build_os_image}


def copy_out(result: Build, out: Path) -> list[Path]:
    """The artefacts in the layout the console serves from IMAGE_DIR."""
    layout = {"vmlinuz": "agent/vmlinuz", "initrd": "agent/initrd", "isolinux.bin": "agent/isolinux.bin",
              "ldlinux.c32": "agent/ldlinux.c32", "agent.iso": "agent.iso", OS_IMAGE: OS_IMAGE,
              f"{OS_IMAGE}.sha256": f"{OS_IMAGE}.sha256", "vmetal-os.qcow2": "vmetal-os.qcow2"}
    written = []
    for name, rel in layout.items():
        if result.path(name).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(result.path(name), out / rel)
            written.append(out / rel)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.vmimage", description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=[*TARGETS, "all"])
    parser.add_argument("--out", type=Path, help="copy the artefacts here (IMAGE_DIR layout)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = build(list(TARGETS) if args.target == "all" else [args.target])
    except BuildError as exc:
        print(f"vmimage: {exc}", file=sys.stderr)
        return 1
    print(f"cache {result.directory} (key {result.key}, kernel {result.kernel_version})")
    print(f"built: {', '.join(result.built) or 'nothing'}; reused: {', '.join(result.reused) or 'nothing'}; "
          f"{result.seconds:.1f} s")
    for name, path in sorted(result.files.items()):
        print(f"  {path.name:<22} {path.stat().st_size / 2**20:8.1f} MiB")
    if args.out:
        for path in copy_out(result, args.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
