"""Disk sanitisation as a cleaning policy or an erase plan names it: `metadata`, `full`, `secure` or one drive
command, with an explicit fallback.

- metadata: zero the first and last 2 MiB (partition tables, GPT backup, RAID/LVM/filesystem signatures).
  Not a sanitisation in NIST SP 800-88 terms; recorded as such.
- full: overwrite every user-addressable block with zeros (NIST "Clear"), O_DIRECT, 4 MiB writes, 8 in flight.
- secure: the drive's own command (NIST "Purge"). NVMe (nvme-cli 2.x): `nvme format DEV --ses=2` when the
  controller supports cryptographic erase (Identify Controller FNA bit 2), else `nvme sanitize DEV
  --sanact=4|2|3` when SANICAP offers crypto, block or overwrite, else `nvme format DEV --ses=1`; sanitize
  progress from `nvme sanitize-log`. ATA: `hdparm --user-master u --security-set-pass P DEV`, then
  `--security-erase-enhanced P` when supported, else `--security-erase P`; a frozen drive is woken once
  through suspend-to-RAM (`rtcwake -m mem`), the usual way to unfreeze it, and given up on if still frozen.

The console's per-disk plan (hosts/gate/plan.py) may name one drive command instead of `secure`'s pick:
nvme-format (ses=1), nvme-crypto-format (ses=2), nvme-sanitize-crypto / -block / -overwrite, crypto-erase (ses=2
or sanitize crypto, whichever the controller offers), ata-secure-erase; one the drive does not offer cannot run,
and each disk's chain of methods is tried in order.

A method that cannot run (no tool, not supported, frozen) or that fails moves to the policy's fallback if it
names one, and the result says so (`fallback_from`, `fallback_reason`, every attempt); without a fallback
the erase fails. Nothing is ever silently weaker than asked.

The drive commands run with the hardware's tool environment (`Hardware.tool_env`), and the agent's own writes
go through the hardware's write call (`Hardware.disk_writer`): on real hardware, the kernel's."""
from __future__ import annotations

import errno
import json
import mmap
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from agent import __version__
from agent.hardware import Disk, DiskWrite, Hardware
from agent.verify import BLOCK, MiB, metadata_regions

WRITE_CHUNK = 4 * MiB  # the usual max_sectors_kb: one request each, not split by the block layer
WRITE_QUEUE_DEPTH = 8  # O_DIRECT writes in flight at once
# One drive command each, where a plan names which (pools/erase_rules.py has the same names): the NVMe variants a
# method allows, in the order tried; `secure` is the drive's strongest, whichever it offers.
NVME_VARIANTS = {
    "secure": ("crypto-format", "sanitize-crypto", "sanitize-block", "sanitize-overwrite", "format"),
    "nvme-format": ("format",), "nvme-crypto-format": ("crypto-format",),
    "nvme-sanitize-crypto": ("sanitize-crypto",), "nvme-sanitize-block": ("sanitize-block",),
    "nvme-sanitize-overwrite": ("sanitize-overwrite",), "crypto-erase": ("crypto-format", "sanitize-crypto"),
}
DRIVE_METHODS = (*NVME_VARIANTS, "ata-secure-erase")
METHODS = ("metadata", "full", *DRIVE_METHODS[1:], "secure")
# Weakest first: a fallback is only ever to a method the policy names.
STRENGTH = {"metadata": 0, "full": 1, "secure": 2}


class MethodUnavailable(Exception):
    """The method cannot run on this disk (no tool, not supported, frozen); `attempts`: the commands run to find
    out (e.g. the suspend that did not unfreeze a drive), kept as evidence."""

    def __init__(self, message: str, attempts: list | None = None):
        super().__init__(message)
        self.attempts = attempts or []


class EraseFailed(Exception):
    """The method ran and failed."""

    def __init__(self, message: str, attempts: list | None = None):
        super().__init__(message)
        self.attempts = attempts or []


@dataclass
class Policy:
    method: str
    fallback: str = ""
    metadata_mib: int = 2
    allow_suspend: bool = True  # ATA: try suspend/resume to unfreeze a frozen drive
    tool_timeout_s: float = 6 * 3600
    # A disk's own chain from the console's erase plan (hosts/gate/plan.py), tried in order; then `method` and
    # `fallback` are its first two.
    methods: tuple[str, ...] = ()

    def chain(self) -> list[str]:
        if self.methods:
            return list(dict.fromkeys(self.methods))
        return [self.method] + ([self.fallback] if self.fallback and self.fallback != self.method else [])


