"""Preflight of many hosts' BMCs against the lab: wall time and console CPU per host, at bounded concurrency.

    .venv/bin/python bench/preflight.py [--hosts 1000] [--concurrency 2,8] [--shared-port]

Its own PostgreSQL database (`vmetal_bench_preflight`, dropped and created each run; DATABASE_URL to change). One
sushy-tools emulator (lab/redfish.py) serves every system; each host's BMC address is the system on its own port
(as real BMCs each have theirs), or with --shared-port all on the emulator's one port. The boot path's URLs are a
stub on loopback (asked once per run: they are the same for every host). For each concurrency the whole fleet is
preflighted once through hosts.preflight.hosts_preflight, the code the beat, the host action and `manage.py
preflight` run: every BMC read (service root, system, NICs, virtual media) and every row written."""
import argparse
import http.server
import os
import resource
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("DATABASE_URL", "postgres://root@127.0.0.1:5432/vmetal_bench_preflight")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _setup

USER, PASSWORD = "admin", "bench-bmc-password"


class _BootStub(http.server.BaseHTTPRequestHandler):
    """The agent listener's answers that preflight asks for: 404 for the probe MAC, 200 for the ramdisk."""

    def do_GET(self):
        ramdisk = self.path.startswith("/images/")
        self.send_response(200 if ramdisk else 404)
        self.end_headers()
        self.wfile.write(b"x" if ramdisk else b"no ramdisk boot waiting for this MAC address\n")

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def _cpu_s(pid: int | None = None) -> float:
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--concurrency", default="2,8", help="comma separated: one full run per value")
    parser.add_argument("--shared-port", action="store_true", help="every BMC on the emulator's one port")
    args = parser.parse_args()

    _setup.fresh_database()
    from django.conf import settings
    from django.db import connection

    from hosts.models import BareMetalHost
    from hosts.preflight import hosts_preflight
    from lab.redfish import RedfishLab

    stub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BootStub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    settings.AGENT_BOOT_URL = f"http://127.0.0.1:{stub.server_port}"
    settings.AGENT_KERNEL_URL = f"{settings.AGENT_BOOT_URL}/images/vmlinuz"
    settings.AGENT_INITRD_URL = f"{settings.AGENT_BOOT_URL}/images/initrd"
    settings.PREFLIGHT_RAMDISK_CHECK = True

    names = [f"bench-{i:05d}" for i in range(args.hosts)]
    macs = [f"52:54:10:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}" for i in range(args.hosts)]
    started = time.monotonic()
    with RedfishLab([{"name": n, "mac": m} for n, m in zip(names, macs)], USER, PASSWORD,
                    startup_timeout=300) as lab:
        print(f"lab: {args.hosts} systems up in {time.monotonic() - started:.1f} s "
              f"({'one shared port' if args.shared_port else 'a port each'})")
        BareMetalHost.objects.bulk_create([
            BareMetalHost(name=n, boot_mac=m, state="available", bmc_username=USER, bmc_password=PASSWORD,
                          bmc_address=lab.system_address(n, shared=args.shared_port))
            for n, m in zip(names, macs)], batch_size=500)
        emulator = lab._proc.pid
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            BareMetalHost.objects.update(preflight_ok=None, preflight_checked_at=None, bmc_ok=None,
                                         bmc_checked_at=None)
            hosts = list(BareMetalHost.objects.order_by("pk"))
            queries_before = len(connection.queries) if settings.DEBUG else None
            cpu0, lab_cpu0, t0 = _cpu_s(), _cpu_s(emulator), time.monotonic()
            results = hosts_preflight(hosts=hosts, actor="bench", concurrency=concurrency)
            wall, cpu, lab_cpu = time.monotonic() - t0, _cpu_s() - cpu0, _cpu_s(emulator) - lab_cpu0
            red = [r for r in results if not r["ok"]]
            print(f"concurrency {concurrency}: {len(results)} hosts in {wall:.1f} s wall "
                  f"({wall / len(results) * 1000:.1f} ms per host, {len(results) / wall:.0f} hosts/s); "
                  f"console CPU {cpu:.1f} s ({cpu / len(results) * 1000:.1f} ms per host); "
                  f"emulator CPU {lab_cpu:.1f} s; {len(red)} red"
                  + (f" (first: {red[0]['host']}: {red[0]['reason']})" if red else "")
                  + (f"; {len(connection.queries) - queries_before} queries" if queries_before is not None else ""))
    stub.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
