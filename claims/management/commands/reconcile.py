"""python manage.py reconcile: one pass of the pool reconciler and the allocator."""
from django.core.management.base import BaseCommand

from claims.reconcile import pools_reconcile
from hosts.services import hosts_sweep_overdue


class Command(BaseCommand):
    help = "Reconcile every static pool once: create or release claims, allocate hosts, sweep overdue hosts."

    def handle(self, *args, **options):
        swept = hosts_sweep_overdue()
        result = pools_reconcile(actor="cli:reconcile")
        for name in swept:
            self.stdout.write(f"host {name}: deadline exceeded, moved to error")
        for name in result.created:
            self.stdout.write(f"claim {name} created")
        for name in result.released:
            self.stdout.write(f"claim {name} released")
        for claim, host in result.allocated.items():
            self.stdout.write(f"claim {claim} allocated host {host}")
        for claim, why in result.pending.items():
            self.stdout.write(f"claim {claim} pending: {why}")
        for name in result.tenants_deleted:
            self.stdout.write(f"tenant {name} deleted: every claim released")
        if not (swept or result.created or result.released or result.allocated or result.pending
                or result.tenants_deleted):
            self.stdout.write("nothing to do")