Progress = Callable[[float, str], None]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def erase_disk(disk: Disk, policy: Policy, hardware: Hardware, progress: Progress = lambda f, m: None) -> dict:
    """Erase one disk by the policy, falling back only as the policy allows. Raises EraseFailed."""
    attempts = []
    asked = policy.chain()[0]
    for method in policy.chain():
        started = _now()
        try:
            result = METHOD_FUNCTIONS[method](disk, policy, hardware, progress)
        except (MethodUnavailable, EraseFailed) as exc:
            attempts.append({"method": method, "error": str(exc), "started_at": started, "ended_at": _now(),
                             **({"commands": exc.attempts} if getattr(exc, "attempts", None) else {})})
            continue
        result.update({"requested": asked, "started_at": started, "ended_at": _now(),
                       "attempts": attempts,
                       "fallback_from": asked if method != asked else None,
                       "fallback_reason": attempts[-1]["error"] if attempts else None})
        return result
    tail = f"; the policy allows no fallback from {asked}" if len(policy.chain()) < 2 else ""
    raise EraseFailed("; ".join(f"{a['method']}: {a['error']}" for a in attempts) + tail, attempts)


# --- our own writes: metadata and full ------------------------------------------------------------

def erase_metadata(disk: Disk, policy: Policy, hardware: Hardware, progress: Progress) -> dict:
    regions = metadata_regions(disk.size_bytes, policy.metadata_mib)
    written = write_zeros(disk.path, regions, progress, pwritev=hardware.disk_writer(disk, regions))
    return {"method": "metadata", "method_type": "None",
            "method_details": f"zeros over the first and last {policy.metadata_mib} MiB (partition tables, GPT "
                              "backup, RAID/LVM/filesystem signatures); not a sanitisation: the rest of the disk "
                              "is not touched",
            "tool": "vmetal-agent (pwrite)", "tool_version": _agent_version(),
            "commands": [f"write zeros {o}+{n} {disk.path}" for o, n in regions], "bytes_written": written,
            "expectation": "zeros", "regions": regions}


def erase_full(disk: Disk, policy: Policy, hardware: Hardware, progress: Progress) -> dict:
    regions = [(0, disk.size_bytes)]
    written = write_zeros(disk.path, regions, progress, pwritev=hardware.disk_writer(disk, regions))
    return {"method": "full", "method_type": "Clear",
            "method_details": "one pass of zeros over every user-addressable block (O_DIRECT writes of 4 MiB, 8 in "
                              "flight), then fsync",
            "tool": "vmetal-agent (pwrite)", "tool_version": _agent_version(),
            "commands": [f"write zeros 0+{disk.size_bytes} {disk.path}"], "bytes_written": written,
            "expectation": "zeros", "regions": [(0, disk.size_bytes)]}


def _agent_version() -> str:
    return __version__


def write_zeros(path: str, regions: list[tuple[int, int]], progress: Progress = lambda f, m: None,
                queue_depth: int = WRITE_QUEUE_DEPTH, direct: bool | None = None,
                pwritev: DiskWrite = os.pwritev) -> int:
    """Zeros over the ranges with O_DIRECT, several 4 MiB writes in flight (a device is fastest with a queue),
    then fsync; buffered where O_DIRECT is refused or for an unaligned tail. The read-back that verifies the
    erase is always O_DIRECT (agent/verify.py), whichever way the zeros went. Every write goes through `pwritev`
    (the hardware's `disk_writer`), and the bytes counted are those it says it wrote."""
    pieces = [(o, o + n) for o, n in regions if n > 0]
    total = sum(n for _, n in regions) or 1
    # O_DIRECT with a queue of 4 MiB writes: measured faster than `dd` (buffered or O_DIRECT) on both the
    # project's machines (bench/README.md), and a whole disk never passes through the ramdisk's memory.
    direct = True if direct is None else direct
    try:
        fd = os.open(path, os.O_WRONLY | (os.O_DIRECT if direct else 0))
    except OSError as exc:
        if not direct or exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise EraseFailed(f"cannot open {path}: {exc.strerror}") from None
        fd, direct = os.open(path, os.O_WRONLY), False
    if not direct:
        queue_depth = 1
    items = [(o, min(WRITE_CHUNK, end - o)) for start, end in pieces for o in range(start, end, WRITE_CHUNK)]
    buf = mmap.mmap(-1, WRITE_CHUNK)  # page-aligned zeros, only ever read: shared by the writers
    zeros = memoryview(buf)
    state = {"written": 0, "reported": 0.0}
    lock = threading.Lock()

    def write(item: tuple[int, int]) -> None:
        offset, n = item
        if direct and (offset % BLOCK or n % BLOCK):
            _buffered_zeros(path, offset, n, pwritev)
        else:
            done = 0
            while done < n:
                done += pwritev(fd, [zeros[done:n]], offset + done)
        with lock:
            state["written"] += n
            now = time.monotonic()
            if now - state["reported"] > 0.5:
                state["reported"] = now
                progress(state["written"] / total, "writing zeros")

    failure = None
    try:
        with ThreadPoolExecutor(max_workers=max(1, queue_depth), thread_name_prefix="zeros") as pool:
            for _ in pool.map(write, items):
                pass
        os.fsync(fd)
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # written and synced: leave no cache behind
    except OSError as exc:
        # Raised after the buffer is closed: a traceback through a Python pwritev still holds views of it.
        failure = f"writing zeros to {path} failed at offset {state['written']}: {exc.strerror or exc}"
    finally:
        zeros.release()
        buf.close()
        os.close(fd)
    if failure:
        raise EraseFailed(failure)
    progress(1.0, "zeros written")
    return state["written"]


