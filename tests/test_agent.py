"""The ramdisk agent: its commands on file-backed disks, and its loop against a small fake console over HTTP.

No database and no Django: the agent runs on servers, not in the console.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import wait_for
from agent import bootconfig, seed
from agent.client import Backoff
from agent.commands import image as image_cmd
from agent.commands.base import Context
from agent.commands.registry import execute
from agent.disks import GiB, MiB, DiskError, choose_root_disk
from agent.hardware import Disk, LinuxHardware, parse_nvidia_smi_csv
from agent.runner import Agent
from lab.hardware import LAB_HARDWARE, LabHardware

ROOT = Path(__file__).resolve().parent.parent
MAC = "52:54:00:aa:bb:01"


# -- helpers ---------------------------------------------------------------------------------

def lab_hardware(tmp_path, disks=(("nvme0n1", 96 * MiB), ("sda", 8 * MiB)), gpus=None) -> LabHardware:
    profile = {
        "system": {"vendor": "Supermicro", "product": "SYS-821GE-TNHR", "serial": "S123", "bios_version": "2.3.1"},
        "cpu": {"arch": "x86_64", "model": "Intel Xeon Platinum 8480+", "count": 224},
        "ram_mib": 2097152,
        "nics": [{"name": "eno1", "mac": MAC.upper(), "speed_gbps": 100}],
        "gpus": gpus if gpus is not None else [
            {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "memory_mib": 143771, "pci_bus": "00000000:19:00.0"},
        ],
        "disks": [
            {"name": name, "path": f"disks/{name}.img", "size_bytes": size,
             "type": "nvme" if name.startswith("nvme") else "ssd", "model": f"model-{name}", "serial": f"SN-{name}"}
            for name, size in disks
        ],
    }
    return LabHardware(profile, base_dir=tmp_path)


def read(path, offset=0, length=None) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read() if length is None else fh.read(length)


def fill(path, byte: int, length: int, offset: int = 0) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(bytes([byte]) * length)


def pattern(size: int) -> bytes:
    """Non-repeating, non-zero-heavy bytes, cheap to make."""
    block = hashlib.sha512(b"image").digest() * 64
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(i.to_bytes(8, "little")).digest() + block[: 4064]
        i += 1
    return bytes(out[:size])


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, percent, message):
        self.calls.append((percent, message))

    @property
    def percents(self):
        return [p for p, _ in self.calls if p is not None]


def serve(handler_class) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


class FileServer:
    """Serves bytes by path, honours `Range: bytes=N-`, can drop a connection or go slowly."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.drop_first_after: dict[str, int] = {}
        self.piece_delay = 0.0
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                owner.requests.append({"path": self.path, "range": self.headers.get("Range")})
                data = owner.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
                    start = int(rng[6:-1])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Connection", "close")
                self.end_headers()
                body = data[start:]
                cut = owner.drop_first_after.pop(self.path, None)
                if cut is not None:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                try:
                    for i in range(0, len(body), 256 * 1024):
                        self.wfile.write(body[i:i + 256 * 1024])
                        if owner.piece_delay:
                            time.sleep(owner.piece_delay)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the agent hung up: an image too large for the disk

        self.server = serve(Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, path: str, data: bytes) -> str:
        self.files[path] = data
        return self.base + path

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def files():
    server = FileServer()
    yield server
    server.close()


