"""Erase verification: keyed canaries and pseudorandom samples, written and read with O_DIRECT.

Before an erase the agent plants canaries (4 KiB of keyed random data each) at pseudorandom offsets, always
one in the first and one in the last MiB, and reads them back at once (a disk that drops writes must not
make a canary look "gone" later). It also fingerprints a pseudorandom sample of the address space. After
the erase it reads the canaries again and the sample (or everything, in `full` mode):

- a surviving canary, even one 512-byte sector of it, means the erase missed that place;
- where the method promises zeros (overwrite, metadata wipe), a sampled chunk that is not all zeros is data
  that should not be there;
- where the content afterwards is indeterminate (NVMe format / sanitize, ATA secure erase), zeros are never
  expected: a sampled chunk that is byte-identical to what was there before (and was not a uniform fill
  such as never-written zeros) is data that should not be there.

Every read and write goes through O_DIRECT with page-aligned buffers: a canary written into the page cache
and read back from it proves nothing about the disk. Where O_DIRECT is refused (tmpfs), verification fails
and says why; it never falls back to buffered I/O.

Offsets are stratified: the disk is cut into equal strata and each gets one canary (or sample) at a keyed
pseudorandom place inside it, so any untouched run at least two strata long is certain to be caught, and
the places cannot be predicted without the key. The key is derived per erase by the console."""
from __future__ import annotations

import errno
import hashlib
import hmac
import math
import mmap
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

BLOCK = 4096  # canary size; O_DIRECT alignment (logical blocks are 512 or 4096 bytes)
SECTOR = 512
KiB = 1024
MiB = 1024 * KiB
READ_CHUNK = 8 * MiB
DEFAULT_CANARIES = 64
DEFAULT_METADATA_CANARIES = 16
DEFAULT_SHARE = 0.01
DEFAULT_SAMPLE_CHUNK = 64 * KiB
MAX_FINDINGS = 20  # offsets listed per kind of finding; counts are always complete

ZEROS = "zeros"  # the method writes zeros: anything else is left-over data
CHANGED = "changed"  # content afterwards is indeterminate: unchanged data is left-over data


class VerifyError(Exception):
    """Verification cannot be done (no O_DIRECT, a read error): never read as a pass."""


# --- keyed pseudorandom places -------------------------------------------------------------------

def disk_key(master: bytes, disk_id: str) -> bytes:
    """The key of one disk in one erase: the console's per-erase key, narrowed to the disk."""
    return hmac.new(master, f"disk:{disk_id}".encode(), hashlib.sha256).digest()


def _prf(key: bytes, label: str, i: int) -> int:
    return int.from_bytes(hmac.new(key, f"{label}:{i}".encode(), hashlib.sha256).digest()[:8], "big")


def stratified(key: bytes, label: str, start: int, length: int, count: int, item: int,
               align: int = BLOCK) -> list[int]:
    """`count` offsets in [start, start + length), one per equal stratum, each aligned to `align` with the
    whole `item` inside. `start` must be aligned."""
    if count <= 0 or length < item:
        return []
    slots = (length - item) // align + 1
    count = min(count, slots)
    offsets = []
    for i in range(count):
        lo, hi = slots * i // count, slots * (i + 1) // count
        offsets.append(start + (lo + _prf(key, label, i) % (hi - lo)) * align)
    return offsets


def canary_bytes(key: bytes, offset: int) -> bytes:
    """4 KiB of keyed random data, different at every offset and in every erase."""
    out = bytearray()
    counter = 0
    while len(out) < BLOCK:
        out += hashlib.blake2b(offset.to_bytes(8, "big") + counter.to_bytes(4, "big"), key=key[:64],
                               digest_size=64).digest()
        counter += 1
    return bytes(out[:BLOCK])


