"""python manage.py preflight [--host NAME ...] [--environment NS/NAME] [--json]"""
import json

from django.core.management.base import BaseCommand, CommandError

from hosts.models import BareMetalHost
from hosts.preflight import environment_hosts_q, hosts_preflight
from pools.models import NodeEnvironment


class Command(BaseCommand):
    help = ("Preflight now, in this process: each host's BMC network (Redfish with its credentials, TLS, the "
            "system, the boot MAC, the BMC's quirks) and provisioning network (its DHCP/boot entry, the boot route "
            "and the ramdisk answer). All hosts (not retired), the hosts named with --host, or a NodeEnvironment's "
            "hosts (--environment NAMESPACE/NAME). Prints one line per host; exits 1 when any is red.")

    def add_arguments(self, parser):
        parser.add_argument("--host", action="append", default=[], metavar="NAME")
        parser.add_argument("--environment", metavar="NAMESPACE/NAME")
        parser.add_argument("--json", action="store_true", help="the results as JSON")
        parser.add_argument("--actor", default="admin:cli")

    def handle(self, *args, **options):
        hosts = BareMetalHost.objects.exclude(state="retired")
        if options["host"]:
            hosts = BareMetalHost.objects.filter(name__in=options["host"])
            missing = sorted(set(options["host"]) - set(hosts.values_list("name", flat=True)))
            if missing:
                raise CommandError(f"no host {', '.join(missing)}")
        if options["environment"]:
            namespace, _, name = options["environment"].rpartition("/")
            environment = NodeEnvironment.objects.filter(namespace=namespace or "p-default", name=name).first()
            if environment is None:
                raise CommandError(f"no NodeEnvironment {options['environment']!r} (give NAMESPACE/NAME)")
            hosts = hosts.filter(environment_hosts_q(environment))
        results = hosts_preflight(hosts=list(hosts.order_by("name")), actor=options["actor"])
        if options["json"]:
            self.stdout.write(json.dumps(results, indent=2, sort_keys=True))
        else:
            for r in results:
                tls = r["bmc"].get("tls") or "-"
                verdict = {True: "green", False: "red"}.get(r["ok"], "not recorded")
                line = f"{r['host']}: {verdict} (TLS {tls})"
                self.stdout.write(line + (f": {r['reason']}" if r["reason"] else ""))
            red = sum(1 for r in results if r["ok"] is False)
            self.stdout.write(f"{len(results)} host{'s' if len(results) != 1 else ''} checked, {red} red")
        if any(r["ok"] is False for r in results):
            raise SystemExit(1)
