"""`write_image`: stream an OS image over HTTP onto the root disk, verifying its checksum on the way.

Raw images go straight to the disk in chunks; the checksum is computed over the same chunks
as they are written, so nothing is read twice. qcow2 images are streamed to a temporary
file (checksummed the same way) and converted onto the disk with `qemu-img convert`.
A failed write (checksum mismatch, broken download, failed conversion) zeroes the first and
last MiB of the disk (partition tables, boot code, GPT backup), so no half-written image can boot.
"""
from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

from typing import Callable

from agent import client
from agent.client import direct_opener
from agent.commands.base import CommandError, Context, require
from agent.disks import MiB, DiskError, choose_root_disk, write_all, zero_regions
from agent.hardware import Disk

log = logging.getLogger("agent.image")

CHUNK = 1 * MiB
CHECKSUM_TYPES = {32: "md5", 64: "sha256", 128: "sha512"}  # by hex length, as Metal3 auto-detects
DOWNLOAD_ATTEMPTS = 4  # a dropped connection resumes with a Range request
DOWNLOAD_TIMEOUT_S = 60
RETRY_BASE_S = 1.0
WIPE_BYTES = 1 * MiB  # MBR, GPT and boot code sit before the first partition, which starts at 1 MiB
_QEMU_PROGRESS = re.compile(rb"\((\d+(?:\.\d+)?)/100%\)")


def write_image(args: dict, ctx: Context) -> dict:
    url = require(args, "url", "write_image")
    fmt = args.get("format") or "raw"
    if fmt not in ("raw", "qcow2"):
        raise CommandError(f"write_image: unsupported image format {fmt!r} (raw or qcow2)")
    expected, checksum_type = resolve_checksum(url, require(args, "checksum", "write_image"), args.get("checksum_type"))
    try:
        disk = choose_root_disk(ctx.hardware.disks(), name=args.get("disk"), hints=args.get("root_device_hints"))
    except DiskError as exc:
        raise CommandError(f"write_image: {exc}") from exc
    qemu_img = shutil.which("qemu-img")
    if fmt == "qcow2" and qemu_img is None:
        raise CommandError("write_image: qemu-img is not installed (not on PATH): cannot convert a qcow2 image; use a raw image")

    log.info("writing %s image %s to %s (%s)", fmt, url, disk.name, disk.path)
    started = time.monotonic()
    try:
        if fmt == "raw":
            written, digest = _write_raw(url, disk, checksum_type, ctx.progress, _user_agent(ctx))
            _verify(expected, digest)
        else:
            written = _write_qcow2(url, disk, checksum_type, expected, qemu_img, ctx)
    except CommandError as exc:
        wiped = wipe_image(disk)
        raise CommandError(f"{exc}; zeroed {wiped} bytes at the ends of {disk.name}", {"disk": disk.name}) from exc
    ctx.session["image"] = {"disk": disk.name, "bytes_written": written}
    ctx.progress(100, f"image written to {disk.name}")
    return {
        "disk": disk.name,
        "bytes_written": written,
        "checksum_verified": True,
        "duration_s": round(time.monotonic() - started, 3),
    }


def resolve_checksum(image_url: str, checksum: str, checksum_type: str | None) -> tuple[str, str]:
    """(hex digest, algorithm). `checksum` may be the digest or the URL of a checksum file (as Ironic allows)."""
    checksum = checksum.strip()
    if urllib.parse.urlsplit(checksum).scheme in ("http", "https", "file"):
        checksum = _checksum_from_file(checksum, image_url)
    checksum = checksum.lower()
    if not re.fullmatch(r"[0-9a-f]+", checksum):
        raise CommandError(f"write_image: checksum {checksum!r} is not a hex digest")
    if not checksum_type:
        checksum_type = CHECKSUM_TYPES.get(len(checksum))
        if checksum_type is None:
            raise CommandError(f"write_image: cannot tell the checksum type of a {len(checksum)}-digit digest")
    checksum_type = checksum_type.lower()
    if checksum_type not in CHECKSUM_TYPES.values():
        raise CommandError(f"write_image: unsupported checksum_type {checksum_type!r} (md5, sha256, sha512)")
    if len(checksum) != hashlib.new(checksum_type).digest_size * 2:
        raise CommandError(f"write_image: {checksum!r} is not a {checksum_type} digest")
    return checksum, checksum_type