class FakeConsole:
    """The console's side of the agent protocol, in memory: lookup, heartbeat, result."""

    def __init__(self, port: int = 0, heartbeat_s: float = 0.03):
        self.hosts = {MAC: (12, "gpu-01")}
        self.heartbeat_s = heartbeat_s
        self.progress_s: float | None = None  # not in the answer: the agent reports progress every heartbeat_s
        self.commands: deque = deque()
        self.lookups: list[dict] = []
        self.heartbeats: list[dict] = []
        self.results: list[dict] = []
        self.result_tokens: list[str] = []
        self.token: str | None = None
        self.tokens_issued = 0
        self.reject_next = 0
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                with owner.lock:
                    status, answer = owner.handle(self.path, body, token)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def handle(self, path, body, token):
        if path == "/agent/lookup":
            self.lookups.append(body)
            host = next((self.hosts[m] for m in body.get("macs", []) if m in self.hosts), None)
            if host is None:
                return 404, {"detail": "no host with these MACs"}
            self.tokens_issued += 1
            self.token = f"secret-token-{self.tokens_issued}"  # a new token makes the old one stale
            answer = {"host_id": host[0], "host": host[1], "token": self.token, "heartbeat_s": self.heartbeat_s}
            return 200, answer | ({"progress_s": self.progress_s} if self.progress_s else {})
        if token != self.token:
            return 403, {"detail": "stale token"}
        if self.reject_next:
            self.reject_next -= 1
            self.token = None  # e.g. the console restarted its per-boot tokens
            return 403, {"detail": "stale token"}
        if path == "/agent/heartbeat":
            self.heartbeats.append(body)
            if body["status"] == "idle" and self.commands:
                return 200, {"command": self.commands.popleft()}
            return 200, {"command": None}
        if path == "/agent/result":
            self.results.append(body)
            self.result_tokens.append(token)
            return 200, {}
        return 404, {}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def console():
    fake = FakeConsole()
    yield fake
    fake.close()


def start_agent(url, hardware, **kwargs):
    kwargs.setdefault("backoff_initial", 0.02)
    kwargs.setdefault("backoff_cap", 0.2)
    agent = Agent(url, hardware, **kwargs)
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("rc", agent.run()), daemon=True)
    thread.start()
    return agent, thread, box