def _buffered_zeros(path: str, offset: int, length: int, pwritev: DiskWrite = os.pwritev) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        done = 0
        while done < length:
            done += pwritev(fd, [bytes(length - done)], offset + done)
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the drive's own commands: secure -------------------------------------------------------------

def run_tool(argv: list[str], timeout: float, *, secret: str | None = None, env: dict | None = None) -> dict:
    """Run a tool; the record (with any password masked) is part of the erase's evidence."""
    shown = " ".join(a.replace(secret, "********") if secret else a for a in argv)
    exe = shutil.which(argv[0], path=(env or os.environ).get("PATH"))
    if exe is None:
        raise MethodUnavailable(f"{argv[0]} not found on PATH")
    try:
        proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise EraseFailed(f"{shown}: no answer within {int(timeout)}s") from None
    output = (proc.stdout + proc.stderr).strip()
    if secret:
        output = output.replace(secret, "********")
    return {"command": shown, "exit_code": proc.returncode, "output": output[-2000:], "stdout": proc.stdout}


def tool_version(argv: list[str], env: dict | None = None) -> str:
    try:
        record = run_tool(argv, 30, env=env)
    except (MethodUnavailable, EraseFailed):
        return "unknown"
    return record["output"].splitlines()[0].strip() if record["output"] else "unknown"


NVME_SANITIZE = [(0x1, 4, "cryptographic erase", "sanitize-crypto"), (0x2, 2, "block erase", "sanitize-block"),
                 (0x4, 3, "overwrite", "sanitize-overwrite")]


def erase_secure(disk: Disk, policy: Policy, hardware: Hardware, progress: Progress, method: str = "secure") -> dict:
    if disk.type == "nvme":
        if method == "ata-secure-erase":
            raise MethodUnavailable(f"{disk.name} is an NVMe drive: no ATA security feature set")
        result = nvme_secure_erase(disk, policy, progress, hardware.tool_env(), variants=NVME_VARIANTS[method])
    else:
        if method not in ("secure", "ata-secure-erase"):
            raise MethodUnavailable(f"{disk.name} ({disk.type}) is not an NVMe drive: no {method}")
        result = ata_secure_erase(disk, policy, progress, hardware.tool_env())
    return {**result, "method": method}


def _drive_method(method: str):
    def erase(disk: Disk, policy: Policy, hardware: Hardware, progress: Progress) -> dict:
        return erase_secure(disk, policy, hardware, progress, method)
    return erase


