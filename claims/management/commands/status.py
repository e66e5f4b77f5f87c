"""python manage.py status [--json]"""
import json

from django.core.management.base import BaseCommand

from claims.selectors import fleet_status


class Command(BaseCommand):
    help = "Hosts by state, claims by phase per tenant and pool, NodeType capacity."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="machine-readable output (see README)")

    def handle(self, *args, **options):
        status = fleet_status()
        if options["json"]:
            self.stdout.write(json.dumps(status, indent=2))
            return
        hosts = status["hosts"]
        self.stdout.write(f"Hosts: {hosts['total']}")
        for state, n in hosts["by_state"].items():
            if n:
                self.stdout.write(f"  {state:<15} {n}")
        if hosts["warm"]:
            self.stdout.write(f"  of which warm   {hosts['warm']} (available, on in the agent's ramdisk: a claim "
                              "writes its image at once)")
        self.stdout.write("\nNodeTypes:                  total   cost  hosts (each in one column of the capacity), or "
                          "an external provider's machines")
        for t in status["node_types"]:
            c = t["capacity"]
            if c.get("machines"):  # an external provider's type: its kind's capacity, its live machines
                total = "no limit" if c["total"] is None else c["total"]
                columns = f"{c['claimed']} machine(s) claimed" + (f"; provider: {c['provider_error']}" if c["provider_error"] else "")
            else:
                total = c["total"]
                columns = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in c.items()
                                    if name != "total" and n) or "none"
            self.stdout.write(f"  {t['name']:<24} {total:>8} {t['cost']:>6}  {columns}")
        self.stdout.write("\nTenants and pools:")
        for tenant in status["tenants"]:
            self.stdout.write(f"  {tenant['name']} ({tenant['namespace']})")
            for pool in tenant["pools"]:
                phases = ", ".join(f"{p} {n}" for p, n in pool["claims"].items() if n) or "no claims"
                want = f"quantity {pool['quantity']}" if pool["kind"] == "static" else "dynamic"
                self.stdout.write(f"    {pool['name']:<16} {want:<12} {phases}")
