"""Provisioning real virtual machines: the lab's QEMU servers (TCG) provisioned end to end, per step.

  .venv/bin/python bench/vm.py [--vms 1,4] [--write-mib 128] [--rounds 3] [--skip-provision] [--skip-write]

(a) For each N of --vms, a fresh database, the console as in production (`manage.py agent-listener`, one Celery
    worker with beat) and a lab of N VM servers (lab/vm.py) with the images of lab/vmimage.py (built or reused from
    the cache): the N servers registered (inspected, erased: `secure`, the NVMe's Format NVM), then a tenant's pool
    set to N and the time until every claim is Available (the makespan), with the console's per-step timings
    (power on → agent lookup → write image → seed → reboot → node Ready), then the pool set to 0 and the time
    until every server is available again (drain, delete, erase, verify). Against the seed's lab figure: about
    4 minutes per provision, mostly the image write. The ratio makespan(N) / makespan(1) says what N TCG guests
    sharing this machine's cores cost.
(b) The image write inside one VM: the ramdisk booted with `vmetal.writebench` (lab/vmguest/writebench.py) runs
    the agent's `write_image` of a --write-mib MiB image from the host over HTTP onto /dev/nvme0n1 (checksum
    verified), and `wget | dd bs=4M oflag=direct` of the same download, alternately, --rounds times each, in the
    same boot. Reports agent / dd throughput (target ≥ 0.9).
"""
import argparse
import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _setup import ROOT, fresh_database, percentile

from lab.vm import GUEST_HOST, site_manifests

os.environ["DATABASE_URL"] = os.environ.get("VM_DATABASE_URL", "postgres://root@127.0.0.1:5432/vmetal_bench_vm")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/2")
MiB = 1024 * 1024
# TCG on shared cores: bounded, generous deadlines (tests/test_vm_e2e.py uses the same).
# BOOT_SETTLE_S: 60 s as in the VM tests unless set; under TCG at 1 VM the iPXE fetch came 5.8-6.3 s after the
# power-on request (the console's own rule, p95 × 1.5 + 2 s, would make that 11.5 s), the agent's lookup 18-33 s.
DEADLINES = {"BOOT_SETTLE_S": os.environ.get("BOOT_SETTLE_S", "60"),
             "AGENT_LOOKUP_DEADLINE_S": "300", "AGENT_COMMAND_DEADLINE_S": "300", "AGENT_SILENCE_S": "60",
             "NODE_READY_DEADLINE_S": "300", "IMAGE_WRITE_DEADLINE_S": "600", "ERASE_DEADLINE_S": "600",
             "VERIFY_DEADLINE_S": "600", "POWER_STEP_DEADLINE_S": "60", "POWER_DEADLINE_S": "20",
             "POWER_POLL_S": "0.5", "NODE_READY_POLL_S": "2", "DRIVE_STALE_EVERY_S": "2", "DRAIN_DEADLINE_S": "20",
             "DRAIN_GRACE_S": "1", "DRAIN_POLL_S": "1"}
STEPS = ("power_on_pxe", "agent_lookup", "check_tenant_api", "write_image", "write_seed", "reboot_to_disk",
         "boot_from_disk", "node_ready", "node_labels")