def nvme_secure_erase(disk: Disk, policy: Policy, progress: Progress, env: dict | None = None,
                      variants: tuple[str, ...] = NVME_VARIANTS["secure"]) -> dict:
    def run(argv, timeout):
        return run_tool(argv, timeout, env=env)

    ident = run(["nvme", "id-ctrl", disk.path, "-o", "json"], 60)
    if ident["exit_code"] != 0:
        raise MethodUnavailable(f"nvme id-ctrl failed (exit {ident['exit_code']}): {ident['output'][-300:]}")
    try:
        ctrl = json.loads(ident["stdout"])
        fna, sanicap = int(ctrl.get("fna", 0)), int(ctrl.get("sanicap", 0))
    except (ValueError, TypeError, AttributeError):
        raise MethodUnavailable("nvme id-ctrl: the answer is not the JSON nvme-cli 2.x prints") from None
    version = tool_version(["nvme", "version"], env)
    offered = []
    if fna & 0x4:
        offered.append(("crypto-format", "format", ["nvme", "format", disk.path, "--ses=2", "--force"],
                        "NVMe Format NVM, Secure Erase Setting 2: cryptographic erase (the media key is replaced)"))
    for bit, action, name, variant in NVME_SANITIZE:
        if sanicap & bit:
            offered.append((variant, "sanitize", ["nvme", "sanitize", disk.path, f"--sanact={action}"],
                            f"NVMe Sanitize, action {action}: {name} of all user data, caches included"))
    offered.append(("format", "format", ["nvme", "format", disk.path, "--ses=1", "--force"],
                    "NVMe Format NVM, Secure Erase Setting 1: user data erase"))
    chosen = [(kind, argv, details) for variant, kind, argv, details in offered if variant in variants]
    if not chosen:
        raise MethodUnavailable(f"the controller does not offer {' or '.join(variants)} (fna={fna:#x}, "
                                f"sanicap={sanicap:#x})")
    tried = [{"command": ident["command"], "exit_code": 0, "output": f"fna={fna:#x} sanicap={sanicap:#x}"}]
    for kind, argv, details in chosen:
        progress(0.05, " ".join(argv[:2] + argv[3:]))
        record = run(argv, policy.tool_timeout_s)
        tried.append({k: record[k] for k in ("command", "exit_code", "output")})
        if record["exit_code"] != 0:
            continue
        if kind == "sanitize":
            status = _wait_sanitize(disk, policy, progress, tried, env)
            if status != "completed":
                continue
        progress(1.0, "secure erase done")
        return {"method": "secure", "method_type": "Purge", "method_details": details, "tool": "nvme-cli",
                "tool_version": version, "commands": [t["command"] for t in tried], "tool_output": tried,
                "bytes_written": 0, "expectation": "changed", "regions": [(0, disk.size_bytes)]}
    raise EraseFailed("every NVMe secure erase command failed: " + "; ".join(
        f"{t['command']} → exit {t['exit_code']}: {t['output'][-200:]}" for t in tried[1:]), tried)


def _wait_sanitize(disk: Disk, policy: Policy, progress: Progress, tried: list, env: dict | None = None) -> str:
    """Poll `nvme sanitize-log` until the sanitize completes or fails (SSTAT bits 2:0)."""
    deadline = time.monotonic() + policy.tool_timeout_s
    while time.monotonic() < deadline:
        record = run_tool(["nvme", "sanitize-log", disk.path, "-o", "json"], 60, env=env)
        sstat, sprog = _sanitize_state(record["stdout"])
        state = {1: "completed", 4: "completed", 2: "in progress", 3: "failed", 0: "never"}.get(
            (sstat or 0) & 0x7, "unknown")
        if state == "in progress":
            progress(0.05 + 0.9 * (sprog or 0) / 65535, f"sanitize {100 * (sprog or 0) // 65535}%")
            time.sleep(2)
            continue
        tried.append({"command": record["command"], "exit_code": record["exit_code"],
                      "output": f"sstat={sstat} ({state})"})
        return state
    tried.append({"command": "nvme sanitize-log", "exit_code": None, "output": "sanitize did not finish in time"})
    return "timeout"


