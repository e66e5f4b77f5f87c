"""python manage.py lab --hosts N [--vms N] [--tenants one,two] [--ipmi HOST,...] [--fault HOST=KIND ...]
[--kubevirt [--kubevirt-guests qemu]] [--metal3-cluster N] [--print-manifests]"""
import logging
import os
import shutil
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from lab.redfish import GUEST_HOST
from lab.site import FAULTS, LabSite


class Command(BaseCommand):
    help = "Start the simulated data centre on 127.0.0.1 (BMCs, servers with agents, tenant APIs) and register it."

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=8)
        parser.add_argument("--vms", type=int, default=0,
                            help="QEMU VM servers (vm-01…, node type vm-server) beside the simulated ones; they reach "
                                 "the console as 10.0.2.2: run it with AGENT_BOOT_URL=http://10.0.2.2:PORT")
        parser.add_argument("--gpu-hosts", type=int, help="how many are gpu-servers (default: all but two, half below 4)")
        parser.add_argument("--tenants", default="one", help="comma-separated tenants that get an API of their own")
        parser.add_argument("--ipmi", default="", metavar="HOST|ROLE,...",
                            help="servers whose BMC speaks IPMI (ipmi:// addresses) instead of Redfish: names "
                                 "(cpu-01) or roles (cpu: every cpu-server; ./bin/run gives the demo's cpu-servers IPMI)")
        parser.add_argument("--fault", action="append", default=[], metavar="HOST=KIND",
                            help=f"inject a fault: {', '.join(FAULTS)}; KIND:TARGET for a disk (erase-*, "
                                 "disk-small) or a GPU index (gpu-*, nvlink-slow, xid-intermittent, burnin-fail), "
                                 "e.g. gpu-01=gpu-xid:3. gpu-missing (7 of 8 GPUs) and disk-small (the first NVMe "
                                 "half the size) deviate from the gpu-server SKU; nvlink-slow: NCCL under the "
                                 "threshold; xid-intermittent: an Xid that fails the first DCGM run only; "
                                 "burnin-fail: fails only dcgmi diag -r 3/4 (see lab/site.py)")
        parser.add_argument("--boot-url", "--console-url", dest="console_url", default=settings.AGENT_BOOT_URL,
                            help="the console's agent listener, where the servers fetch their boot configuration "
                                 "and the agents call home (default AGENT_BOOT_URL, %(default)s)")
        parser.add_argument("--power-delay", default="1-11", help="seconds for a power change to land, lo-hi")
        parser.add_argument("--kubevirt", action="store_true",
                            help="also run a KubeVirt cluster (lab/kubevirt.py) for a kubeVirt NodeProvider whose "
                                 "clusterRef.cluster is kubevirt")
        parser.add_argument("--kubevirt-guests", choices=["simulated", "qemu"], default="simulated",
                            help="the KubeVirt cluster's guests: simulated (default), or QEMU VMs booting the lab OS "
                                 "image (built from Debian packages at the first start), which read their NoCloud "
                                 "seed and join by themselves, reaching this host as 10.0.2.2")
        parser.add_argument("--metal3-cluster", type=int, default=0, metavar="N",
                            help="also another site's Metal3 cluster with N BareMetalHosts, and provider lab-metal3 "
                                 "(kind metal3 with a clusterRef) claiming them (docs/providers-metal3-cluster.md)")
        parser.add_argument("--print-manifests", action="store_true",
                            help="print the BareMetalHost manifests the lab registers, then stop")

    def handle(self, *args, **options):
        os.umask(0o077)  # what the lab writes (boot configurations with their secrets, BMC passwords): owner only
        faults = {}
        for item in options["fault"]:
            host, _, kind = item.partition("=")
            if not kind:
                raise CommandError(f"--fault {item!r}: expected HOST=KIND")
            faults[host] = ",".join(filter(None, [faults.get(host), kind]))  # several faults on one host
        lo, _, hi = options["power_delay"].partition("-")
        if options["vms"] < 0 or options["hosts"] < 0:
            raise CommandError("--hosts and --vms must be 0 or more")
        if options["vms"] and not shutil.which("qemu-system-x86_64"):
            raise CommandError("--vms needs qemu-system-x86_64 (Debian: qemu-system-x86, ipxe-qemu)")
        if options["kubevirt_guests"] == "qemu":
            if not options["kubevirt"]:
                raise CommandError("--kubevirt-guests qemu is for the KubeVirt cluster: add --kubevirt")
            if not (shutil.which("qemu-system-x86_64") and shutil.which("qemu-img")):
                raise CommandError("--kubevirt-guests qemu needs qemu-system-x86_64 and qemu-img "
                                   "(Debian: qemu-system-x86, qemu-utils)")
        try:
            site = LabSite(hosts=options["hosts"], gpu_hosts=options["gpu_hosts"], vms=options["vms"],
                           tenants=[t for t in options["tenants"].split(",") if t], faults=faults,
                           console_url=options["console_url"], power_delay=(float(lo), float(hi or lo)),
                           var_dir=settings.VAR_DIR / "lab",
                           ipmi_hosts=ipmi_hosts(options["ipmi"], options["hosts"], options["gpu_hosts"]),
                           kubevirt=options["kubevirt"], kubevirt_guests=options["kubevirt_guests"],
                           metal3_cluster_hosts=options["metal3_cluster"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        logging.getLogger("lab").setLevel(logging.INFO)
        site.start()
        try:
            if options["print_manifests"]:
                self.stdout.write(site.manifests())
                return
            for line in site.register():
                self.stdout.write(line)
            for name, server in site.tenants.items():
                self.stdout.write(f"tenant {name}: Kubernetes API at {server.url}")
            if site.kubevirt is not None:
                self.stdout.write(f"KubeVirt cluster {site.kubevirt.name}: Kubernetes API at {site.kubevirt.url}, its "
                                  f"kubeconfig in ProviderSecret vcluster-platform/{site.kubevirt.name}")
                if site.kubevirt.guests == "qemu":
                    endpoints = ", ".join(f"{name} {GUEST_HOST}:{server.port}" for name, server in site.tenants.items())
                    self.stdout.write(f"KubeVirt guests are QEMU VMs (serial consoles in {site.kubevirt.var_dir}/"
                                      f"guests/*/console.log); they reach this host as {GUEST_HOST}: give a tenant "
                                      f"whose pools use kubeVirt that API endpoint ({endpoints or 'no tenants'})")
            if site.metal3:
                self.stdout.write(f"Metal3 cluster {site.metal3.server.name}: {site.metal3_cluster_hosts} "
                                  f"BareMetalHosts at {site.metal3.server.url}")
            if options["vms"]:
                self.stdout.write(f"VM servers boot from the console at {site.vm_console_url} (QEMU's address of this "
                                  f"host): run the console with AGENT_BOOT_URL={site.vm_console_url} "
                                  f"AGENT_BOOT_CHECK_URL={site.console_url}; serial consoles in "
                                  f"{site.var_dir}/vm-*/console.log")
            self.stdout.write(f"lab running: {len(site.hosts)} servers; Ctrl-C stops it")
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *a: stop.set())
            signal.signal(signal.SIGINT, lambda *a: stop.set())
            stop.wait()
        finally:
            site.stop()


def ipmi_hosts(text: str, hosts: int, gpu_hosts: int | None) -> list[str]:
    """--ipmi's names, a role (gpu, cpu) standing for every server of that role."""
    probe = LabSite(hosts=hosts, gpu_hosts=gpu_hosts)  # names and roles only: nothing is started
    names = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        names += [n for n, h in probe.hosts.items() if h.role == item] if item in ("gpu", "cpu") else [item]
    return names