POOL = """\
privateNodes:
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: vmetal-os
      static:
        - name: vms
          quantity: {n}
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: vm-server
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def images():
    from lab import vmimage

    result = vmimage.build(list(vmimage.TARGETS))
    print(f"images: built {result.built or 'nothing'}, reused {result.reused or 'nothing'} in {result.seconds:.1f} s")
    return result


class Console:
    """The agent listener (what the VMs boot from and their agents call, at 10.0.2.2 as they see it) and one
    Celery worker with beat, as in production."""

    def __init__(self, image_dir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.guest_url = f"http://{GUEST_HOST}:{self.port}"
        self.logs = Path(tempfile.mkdtemp(prefix="vmetal-vm-bench-"))
        env = {**os.environ, **DEADLINES, "LOG_LEVEL": "WARNING", "DEBUG": "False", "IMAGE_DIR": str(image_dir),
               "AGENT_LISTEN": f"127.0.0.1:{self.port}", "AGENT_BOOT_URL": self.guest_url,
               "AGENT_BOOT_CHECK_URL": self.url, "CELERY_BEAT_SCHEDULE_FILENAME": str(self.logs / "beat")}
        os.environ.update({k: env[k] for k in ("IMAGE_DIR", "AGENT_BOOT_URL", "AGENT_BOOT_CHECK_URL")})
        self.procs = [
            subprocess.Popen([sys.executable, "manage.py", "agent-listener", "--bind", f"127.0.0.1:{self.port}"],
                             cwd=ROOT, env=env, stdout=open(self.logs / "web.log", "w"),  # noqa: SIM115
                             stderr=subprocess.STDOUT, start_new_session=True),
            subprocess.Popen([sys.executable, "-m", "celery", "-A", "vmetal_console", "worker", "-P", "threads",
                              "-c", "8", "-B",
                              "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning"],
                             cwd=ROOT, env=env, stdout=open(self.logs / "worker.log", "w"),  # noqa: SIM115
                             stderr=subprocess.STDOUT, start_new_session=True)]
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.procs[0].poll() is not None:
                    raise RuntimeError((self.logs / "web.log").read_text()[-3000:]) from None
                time.sleep(0.2)
        time.sleep(3)  # the worker connects

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def wait(what: str, done, timeout: float, report) -> float:
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"{what}: not within {timeout:.0f} s: {report()}")
        time.sleep(1)
    return time.monotonic() - started


def provision(n: int, build, timeout: float) -> dict:
    fresh_database()
    from django.core.management import call_command
    from django.db.models import Count

    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost
    from lab import vmimage
    from lab.site import LabSite
    from manifests.apply import apply_files
    from pools.models import NodePool, NodeType, Tenant
    from pools.services import pool_set_quantity, tenant_set_api

    image_dir = Path(tempfile.mkdtemp(prefix="vmetal-vm-bench-images-"))
    vmimage.copy_out(build, image_dir)
    checksum = build.path(vmimage.OS_IMAGE + ".sha256").read_text().split()[0]
    console = Console(image_dir)
    var_dir = Path(tempfile.mkdtemp(prefix="vmetal-vm-bench-lab-"))
    site = LabSite(hosts=0, vms=n, tenants=["bench"], console_url=console.url, var_dir=var_dir,
                   power_delay=(0.2, 0.2), disk_bytes=256 * MiB).start()

    def hosts():
        return dict(BareMetalHost.objects.values_list("state").annotate(Count("pk")))

    def claims():
        return dict(NodeClaim.objects.values_list("phase").annotate(Count("pk")))

    try:
        call_command("apply", "-f", str(ROOT / "demo" / "site.yaml"), verbosity=0)
        apply_files([("vm-site", site_manifests(f"{console.guest_url}/images/{vmimage.OS_IMAGE}", checksum))], actor="bench")
        site.register()
        NodeType.objects.filter(name="vm-server").update(cleaning_policy="secure", cleaning_fallback="full")
        server = site.tenants["bench"]
        tenant_set_api(tenant=Tenant.objects.get(name="bench"), api_endpoint=f"{GUEST_HOST}:{server.port}",
                       kubeconfig=server.kubeconfig(), actor="bench")
        registered = wait("registration", lambda: BareMetalHost.objects.filter(state="available").count() == n,
                          timeout, hosts)
        apply_files([("pool", POOL.format(n=n))], actor="bench", tenant="bench")
        makespan = wait("provisioning", lambda: NodeClaim.objects.filter(phase="Available").count() == n,
                        timeout, claims)
        steps: dict[str, list[float]] = {}
        for step, duration in Event.objects.filter(kind="step", message="done", data__flow="provision") \
                .values_list("step", "duration_s"):
            steps.setdefault(step, []).append(duration)
        pool_set_quantity(pool=NodePool.objects.get(name="vms"), quantity=0, actor="bench")
        released = wait("release", lambda: BareMetalHost.objects.filter(state="available").count() == n and
                        not NodeClaim.objects.exclude(phase="Released").exists(), timeout, hosts)
        erase = [d for d in Event.objects.filter(kind="step", message="done", data__flow="deprovision", step="erase")
                 .values_list("duration_s", flat=True)]
        return {"n": n, "registered_s": registered, "makespan_s": makespan, "released_s": released, "steps": steps,
                "erase_s": erase}
    finally:
        site.stop()
        console.stop()
        shutil.rmtree(var_dir, ignore_errors=True)
        shutil.rmtree(image_dir, ignore_errors=True)


def write_benchmark(build, size_mib: int, rounds: int, timeout: float) -> dict:
    """The ramdisk's writebench in one QEMU boot (TCG, 1 vCPU, 512 MiB, an NVMe of size + 64 MiB)."""
    work = Path(tempfile.mkdtemp(prefix="vmetal-writebench-"))
    image = work / "image.raw"
    digest = hashlib.sha256()
    with open(image, "wb") as f:
        for _ in range(size_mib):
            block = os.urandom(MiB)
            digest.update(block)
            f.write(block)
    disk = work / "nvme.raw"
    with open(disk, "wb") as f:
        f.truncate((size_mib + 64) * MiB)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(work), **kw)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://{GUEST_HOST}:{server.server_address[1]}/image.raw"
    log = work / "serial.log"
    argv = ["qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-smp", "1", "-nographic", "-no-reboot",
            "-kernel", str(build.path("vmlinuz")), "-initrd", str(build.path("initrd")),
            "-append", (f"console=ttyS0 panic=-1 quiet vmetal.writebench={url} "
                        f"vmetal.writebench_sha256={digest.hexdigest()} vmetal.writebench_rounds={rounds}"),
            "-drive", f"file={disk},if=none,id=d0,format=raw", "-device", "nvme,serial=VMETAL-BENCH,drive=d0",
            "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile="]
    try:
        with open(log, "wb") as out:
            proc = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        text = log.read_bytes().decode("utf-8", "replace").replace("\r", "")
        match = re.search(r"^=== writebench\n(.*?)^=== end writebench", text, re.DOTALL | re.MULTILINE)
        if not match or proc.returncode != 0:
            raise RuntimeError(f"writebench: no result (QEMU exit {proc.returncode}):\n{text[-3000:]}")
        runs = [json.loads(line) for line in match.group(1).splitlines() if line.startswith("{")]
        errors = [r for r in runs if r.get("error") or r.get("exit")]
        if errors:
            raise RuntimeError(f"writebench: {errors}")
        tools = ("agent", "dd", "sha256")
        by_tool = {tool: [r["bytes"] / r["seconds"] / MiB for r in runs if r["tool"] == tool] for tool in tools}
        return {"size_mib": size_mib, "rounds": rounds, **by_tool}
    finally:
        server.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vms", default="1,4", help="numbers of VMs to provision at once, comma separated")
    parser.add_argument("--write-mib", type=int, default=128, help="the image size for the write benchmark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--skip-provision", action="store_true")
    parser.add_argument("--skip-write", action="store_true")
    args = parser.parse_args()
    if not shutil.which("qemu-system-x86_64"):
        raise SystemExit("qemu-system-x86_64 is not installed (Debian: qemu-system-x86, ipxe-qemu)")
    build = images()
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; QEMU TCG")
    if not args.skip_write:
        result = write_benchmark(build, args.write_mib, args.rounds, args.timeout)
        agent, dd = statistics.median(result["agent"]), statistics.median(result["dd"])
        print(f"\n(b) image write inside one VM, {result['size_mib']} MiB from the host over HTTP onto /dev/nvme0n1, "
              f"{result['rounds']} rounds each, alternately:")
        print(f"  agent write_image (sha256 verified): {', '.join(f'{v:.1f}' for v in result['agent'])} MiB/s, "
              f"median {agent:.1f}")
        print(f"  wget | dd bs=4M oflag=direct:       {', '.join(f'{v:.1f}' for v in result['dd'])} MiB/s, "
              f"median {dd:.1f}")
        sha = result["sha256"][0]
        print(f"  sha256 alone (hashlib, in memory): {sha:.1f} MiB/s")
        print(f"  agent / dd = {agent / dd:.2f} (target ≥ 0.9); dd's time plus the checksum's, one after the other "
              f"on the VM's one vCPU, would be {1 / (1 / dd + 1 / sha):.1f} MiB/s: agent / that = "
              f"{agent / (1 / (1 / dd + 1 / sha)):.2f}")
    if not args.skip_provision:
        results = [provision(int(n), build, args.timeout) for n in args.vms.split(",")]
        print("\n(a) provisioning VMs end to end (seed's lab figure: about 4 min per provision, mostly the image "
              "write)")
        print(f"  {'N':>3} {'register':>9} {'provision':>10} {'release':>8}   per step, p50 (max) s")
        for r in results:
            steps = ", ".join(f"{s} {percentile(r['steps'][s], 50):.1f} ({max(r['steps'][s]):.1f})"
                              for s in STEPS if s in r["steps"])
            print(f"  {r['n']:>3} {r['registered_s']:>8.0f}s {r['makespan_s']:>9.0f}s {r['released_s']:>7.0f}s   "
                  f"{steps}")
        base = results[0]
        for r in results[1:]:
            print(f"  makespan({r['n']}) / makespan({base['n']}) = {r['makespan_s'] / base['makespan_s']:.2f} "
                  f"(release {r['released_s'] / base['released_s']:.2f})")


if __name__ == "__main__":
    main()