def _sanitize_state(text: str) -> tuple[int | None, int | None]:
    """nvme-cli prints {"nvme0": {"sprog": N, "sstat": N or {...}}} or a flat object, depending on version."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None, None

    def find(obj, key):
        if isinstance(obj, dict):
            if key in obj:
                return obj[key]
            for value in obj.values():
                found = find(value, key)
                if found is not None:
                    return found
        return None

    sstat = find(doc, "sstat")
    if isinstance(sstat, dict):
        sstat = sstat.get("status", sstat.get("value"))
    sprog = find(doc, "sprog")
    try:
        return (int(sstat) if sstat is not None else None), (int(sprog) if sprog is not None else None)
    except (TypeError, ValueError):
        return None, None


@dataclass
class AtaSecurity:
    supported: bool = False
    enabled: bool = False
    locked: bool = False
    frozen: bool = False
    enhanced: bool = False
    minutes: int = 0
    enhanced_minutes: int = 0


def parse_hdparm_security(text: str) -> AtaSecurity:
    """The "Security:" block of `hdparm -I`, e.g. "\\tnot\\tfrozen", "\\t\\tsupported: enhanced erase"."""
    sec = AtaSecurity()
    block = text.split("Security:", 1)
    if len(block) < 2:
        return sec
    for raw in block[1].splitlines()[1:]:
        if raw and not raw[0].isspace():
            break  # the next section
        line = " ".join(raw.split())
        negated = line.startswith("not ")
        word = line[4:] if negated else line
        if word == "supported":
            sec.supported = not negated
        elif word == "enabled":
            sec.enabled = not negated
        elif word == "locked":
            sec.locked = not negated
        elif word == "frozen":
            sec.frozen = not negated
        elif word == "supported: enhanced erase":
            sec.enhanced = not negated
        times = re.findall(r"(\d+)min for (ENHANCED )?SECURITY ERASE UNIT", line)
        for minutes, enhanced in times:
            if enhanced:
                sec.enhanced_minutes = int(minutes)
            else:
                sec.minutes = int(minutes)
    return sec


def ata_secure_erase(disk: Disk, policy: Policy, progress: Progress, env: dict | None = None) -> dict:
    tried = []

    def run_tool(argv, timeout, *, secret=None):
        return _run_tool(argv, timeout, secret=secret, env=env)

    def identify() -> AtaSecurity:
        record = run_tool(["hdparm", "-I", disk.path], 60)
        tried.append({"command": record["command"], "exit_code": record["exit_code"], "output": record["output"][-400:]})
        if record["exit_code"] != 0:
            raise MethodUnavailable(f"hdparm -I failed (exit {record['exit_code']}): not an ATA drive? "
                                    f"{record['output'][-200:]}")
        return parse_hdparm_security(record["stdout"])

    sec = identify()
    if not sec.supported:
        raise MethodUnavailable(f"{disk.name} ({disk.type}) does not support the ATA security feature set")
    if sec.enabled or sec.locked:
        raise MethodUnavailable(f"{disk.name}: ATA security is already enabled with a password we do not know")
    if sec.frozen:
        # Each way out says what was (not) tried: "did not unfreeze it" only after a suspend that ran.
        why = "the policy does not allow a suspend to unfreeze it"
        if policy.allow_suspend:
            try:
                record = run_tool(["rtcwake", "-m", "mem", "-s", "10"], 120)
            except (MethodUnavailable, EraseFailed) as exc:
                why = f"no suspend to unfreeze it: {exc}"
            else:
                tried.append({k: record[k] for k in ("command", "exit_code", "output")})
                if record["exit_code"] != 0:
                    why = (f"the suspend to unfreeze it failed ({record['command']} exit {record['exit_code']}: "
                           f"{record['output'][-200:]})")
                else:
                    sec = identify()
                    why = f"still frozen after a suspend to RAM and resume ({record['command']})"
        if sec.frozen:
            raise MethodUnavailable(f"{disk.name} is frozen (the firmware froze its security state at boot); {why}",
                                    tried)
    version = tool_version(["hdparm", "-V"], env)
    password = "vm" + secrets.token_hex(6)
    record = run_tool(["hdparm", "--user-master", "u", "--security-set-pass", password, disk.path], 60, secret=password)
    tried.append({k: record[k] for k in ("command", "exit_code", "output")})
    if record["exit_code"] != 0:
        raise EraseFailed(f"hdparm --security-set-pass failed: {record['output'][-200:]}", tried)
    flag = "--security-erase-enhanced" if sec.enhanced else "--security-erase"
    minutes = (sec.enhanced_minutes if sec.enhanced else sec.minutes) or 60
    progress(0.05, f"ATA {flag[2:]} (estimated {minutes} min)")
    record = run_tool(["hdparm", "--user-master", "u", flag, password, disk.path],
                      min(policy.tool_timeout_s, minutes * 120 + 600), secret=password)
    tried.append({k: record[k] for k in ("command", "exit_code", "output")})
    after = identify()
    if record["exit_code"] != 0 or after.enabled:
        if after.enabled:  # leave no password behind on a drive that failed
            undo = run_tool(["hdparm", "--user-master", "u", "--security-disable", password, disk.path], 60,
                            secret=password)
            tried.append({k: undo[k] for k in ("command", "exit_code", "output")})
        raise EraseFailed(f"hdparm {flag} failed (exit {record['exit_code']}): {record['output'][-200:]}", tried)
    progress(1.0, "secure erase done")
    return {"method": "secure", "method_type": "Purge" if sec.enhanced else "Clear",
            "method_details": ("ATA SECURITY ERASE UNIT, enhanced mode (vendor pattern over all user data, "
                               "reallocated sectors included)" if sec.enhanced else
                               "ATA SECURITY ERASE UNIT, normal mode (user-addressable data replaced)"),
            "tool": "hdparm", "tool_version": version, "commands": [t["command"] for t in tried],
            "tool_output": tried, "bytes_written": 0, "expectation": "changed", "regions": [(0, disk.size_bytes)]}


_run_tool = run_tool
METHOD_FUNCTIONS = {"metadata": erase_metadata, "full": erase_full, "secure": erase_secure,
                    **{m: _drive_method(m) for m in DRIVE_METHODS if m != "secure"}}