def _checksum_from_file(checksum_url: str, image_url: str) -> str:
    """The image's digest from a `SHA256SUMS`-style file (`<hex>  <name>`, `<hex> *<name>` or BSD style)."""
    try:
        with direct_opener().open(checksum_url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            text = resp.read(1 * MiB).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        raise CommandError(f"write_image: cannot fetch checksum file {checksum_url}: {exc}") from exc
    name = os.path.basename(urllib.parse.urlsplit(image_url).path)
    digests = []
    for line in text.splitlines():
        line = line.strip()
        bsd = re.fullmatch(r"\w+ \((.+)\) = ([0-9a-fA-F]+)", line)
        if bsd:
            entry, digest = bsd.group(1), bsd.group(2)
        elif line and not line.startswith("#"):
            digest, _, entry = line.partition(" ")
            entry = entry.strip().lstrip("*")
        else:
            continue
        if entry and os.path.basename(entry) == name:
            return digest
        digests.append(digest)
    if len(digests) == 1:
        return digests[0]
    raise CommandError(f"write_image: no checksum for {name} in {checksum_url}")


class _Download:
    """One image download, resumed with a Range request when the connection drops."""

    def __init__(self, url: str, checksum_type: str, sink: Callable[[int, bytes], None], limit: int,
                 progress: Callable[[int | None, str], None], scale: tuple[int, int] = (0, 99),
                 user_agent: str = client.USER_AGENT):
        self.url = url
        self.user_agent = user_agent
        self.checksum_type = checksum_type
        self.sink = sink
        self.limit = limit
        self.progress = progress
        self.scale = scale
        self.hasher = hashlib.new(checksum_type)
        self.offset = 0
        self.total: int | None = None

    def run(self) -> tuple[int, str]:
        opener = direct_opener()
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            request = urllib.request.Request(self.url, headers={"User-Agent": self.user_agent})
            if self.offset:
                request.add_header("Range", f"bytes={self.offset}-")
            try:
                with opener.open(request, timeout=DOWNLOAD_TIMEOUT_S) as resp:
                    self._receive(resp)
                return self.offset, self.hasher.hexdigest()
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise CommandError(f"download of {self.url} failed: HTTP {exc.code} {exc.reason}") from exc
                error = f"HTTP {exc.code}"
            except (OSError, http.client.HTTPException, _Truncated) as exc:
                error = str(exc) or type(exc).__name__
            if attempt == DOWNLOAD_ATTEMPTS:
                raise CommandError(f"download of {self.url} failed after {attempt} attempts at byte {self.offset}: {error}")
            delay = min(RETRY_BASE_S * 2 ** (attempt - 1), 10)
            log.warning("download of %s broke at byte %d (%s): retry %d in %.1fs", self.url, self.offset, error, attempt, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _receive(self, resp) -> None:
        if self.offset and resp.status != 206:
            log.warning("server ignored the Range request: downloading %s again from the start", self.url)
            self.offset, self.hasher = 0, hashlib.new(self.checksum_type)
        length = resp.headers.get("Content-Length")
        if self.total is None and length is not None and length.isdigit():
            self.total = self.offset + int(length)
            if self.total > self.limit:
                raise CommandError(f"image is {self.total} bytes, larger than the target ({self.limit} bytes)")
        while True:
            chunk = resp.read(CHUNK)
            if not chunk:
                break
            if self.offset + len(chunk) > self.limit:
                raise CommandError(f"image is larger than the target ({self.limit} bytes)")
            self.hasher.update(chunk)  # the same bytes that go to the disk: no second read
            try:
                self.sink(self.offset, chunk)
            except OSError as exc:  # the disk failing is not a network hiccup: no retry
                raise CommandError(f"write failed at byte {self.offset}: {exc}") from exc
            self.offset += len(chunk)
            self._report()
        if self.total is not None and self.offset < self.total:
            raise _Truncated(f"connection closed after {self.offset} of {self.total} bytes")

    def _report(self) -> None:
        low, high = self.scale
        if self.total:
            percent = low + (high - low) * self.offset // self.total
            self.progress(percent, f"downloaded {self.offset // MiB} of {self.total // MiB} MiB")
        else:
            self.progress(None, f"downloaded {self.offset // MiB} MiB")


class _Truncated(Exception):
    pass


def _write_raw(url: str, disk: Disk, checksum_type: str, progress, user_agent: str) -> tuple[int, str]:
    # O_WRONLY without O_TRUNC/O_CREAT: a lab disk file keeps its size, a block device is a block device.
    fd = os.open(disk.path, os.O_WRONLY)
    try:
        written, digest = _Download(url, checksum_type, lambda off, data: write_all(fd, data, off),
                                    disk.size_bytes, progress, user_agent=user_agent).run()
        progress(99, f"flushing {disk.name}")
        os.fsync(fd)
    finally:
        os.close(fd)
    return written, digest


def _user_agent(ctx: Context) -> str:
    """Names the server in the image server's logs (the lab's image server reads it too)."""
    macs = ctx.hardware.macs()
    return f"{client.USER_AGENT} (mac {macs[0]})" if macs else client.USER_AGENT


def _verify(expected: str, digest: str) -> None:
    if digest != expected:
        raise CommandError(f"checksum mismatch: expected {expected}, got {digest}")


def _write_qcow2(url: str, disk: Disk, checksum_type: str, expected: str, qemu_img: str, ctx: Context) -> int:
    """Download to a temporary file, verify, convert onto the disk. Returns the bytes the disk received."""
    fd, tmp = tempfile.mkstemp(prefix="image-", suffix=".qcow2", dir=ctx.tmp_dir)
    try:
        try:
            _, digest = _Download(url, checksum_type, lambda off, data: write_all(fd, data, off),
                                  1 << 62, ctx.progress, scale=(0, 50), user_agent=_user_agent(ctx)).run()
        finally:
            os.close(fd)
        _verify(expected, digest)  # before the disk is touched
        size = _qcow2_virtual_size(qemu_img, tmp, disk)
        _convert(qemu_img, tmp, disk, ctx.progress)
        return size
    finally:
        os.unlink(tmp)


def _qcow2_virtual_size(qemu_img: str, path: str, disk: Disk) -> int:
    proc = subprocess.run([qemu_img, "info", "--output=json", "-f", "qcow2", path],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise CommandError(f"qemu-img info failed: {_tail(proc.stderr or proc.stdout)}")
    info = json.loads(proc.stdout)
    # A backing or external data file would make qemu-img read files of the ramdisk into the disk.
    if info.get("backing-filename") or (info.get("format-specific", {}).get("data", {}).get("data-file")):
        raise CommandError("qcow2 image refers to a backing or data file: refused")
    size = int(info["virtual-size"])
    if size > disk.size_bytes:
        raise CommandError(f"image's virtual size is {size} bytes, larger than {disk.name} ({disk.size_bytes} bytes)")
    return size


def _convert(qemu_img: str, src: str, disk: Disk, progress) -> None:
    """qemu-img convert onto the disk; -n: the target exists (block device or sized lab file), don't recreate it."""
    cmd = [qemu_img, "convert", "-p", "-n", "-f", "qcow2", "-O", "raw", src, disk.path]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = b""
    while True:
        data = proc.stdout.read1(4096)
        if not data:
            break
        output = (output + data)[-8192:]
        found = _QEMU_PROGRESS.findall(output)
        if found:
            progress(50 + int(float(found[-1]) * 0.49), f"converting image onto {disk.name}")
    if proc.wait() != 0:
        raise CommandError(f"qemu-img convert failed (exit {proc.returncode}): {_tail(output.decode('utf-8', 'replace'))}")
    fd = os.open(disk.path, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tail(text: str) -> str:
    lines = [line for line in re.split(r"[\r\n]+", text) if line.strip() and not _QEMU_PROGRESS.search(line.encode())]
    return lines[-1].strip() if lines else "no output"


def wipe_image(disk: Disk) -> int:
    """Zero the disk's first and last MiB (MBR/GPT, boot code, GPT backup) so no partial image boots."""
    try:
        zeroed, _ = zero_regions(disk.path, [(0, WIPE_BYTES), (disk.size_bytes - WIPE_BYTES, WIPE_BYTES)])
    except OSError as exc:
        log.error("could not wipe %s after a failed image write: %s", disk.name, exc)
        return 0
    log.warning("zeroed %d bytes at the ends of %s after a failed image write", zeroed, disk.name)
    return zeroed