def finish(agent, thread, box, timeout=10):
    thread.join(timeout)
    agent.stop()
    assert not thread.is_alive(), "agent did not finish"
    return box.get("rc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_agent_stopped_while_its_lookup_is_in_flight_asks_nothing_more(tmp_path, console):
    """The lab stops a server's agent when the server powers off (lab/site.py); a lookup already on its way comes
    back, and the agent makes no further call with what it got."""
    arrived, release = threading.Event(), threading.Event()
    handle = console.handle

    def held(path, body, token):
        if path == "/agent/lookup":
            arrived.set()
            release.wait(10)
        return handle(path, body, token)

    console.handle = held
    agent, thread, box = start_agent(console.url, lab_hardware(tmp_path))
    assert arrived.wait(10)
    agent.stop()
    release.set()
    thread.join(10)
    assert not thread.is_alive() and box.get("rc") == 0
    assert len(console.lookups) == 1 and console.heartbeats == []


# -- inspect -------------------------------------------------------------------------------------

def test_inspect_reports_the_lab_profile_with_real_disk_sizes(tmp_path):
    hw = lab_hardware(tmp_path)
    outcome = execute("inspect", {}, Context(hardware=hw))
    assert outcome.ok, outcome.error
    result = outcome.result
    assert result["cpu"] == {"arch": "x86_64", "model": "Intel Xeon Platinum 8480+", "count": 224}
    assert result["ram_mib"] == 2097152
    assert result["system"] == {"vendor": "Supermicro", "product": "SYS-821GE-TNHR", "serial": "S123",
                                "bios_version": "2.3.1"}
    assert result["nics"] == [{"name": "eno1", "mac": MAC, "speed_gbps": 100}]
    assert result["gpus"][0]["uuid"] == "GPU-1"
    nvme, sda = result["disks"]
    assert nvme == {"name": "nvme0n1", "path": str(tmp_path / "disks/nvme0n1.img"), "model": "model-nvme0n1",
                    "serial": "SN-nvme0n1", "size_bytes": 96 * MiB, "type": "nvme", "rotational": False}
    assert sda["size_bytes"] == 8 * MiB
    # The lab's disk files are created sparse: they cost no space.
    assert os.stat(nvme["path"]).st_blocks * 512 < MiB


def test_linux_hardware_reads_proc_sys_and_nvidia_smi(tmp_path):
    def put(rel, text):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    put("proc/cpuinfo", "processor\t: 0\nmodel name\t: AMD EPYC 9654\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9654\n")
    put("proc/meminfo", "MemTotal:       2113929216 kB\nMemFree: 1 kB\n")
    put("sys/block/nvme0n1/size", "7501476528\n")
    put("sys/block/nvme0n1/queue/rotational", "0\n")
    put("sys/block/nvme0n1/device/model", "SAMSUNG MZQL23T8HCLS-00A07\n")
    put("sys/block/nvme0n1/device/serial", "S64HNE0T123456\n")
    put("sys/block/sda/size", "3907029168\n")
    put("sys/block/sda/queue/rotational", "1\n")
    put("sys/block/sda/device/model", "ST2000NM000A\n")
    put("sys/block/sda/device/vpd_pg80", b"\x00\x80\x00\x14      ZA1B2C3D\x00")
    put("sys/block/loop0/size", "1024\n")  # virtual: no device link
    put("sys/class/net/eno1/address", "3C:EC:EF:00:11:22\n")
    put("sys/class/net/eno1/speed", "100000\n")
    (tmp_path / "sys/class/net/eno1/device").mkdir()
    put("sys/class/net/eno2/address", "3c:ec:ef:00:11:23\n")
    put("sys/class/net/eno2/speed", "-1\n")  # link down
    (tmp_path / "sys/class/net/eno2/device").mkdir()
    put("sys/class/net/lo/address", "00:00:00:00:00:00\n")
    put("sys/class/net/br0/address", "3c:ec:ef:00:11:22\n")  # a bridge: no device
    put("sys/class/dmi/id/sys_vendor", "Supermicro\n")
    put("sys/class/dmi/id/product_name", "SYS-821GE-TNHR\n")
    put("sys/class/dmi/id/bios_version", "2.1\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, GPU-aaaa, 143771, 00000000:19:00.0, 96.00.AF.00.01'\n"
                   "echo '1, NVIDIA H200, GPU-bbbb, 143771, 00000000:3B:00.0, [N/A]'\n")
    smi.chmod(0o755)

    hw = LinuxHardware(root=tmp_path, nvidia_smi=str(smi))
    result = execute("inspect", {}, Context(hardware=hw)).result

    assert result["cpu"]["model"] == "AMD EPYC 9654" and result["cpu"]["count"] == 2
    assert result["ram_mib"] == 2113929216 // 1024
    assert [(d["name"], d["type"], d["rotational"], d["serial"]) for d in result["disks"]] == [
        ("nvme0n1", "nvme", False, "S64HNE0T123456"), ("sda", "hdd", True, "ZA1B2C3D")]
    assert result["disks"][0]["size_bytes"] == 7501476528 * 512
    assert result["disks"][1]["path"] == "/dev/sda"
    assert result["nics"] == [{"name": "eno1", "mac": "3c:ec:ef:00:11:22", "speed_gbps": 100.0},
                              {"name": "eno2", "mac": "3c:ec:ef:00:11:23", "speed_gbps": None}]
    assert [g["uuid"] for g in result["gpus"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert result["gpus"][1] == {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-bbbb", "memory_mib": 143771,
                                 "pci_bus": "00000000:3B:00.0"}
    assert result["gpus"][0]["vbios_version"] == "96.00.AF.00.01"  # the SKU's firmware.gpuVbios
    assert result["system"] == {"vendor": "Supermicro", "product": "SYS-821GE-TNHR", "serial": None,
                                "bios_version": "2.1"}
    assert "warnings" not in result


def test_a_failing_nvidia_smi_is_reported_not_hidden(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n")
    smi.chmod(0o755)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 1024 kB\n")
    result = execute("inspect", {}, Context(hardware=LinuxHardware(root=tmp_path, nvidia_smi=str(smi)))).result
    assert result["gpus"] == []
    assert "nvidia-smi exited 9" in result["warnings"][0]


def test_nvidia_smi_csv_as_a_real_h200_prints_it():
    # Captured from `nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id --format=csv,noheader,nounits`.
    real = "0, NVIDIA H200, GPU-9765cebd-31d0-429c-dbe7-1349c08ac823, 143771, 00000000:00:06.0\n"
    assert parse_nvidia_smi_csv(real) == [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-9765cebd-31d0-429c-dbe7-1349c08ac823",
                                           "memory_mib": 143771, "pci_bus": "00000000:00:06.0"}]
    assert parse_nvidia_smi_csv("0, NVIDIA H200, GPU-1, [N/A], 00000000:19:00.0\n")[0]["memory_mib"] is None



def test_gpu_listing_reads_what_a_real_h200_prints(tmp_path):
    # Captured on an H200 host with bench/gpu_probe.sh (2026-11-29): the two queries gpu_reset runs first.
    from agent.commands.gpu import gpu_processes, list_gpus
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n"
                   "  --query-gpu=*) echo '0, 00000000:00:06.0, GPU-24f17f1b-eb07-be47-67e3-5bcdf725d8e8, NVIDIA H200';;\n"
                   "  --query-compute-apps=*) ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    gpus, run = list_gpus(env)
    assert run["exit_code"] == 0
    assert gpus == [{"index": 0, "pci_bus": "00000000:00:06.0", "uuid": "GPU-24f17f1b-eb07-be47-67e3-5bcdf725d8e8",
                     "name": "NVIDIA H200"}]
    assert gpu_processes(env)[0] == []  # an idle GPU prints nothing for the compute apps query

# -- root disk -------------------------------------------------------------------------------------

def test_root_disk_choice_follows_ironic_and_the_hints():
    big = Disk("sda", "/dev/sda", 960 * GiB, "ssd", model="INTEL SSDSC2KG96", serial="A1")
    small = Disk("nvme0n1", "/dev/nvme0n1", 480 * GiB, "nvme", model="SAMSUNG MZ1L2480", serial="B2")
    tiny = Disk("sdb", "/dev/sdb", 1 * GiB, "ssd", model="USB", serial="C3")
    disks = [big, tiny, small]
    assert choose_root_disk(disks) is small  # the smallest of at least 4 GiB
    assert choose_root_disk([tiny, Disk("sdc", "/dev/sdc", 2 * GiB, "ssd")]) is tiny  # none qualifies: the first
    assert choose_root_disk(disks, hints={"serialNumber": "A1"}) is big
    assert choose_root_disk(disks, hints={"deviceName": "/dev/sda"}) is big
    assert choose_root_disk(disks, hints={"model": "samsung"}) is small
    assert choose_root_disk(disks, hints={"minSizeGigabytes": 500}) is big
    assert choose_root_disk(disks, name="sdb") is tiny
    with pytest.raises(DiskError, match="no disk matches"):
        choose_root_disk(disks, hints={"serialNumber": "nope"})
    with pytest.raises(DiskError, match="unsupported root device hints: hctl"):
        choose_root_disk(disks, hints={"hctl": "0:0:0:0"})


# -- write_image -----------------------------------------------------------------------------------

def test_raw_image_is_written_byte_exact_with_progress(tmp_path, files):
    hw = lab_hardware(tmp_path)
    data = pattern(5 * MiB + 123)
    url = files.add("/ubuntu.raw", data)
    progress = Recorder()
    outcome = execute("write_image", {"url": url, "checksum": hashlib.sha256(data).hexdigest(),
                                      "checksum_type": "sha256", "format": "raw"},
                      Context(hardware=hw, progress=progress))
    assert outcome.ok, outcome.error
    assert outcome.result["disk"] == "nvme0n1"  # the first disk: none is 4 GiB in the lab
    assert outcome.result["bytes_written"] == len(data)
    assert outcome.result["checksum_verified"] is True
    assert outcome.result["duration_s"] >= 0
    disk = hw.disk("nvme0n1")
    assert read(disk.path, 0, len(data)) == data
    assert os.path.getsize(disk.path) == 96 * MiB  # written in place, not truncated
    assert progress.percents == sorted(progress.percents)
    assert len(set(progress.percents)) > 3 and progress.percents[-1] == 100


def test_wrong_checksum_fails_and_wipes_the_start_of_the_disk(tmp_path, files):
    hw = lab_hardware(tmp_path)
    disk = hw.disk("nvme0n1")
    fill(disk.path, 0x55, 2 * MiB)  # an older OS that must not boot either
    data = pattern(3 * MiB)
    wrong = hashlib.sha256(b"something else").hexdigest()
    outcome = execute("write_image", {"url": files.add("/img.raw", data), "checksum": wrong, "checksum_type": "sha256"},
                      Context(hardware=hw))
    assert not outcome.ok
    assert outcome.error.startswith(f"checksum mismatch: expected {wrong}, got {hashlib.sha256(data).hexdigest()}")
    assert read(disk.path, 0, MiB) == bytes(MiB)
    assert read(disk.path, MiB, 16) != bytes(16)  # only the start is wiped, not a full erase


def test_a_dropped_download_resumes_where_it_broke(tmp_path, files, monkeypatch):
    monkeypatch.setattr(image_cmd, "RETRY_BASE_S", 0)
    hw = lab_hardware(tmp_path)
    data = pattern(4 * MiB)
    url = files.add("/img.raw", data)
    files.drop_first_after["/img.raw"] = 3 * MiB // 2
    outcome = execute("write_image", {"url": url, "checksum": hashlib.md5(data).hexdigest(), "checksum_type": "md5"},
                      Context(hardware=hw))
    assert outcome.ok, outcome.error
    assert read(hw.disk("nvme0n1").path, 0, len(data)) == data
    assert files.requests[0]["range"] is None
    assert files.requests[1]["range"].startswith("bytes=") and files.requests[1]["range"] != "bytes=0-"


def test_checksum_may_be_a_checksum_file_and_its_type_is_detected(tmp_path, files):
    hw = lab_hardware(tmp_path)
    data = pattern(MiB)
    url = files.add("/images/noble.raw", data)
    sums = f"{hashlib.sha512(b'x').hexdigest()}  other.raw\n{hashlib.sha512(data).hexdigest()} *noble.raw\n"
    checksum_url = files.add("/images/SHA512SUMS", sums.encode())
    outcome = execute("write_image", {"url": url, "checksum": checksum_url, "disk": "sda"}, Context(hardware=hw))
    assert outcome.ok, outcome.error
    assert outcome.result["disk"] == "sda"
    assert read(hw.disk("sda").path, 0, len(data)) == data


def test_an_image_larger_than_the_disk_is_refused(tmp_path, files):
    hw = lab_hardware(tmp_path)
    data = pattern(9 * MiB)
    outcome = execute("write_image", {"url": files.add("/big.raw", data), "checksum": hashlib.sha256(data).hexdigest(),
                                      "root_device_hints": {"serialNumber": "SN-sda"}}, Context(hardware=hw))
    assert not outcome.ok
    assert "larger than the target" in outcome.error


def test_a_missing_image_is_an_error(tmp_path, files):
    outcome = execute("write_image", {"url": files.base + "/nope.raw", "checksum": "0" * 64},
                      Context(hardware=lab_hardware(tmp_path)))
    assert not outcome.ok and "HTTP 404" in outcome.error


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed (apt-get install qemu-utils)")
def test_qcow2_image_is_converted_onto_the_disk(tmp_path, files):
    hw = lab_hardware(tmp_path)
    raw = tmp_path / "src.raw"
    data = pattern(3 * MiB) + bytes(2 * MiB) + pattern(MiB)  # a hole in the middle, as real images have
    raw.write_bytes(data)
    qcow2 = tmp_path / "src.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    image = qcow2.read_bytes()
    disk = hw.disk("nvme0n1")
    fill(disk.path, 0x77, 8 * MiB)  # old content under the hole must be overwritten with zeros
    progress = Recorder()
    outcome = execute("write_image", {"url": files.add("/img.qcow2", image), "checksum": hashlib.sha256(image).hexdigest(),
                                      "checksum_type": "sha256", "format": "qcow2"},
                      Context(hardware=hw, progress=progress, tmp_dir=str(tmp_path)))
    assert outcome.ok, outcome.error
    assert outcome.result["bytes_written"] == len(data)
    assert read(disk.path, 0, len(data)) == data
    assert os.path.getsize(disk.path) == 96 * MiB
    assert progress.percents[-1] == 100
    assert not list(tmp_path.glob("image-*.qcow2"))  # the temporary download is gone


def test_qcow2_without_qemu_img_says_so_and_leaves_the_disk_alone(tmp_path, files, monkeypatch):
    monkeypatch.setattr(image_cmd.shutil, "which", lambda name: None)
    hw = lab_hardware(tmp_path)
    fill(hw.disk("nvme0n1").path, 0x55, MiB)
    outcome = execute("write_image", {"url": files.add("/i.qcow2", b"QFI"), "checksum": "0" * 64, "format": "qcow2"},
                      Context(hardware=hw))
    assert not outcome.ok and "qemu-img is not installed" in outcome.error
    assert read(hw.disk("nvme0n1").path, 0, 4) == b"\x55" * 4
    assert files.requests == []


# -- write_seed --------------------------------------------------------------------------------------

def test_write_seed_then_read_seed_round_trips_behind_the_image(tmp_path, files):
    hw = lab_hardware(tmp_path)
    ctx = Context(hardware=hw)
    data = pattern(4 * MiB)
    assert execute("write_image", {"url": files.add("/i.raw", data), "checksum": hashlib.sha256(data).hexdigest()}, ctx).ok
    user_data = "#cloud-config\nruncmd:\n  - curl -fsSLk \"https://10.0.0.5/node/join?token=abc\" | sh -\n"
    meta_data = "instance-id: gpu-01\nlocal-hostname: gpu-01\n"
    network = "version: 2\nethernets:\n  eno1:\n    dhcp4: true\n"
    outcome = execute("write_seed", {"user_data": user_data, "meta_data": meta_data, "network_config": network}, ctx)
    assert outcome.ok, outcome.error
    disk = hw.disk("nvme0n1")
    assert outcome.result["disk"] == "nvme0n1"
    assert outcome.result["offset"] == disk.size_bytes - 64 * MiB
    assert outcome.result["partition"] == "skipped: not a block device"
    assert seed.read_seed(disk.path) == {"user-data": user_data, "meta-data": meta_data, "network-config": network}
    assert read(disk.path, 0, len(data)) == data  # the image is untouched


def test_seed_without_network_config_and_on_a_blank_disk(tmp_path):
    hw = lab_hardware(tmp_path)
    with pytest.raises(seed.SeedError, match="no ISO9660 volume"):
        seed.read_seed(hw.disk("nvme0n1").path)
    assert execute("write_seed", {"user_data": "#cloud-config\n", "meta_data": ""}, Context(hardware=hw)).ok
    assert seed.read_seed(hw.disk("nvme0n1").path) == {"user-data": "#cloud-config\n", "meta-data": "",
                                                       "network-config": None}


def test_seed_never_overwrites_the_image_just_written(tmp_path, files):
    hw = lab_hardware(tmp_path, disks=(("nvme0n1", 70 * MiB),))
    ctx = Context(hardware=hw)
    data = pattern(8 * MiB)
    assert execute("write_image", {"url": files.add("/i.raw", data), "checksum": hashlib.sha256(data).hexdigest()}, ctx).ok
    outcome = execute("write_seed", {"user_data": "#cloud-config\n", "meta_data": "x: 1\n"}, ctx)
    assert not outcome.ok and "inside the seed region" in outcome.error
    assert read(hw.disk("nvme0n1").path, 0, len(data)) == data


def test_seed_refuses_a_disk_smaller_than_its_region(tmp_path):
    outcome = execute("write_seed", {"user_data": "u", "meta_data": "m", "disk": "sda"}, Context(hardware=lab_hardware(tmp_path)))
    assert not outcome.ok and "too small" in outcome.error


# -- erase_metadata ----------------------------------------------------------------------------------

def test_erase_metadata_zeroes_both_ends_and_leaves_the_middle(tmp_path):
    hw = lab_hardware(tmp_path, disks=(("nvme0n1", 12 * MiB), ("sda", 8 * MiB)))
    for disk in hw.disks():
        fill(disk.path, 0xAB, disk.size_bytes)
    outcome = execute("erase_metadata", {"mib": 2}, Context(hardware=hw))
    assert outcome.ok, outcome.error
    assert [(d["name"], d["bytes_zeroed"]) for d in outcome.result["disks"]] == [("nvme0n1", 4 * MiB), ("sda", 4 * MiB)]
    assert all(isinstance(d["direct_io"], bool) for d in outcome.result["disks"])
    path, size = hw.disk("nvme0n1").path, 12 * MiB
    assert read(path, 0, 2 * MiB) == bytes(2 * MiB)
    assert read(path, size - 2 * MiB) == bytes(2 * MiB)
    assert read(path, 2 * MiB, size - 4 * MiB) == b"\xab" * (size - 4 * MiB)


def test_erase_metadata_falls_back_to_buffered_writes_and_says_so(tmp_path, monkeypatch):
    import agent.disks

    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")  # tmpfs answers O_DIRECT like this
        return real_open(path, flags, *args)

    monkeypatch.setattr(agent.disks.os, "open", no_direct)
    hw = lab_hardware(tmp_path, disks=(("nvme0n1", 12 * MiB), ("sda", 8 * MiB)))
    fill(hw.disk("sda").path, 0xCD, 8 * MiB)
    outcome = execute("erase_metadata", {"disks": ["sda"], "mib": 1}, Context(hardware=hw))
    assert outcome.result == {"disks": [{"name": "sda", "bytes_zeroed": 2 * MiB, "direct_io": False}]}
    assert read(hw.disk("sda").path, 0, MiB) == bytes(MiB)
    assert read(hw.disk("sda").path, 7 * MiB) == bytes(MiB)
    assert read(hw.disk("sda").path, MiB, 6 * MiB) == b"\xcd" * (6 * MiB)


def test_erase_metadata_names_an_unknown_disk(tmp_path):
    outcome = execute("erase_metadata", {"disks": ["sdz"]}, Context(hardware=lab_hardware(tmp_path)))
    assert not outcome.ok and "no such disk: sdz" in outcome.error


def test_unknown_command_is_reported():
    outcome = execute("format_c", {}, Context(hardware=None))
    assert (outcome.ok, outcome.error) == (False, "unknown command: format_c")


# -- the loop against a fake console ------------------------------------------------------------------

def test_agent_looks_up_heartbeats_runs_inspect_and_reports(tmp_path, console, caplog):
    caplog.set_level("DEBUG")
    console.commands.append({"id": "c-1", "name": "inspect", "args": {}})
    cmdline = tmp_path / "cmdline"  # what the iPXE script's kernel line put in /proc/cmdline
    cmdline.write_text(f"console=ttyS0 vmetal.console={console.url} vmetal.boot_secret=s3cret-of-this-boot quiet\n")
    boot = bootconfig.read(str(cmdline))
    agent, thread, box = start_agent(boot.console, lab_hardware(tmp_path), once=True, boot_secret=boot.boot_secret)
    assert finish(agent, thread, box) == 0
    assert console.lookups == [{"macs": [MAC], "boot_id": agent.boot_id, "boot_secret": "s3cret-of-this-boot"}]
    assert "s3cret-of-this-boot" not in caplog.text and "s3cret" not in repr(boot)
    assert console.heartbeats[0] == {"host_id": 12, "status": "idle", "command_id": None, "progress": None, "message": "idle"}
    [result] = console.results
    assert (result["host_id"], result["command_id"], result["ok"], result["error"]) == (12, "c-1", True, None)
    assert result["result"]["nics"][0]["mac"] == MAC
    assert result["result"]["disks"][0]["name"] == "nvme0n1"
    assert "secret-token" not in caplog.text
    assert "running command c-1: inspect" in caplog.text


def test_a_403_makes_the_agent_look_up_again(tmp_path, console):
    console.reject_next = 1
    console.commands.append({"id": "c-1", "name": "inspect", "args": {}})
    agent, thread, box = start_agent(console.url, lab_hardware(tmp_path), once=True)
    assert finish(agent, thread, box) == 0
    assert len(console.lookups) == 2
    assert console.lookups[0]["boot_id"] == console.lookups[1]["boot_id"] == agent.boot_id
    assert console.result_tokens == ["secret-token-2"]


def test_the_console_being_down_at_first_is_retried(tmp_path, caplog):
    caplog.set_level("INFO")
    port = free_port()
    agent, thread, box = start_agent(f"http://127.0.0.1:{port}", lab_hardware(tmp_path), once=True)
    # It tried twice while nothing listened, and waits (the console starts only then: a busy machine's slow
    # thread must not find it up at its first retry).
    wait_for(lambda: "retry 2" in caplog.text, timeout=30)
    assert thread.is_alive()
    fake = FakeConsole(port=port)
    try:
        fake.commands.append({"id": "c-1", "name": "inspect", "args": {}})
        assert finish(agent, thread, box) == 0
        assert [r["command_id"] for r in fake.results] == ["c-1"]
    finally:
        fake.close()
    assert "lookup failed" in caplog.text and "retry 2" in caplog.text


def test_an_unregistered_host_keeps_looking_up(tmp_path, console):
    console.hosts = {}
    agent, thread, box = start_agent(console.url, lab_hardware(tmp_path), once=True)
    wait_for(lambda: console.lookups, timeout=10)  # looked up while unregistered
    console.hosts = {MAC: (7, "gpu-07")}
    console.commands.append({"id": "c-9", "name": "inspect", "args": {}})
    assert finish(agent, thread, box) == 0
    assert len(console.lookups) >= 2
    assert console.results[0]["host_id"] == 7


def test_a_resent_command_is_not_executed_twice(tmp_path, console):
    # The console lost c-1's result and sends c-1 again; then it reboots the host into its OS.
    c1 = {"id": "c-1", "name": "erase_metadata", "args": {"mib": 1}}
    console.commands.extend([c1, c1, {"id": "c-2", "name": "reboot_to_disk", "args": {}}])
    hw = lab_hardware(tmp_path, disks=(("nvme0n1", 8 * MiB),))
    agent, thread, box = start_agent(console.url, hw)
    assert finish(agent, thread, box) == 0  # lab: leaves after reporting reboot_to_disk
    assert agent.executed == ["c-1", "c-2"]
    assert [r["command_id"] for r in console.results] == ["c-1", "c-1", "c-2"]
    assert console.results[0] == console.results[1]
    assert console.results[2]["result"] == {"action": "exit"}


def write_image_slowly(tmp_path, console, files) -> tuple[bytes, list[dict]]:
    """A 4 MiB image served in 16 pieces 0.05 s apart (a write of about 0.8 s): its data and the agent's busy
    heartbeats meanwhile."""
    files.piece_delay = 0.05
    data = pattern(4 * MiB)
    console.commands.append({"id": "c-3", "name": "write_image", "args": {
        "url": files.add("/i.raw", data), "checksum": hashlib.sha256(data).hexdigest(), "checksum_type": "sha256",
        "format": "raw"}})
    agent, thread, box = start_agent(console.url, lab_hardware(tmp_path), once=True)
    assert finish(agent, thread, box) == 0
    return data, [h for h in console.heartbeats if h["status"] == "busy"]


def test_image_write_progress_reaches_the_console_in_busy_heartbeats(tmp_path, console, files):
    data, busy = write_image_slowly(tmp_path, console, files)
    assert busy and all(h["command_id"] == "c-3" for h in busy)
    assert any(h["progress"] is not None and 0 < h["progress"] < 100 for h in busy)
    assert console.results[0]["ok"] is True and console.results[0]["result"]["bytes_written"] == len(data)


@pytest.mark.parametrize("progress_s, fewest, most", [(None, 12, 60), (0.3, 1, 5)])
def test_a_busy_agent_reports_progress_as_often_as_the_console_says(tmp_path, console, files, progress_s, fewest,
                                                                      most):
    console.progress_s = progress_s  # the idle heartbeat stays at 0.03 s
    _, busy = write_image_slowly(tmp_path, console, files)
    assert fewest <= len(busy) <= most


def test_a_failed_command_is_reported_with_its_error(tmp_path, console):
    console.commands.append({"id": "c-4", "name": "gpu_burn", "args": {}})
    agent, thread, box = start_agent(console.url, lab_hardware(tmp_path), once=True)
    assert finish(agent, thread, box) == 0
    assert console.results[0] == {"host_id": 12, "command_id": "c-4", "ok": False, "result": {},
                                  "error": "unknown command: gpu_burn"}


def test_command_line_runs_one_command_and_logs_to_a_file(tmp_path, console):
    hw = lab_hardware(tmp_path)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(hw.profile))
    console.commands.append({"id": "c-1", "name": "inspect", "args": {}})
    log_file = tmp_path / "agent.log"
    proc = subprocess.run(
        [sys.executable, "-m", "agent", "--console", console.url, "--hardware", LAB_HARDWARE,
         "--hardware-arg", str(profile), "--log-file", str(log_file), "--once"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    assert console.results[0]["ok"] is True
    text = log_file.read_text()
    assert "reported command c-1: ok" in text and "reported command c-1: ok" in proc.stderr
    assert "secret-token" not in text + proc.stderr


def test_backoff_doubles_up_to_its_cap():
    backoff = Backoff(initial=1, cap=10)
    delays = [backoff.next() for _ in range(6)]
    assert 0.8 <= delays[0] <= 1 and 1.6 <= delays[1] <= 2 and 8 <= delays[5] <= 10