def metadata_regions(size: int, mib: int = 2) -> list[tuple[int, int]]:
    """Where partition tables and signatures live: the first and last `mib` MiB (the whole disk if small)."""
    span = min(mib * MiB, size // 2) // BLOCK * BLOCK
    if span <= 0:
        return [(0, size)]
    end = size // BLOCK * BLOCK
    return [(0, span), (end - span, span)]


@dataclass
class Plan:
    """Where the canaries and samples of one disk go, and which ranges the method claims to erase."""

    size: int
    regions: list[tuple[int, int]]  # claimed erased ranges
    canaries: list[int]
    samples: list[int]
    chunk: int
    share: float

    def within(self, offset: int, length: int) -> bool:
        return any(o <= offset and offset + length <= o + n for o, n in self.regions)


def plan(key: bytes, size: int, method: str, *, canaries: int | None = None, share: float = DEFAULT_SHARE,
         chunk: int = DEFAULT_SAMPLE_CHUNK, metadata_mib: int = 2) -> Plan:
    chunk = max(BLOCK, chunk // BLOCK * BLOCK)
    usable = size // BLOCK * BLOCK
    if method == "metadata":
        regions = metadata_regions(size, metadata_mib)
        count = canaries or DEFAULT_METADATA_CANARIES
        offsets = []
        for n, (start, length) in enumerate(regions):
            offsets += stratified(key, f"canary-meta-{n}", start, length, max(1, count // len(regions)), BLOCK)
        # The regions are read back whole: they are small, and a wipe has no reason to skip any of them.
        samples = [o for start, length in regions for o in range(start, start + length, chunk)
                   if o + chunk <= start + length]
        return Plan(size, regions, sorted(set(offsets)), samples, chunk, 1.0)
    count = canaries or DEFAULT_CANARIES
    head = stratified(key, "canary-first", 0, min(MiB, usable), 1, BLOCK)
    tail_start = max(0, usable - MiB) // BLOCK * BLOCK
    tail = stratified(key, "canary-last", tail_start, usable - tail_start, 1, BLOCK)
    middle = stratified(key, "canary", 0, usable, max(0, count - 2), BLOCK)
    n_samples = max(1, math.ceil(size * share / chunk)) if usable >= chunk else 0
    samples = stratified(key, "sample", 0, usable, n_samples, min(chunk, usable), BLOCK) if usable else []
    return Plan(size, [(0, size)], sorted(set(head + middle + tail)), samples, min(chunk, usable or chunk), share)


# --- O_DIRECT I/O -------------------------------------------------------------------------------

class DirectIO:
    """A file or block device opened with O_DIRECT, with a page-aligned buffer (as O_DIRECT needs)."""

    def __init__(self, path: str, *, write: bool = False, buffer: int = READ_CHUNK):
        self.path = path
        if not hasattr(os, "O_DIRECT"):
            raise VerifyError(f"{path}: this platform has no O_DIRECT: verification needs it")
        flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT
        try:
            self.fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise VerifyError(f"{path}: O_DIRECT refused ({exc.strerror}): a read-back through the page cache "
                                  "proves nothing, so the erase cannot be verified here") from None
            raise
        self.buf = mmap.mmap(-1, max(BLOCK, buffer))  # page-aligned, zero-filled
        self.view = memoryview(self.buf)

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` (both multiples of 4 KiB), read past any page cache."""
        if length > len(self.buf):
            raise ValueError("read larger than the buffer")
        got = 0
        while got < length:
            try:
                n = os.preadv(self.fd, [self.view[got:length]], offset + got)
            except OSError as exc:
                raise VerifyError(f"{self.path}: read at offset {offset + got} failed: {exc.strerror}") from None
            if n <= 0:
                raise VerifyError(f"{self.path}: short read at offset {offset + got} (device smaller than expected?)")
            got += n
        return bytes(self.view[:length])  # a copy: the aligned buffer is reused by the next read

    def write(self, data: bytes, offset: int) -> None:
        self.view[:len(data)] = data
        done = 0
        while done < len(data):
            n = os.pwritev(self.fd, [self.view[done:len(data)]], offset + done)
            if n <= 0:
                raise VerifyError(f"{self.path}: short write at offset {offset + done}")
            done += n

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        self.view.release()
        self.buf.close()
        os.close(self.fd)

    def __enter__(self) -> "DirectIO":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _uniform(data) -> int | None:
    """The fill byte when every byte of `data` is the same (never-written zeros, 0xFF), else None."""
    first = bytes(data[:1])
    if not first:
        return None
    return first[0] if data == first * len(data) else None


def _digest(data) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# --- before the erase -----------------------------------------------------------------------------

@dataclass
class Prepared:
    """What the verification needs to remember between the erase and the read-back (no key, no content)."""

    plan: Plan
    fingerprints: list[tuple[int, str, int | None]] = field(default_factory=list)  # offset, digest, fill byte
    planted_at: float = 0.0
    key_check: str = ""  # names the key the canaries were made with (not the key)

    def to_dict(self) -> dict:
        return {"size": self.plan.size, "regions": self.plan.regions, "canaries": self.plan.canaries,
                "samples": self.plan.samples, "chunk": self.plan.chunk, "share": self.plan.share,
                "fingerprints": self.fingerprints, "planted_at": self.planted_at, "key_check": self.key_check}

    @classmethod
    def from_dict(cls, d: dict) -> "Prepared":
        p = Plan(d["size"], [tuple(r) for r in d["regions"]], d["canaries"], d["samples"], d["chunk"], d["share"])
        return cls(p, [tuple(f) for f in d["fingerprints"]], d.get("planted_at", 0.0), d.get("key_check", ""))


def key_check(key: bytes) -> str:
    return hashlib.blake2b(b"key-check", key=key[:64], digest_size=8).hexdigest()


def prepare(path: str, key: bytes, the_plan: Plan, progress: Callable[[float], None] = lambda f: None, *,
            fingerprint: bool = True) -> Prepared:
    """Plant the canaries (O_DIRECT, fsync, read back at once), then fingerprint the sample. Without
    `fingerprint` (an erase that writes zeros: the read-back expects zeros, not a change) only the sample's
    places are kept."""
    with DirectIO(path, write=True, buffer=max(BLOCK, the_plan.chunk)) as dio:
        for offset in the_plan.canaries:
            dio.write(canary_bytes(key, offset), offset)
        dio.sync()
        for offset in the_plan.canaries:
            if dio.read(offset, BLOCK) != canary_bytes(key, offset):
                raise VerifyError(f"{path}: the canary written at offset {offset} does not read back: "
                                  "the disk does not keep what is written to it")
        if not fingerprint:
            return Prepared(the_plan, [(offset, "", None) for offset in the_plan.samples], time.time(),
                            key_check(key))
        prints = []
        total = len(the_plan.samples) or 1
        for i, offset in enumerate(the_plan.samples):
            data = dio.read(offset, the_plan.chunk)
            prints.append((offset, _digest(data), _uniform(data)))
            if i % 64 == 0:
                progress(i / total)
    return Prepared(the_plan, prints, time.time(), key_check(key))


# --- after the erase ------------------------------------------------------------------------------

def verify(path: str, key: bytes, prepared: Prepared, *, expectation: str, mode: str = "sampled",
           progress: Callable[[float], None] = lambda f: None) -> dict:
    """Read the canaries and the sample (or every claimed byte in `full` mode) back with O_DIRECT."""
    the_plan = prepared.plan
    if prepared.key_check and prepared.key_check != key_check(key):
        # Another key would look for other canaries and find none: a false pass. Refuse instead.
        raise VerifyError(f"{path}: the key differs from the one the canaries were planted with "
                          "(the console's signing key changed?): the erase cannot be verified")
    started = time.monotonic()
    findings: list[str] = []
    bytes_read = 0
    canaries = [o for o in the_plan.canaries if the_plan.within(o, BLOCK)]
    survivors = []
    with DirectIO(path, buffer=max(READ_CHUNK, the_plan.chunk)) as dio:
        for offset in canaries:
            data = dio.read(offset, BLOCK)
            bytes_read += BLOCK
            expected = canary_bytes(key, offset)
            sectors = sum(data[s:s + SECTOR] == expected[s:s + SECTOR] for s in range(0, BLOCK, SECTOR))
            if sectors:
                survivors.append({"offset": offset, "sectors": sectors})
        if survivors:
            findings.append(f"{len(survivors)} of {len(canaries)} canaries survived the erase (first at offset "
                            f"{survivors[0]['offset']})")
        dirty, unchanged = [], []
        scan = {"canary_blocks": 0}
        if mode == "full":
            scan = _scan_all(dio, key, the_plan, canaries, expectation, progress)
            bytes_read += scan["bytes_read"]
            dirty = scan["dirty"]
            if scan["dirty_blocks"]:
                findings.append(f"{scan['dirty_blocks']} block(s) of 4 KiB are not zero after an erase that writes "
                                f"zeros (first at offset {dirty[0]['offset']})")
            if scan["canary_blocks"]:
                findings.append(f"{scan['canary_blocks']} block(s) anywhere on the disk still hold canary data")
        sample_total = len(prepared.fingerprints) or 1
        for i, (offset, digest, fill) in enumerate(prepared.fingerprints):
            if not the_plan.within(offset, the_plan.chunk):
                continue
            if mode == "full" and expectation == ZEROS:
                break  # every byte was read already
            data = dio.read(offset, the_plan.chunk)
            bytes_read += the_plan.chunk
            if expectation == ZEROS:
                if _uniform(data) != 0:
                    nonzero = the_plan.chunk - data.count(0)
                    dirty.append({"offset": offset, "length": the_plan.chunk, "nonzero_bytes": nonzero})
            elif digest == _digest(data) and fill is None:
                unchanged.append({"offset": offset, "length": the_plan.chunk})
            if i % 64 == 0:
                progress(0.5 + 0.5 * i / sample_total if mode == "full" else i / sample_total)
        if expectation == ZEROS and mode != "full" and dirty:
            findings.append(f"{len(dirty)} of {len(prepared.fingerprints)} sampled chunk(s) are not zero "
                            f"after an erase that writes zeros (first at offset {dirty[0]['offset']})")
        if unchanged:
            findings.append(f"{len(unchanged)} of {len(prepared.fingerprints)} sampled chunk(s) hold exactly the data "
                            f"they held before the erase (first at offset {unchanged[0]['offset']})")
    return {
        "expectation": expectation, "mode": mode, "direct_io": True,
        "canaries": {"planted": len(the_plan.canaries), "checked": len(canaries), "survived": len(survivors),
                     "survivors": survivors[:MAX_FINDINGS]},
        "samples": {"count": len(prepared.fingerprints), "chunk": the_plan.chunk, "share": the_plan.share,
                    "dirty": len(dirty), "dirty_at": dirty[:MAX_FINDINGS],
                    "unchanged": len(unchanged), "unchanged_at": unchanged[:MAX_FINDINGS]},
        "regions": the_plan.regions, "bytes_read": bytes_read,
        "duration_s": round(time.monotonic() - started, 3),
        "canary_blocks_found": scan["canary_blocks"],
        "passed": not survivors and not dirty and not unchanged and not scan["canary_blocks"],
        "findings": findings,
    }


SCAN_CHUNK = 4 * MiB
SCAN_QUEUE_DEPTH = 8


def _scan_all(dio: DirectIO, key: bytes, the_plan: Plan, canaries: list[int], expectation: str,
              progress: Callable[[float], None]) -> dict:
    """Full read-back of the claimed regions: zeros everywhere (when promised) and no canary block anywhere.
    Several O_DIRECT reads in flight, each reader with its own aligned buffer; findings merged in disk order."""
    canary_heads = {canary_bytes(key, o)[:64] for o in the_plan.canaries}
    zero = bytes(SCAN_CHUNK)
    chunks = [(o, min(SCAN_CHUNK, start + length // BLOCK * BLOCK - o)) for start, length in the_plan.regions
              for o in range(start, start + length // BLOCK * BLOCK, SCAN_CHUNK)]
    total = sum(n for _, n in chunks) or 1
    local = threading.local()
    readers: list[DirectIO] = []
    lock = threading.Lock()
    done = [0]

    def scan(chunk: tuple[int, int]) -> tuple[list[int], int]:
        reader = getattr(local, "reader", None)
        if reader is None:
            reader = local.reader = DirectIO(dio.path, buffer=SCAN_CHUNK)
            with lock:
                readers.append(reader)
        offset, n = chunk
        data = reader.read(offset, n)
        dirty_at, canary_count = [], 0
        if data != zero[:n]:
            for b in range(0, n, BLOCK):
                block = data[b:b + BLOCK]
                if block[:64] in canary_heads:
                    canary_count += 1
                if expectation == ZEROS and block.count(0) != BLOCK:
                    dirty_at.append(offset + b)
        with lock:
            done[0] += n
            progress(0.5 * done[0] / total)
        return dirty_at, canary_count

    dirty: list[dict] = []
    dirty_blocks = canary_blocks = 0
    try:
        with ThreadPoolExecutor(max_workers=SCAN_QUEUE_DEPTH, thread_name_prefix="scan") as pool:
            for dirty_at, canary_count in pool.map(scan, chunks):
                canary_blocks += canary_count
                for at in dirty_at:
                    dirty_blocks += 1
                    if dirty and dirty[-1]["offset"] + dirty[-1]["length"] == at:
                        dirty[-1]["length"] += BLOCK
                    elif len(dirty) < MAX_FINDINGS:
                        dirty.append({"offset": at, "length": BLOCK})
    finally:
        for reader in readers:
            reader.close()
    return {"bytes_read": total if chunks else 0, "dirty": dirty, "dirty_blocks": dirty_blocks,
            "canary_blocks": canary_blocks}
