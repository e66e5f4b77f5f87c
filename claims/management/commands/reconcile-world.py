"""python manage.py reconcile-world: re-import archived certificates; held hosts (after a restore) reconciled now."""
from django.core.management.base import BaseCommand

from claims.restore import world_reconcile


class Command(BaseCommand):
    help = ("Re-import the erase certificates of CERTIFICATE_ARCHIVE_DIR the database lacks (refusing any that does "
            "not verify), hold every host if the database was restored from a backup, and reconcile the held hosts "
            "with the world: each host's power from its BMC, every tenant's nodes from its API, then per host: left "
            "alone, adopted, released through the gate, or still held (its BMC or a tenant API did not answer). "
            "bin/run runs it at start; the workers do the same.")

    def handle(self, *args, **options):
        result = world_reconcile(reimport=True)
        if result.restored:
            self.stdout.write("the database was restored from a backup: every host was held")
        self.stdout.write(f"certificates re-imported from the archive: {result.reimported}")
        for name, why in result.refused:
            self.stderr.write(f"refused archived certificate {name}: {why}")
        for d in result.decisions:
            self.stdout.write(f"{d.host}: database {d.database}, power {d.power}, node {d.node or 'none'}: "
                              f"{d.verdict} ({d.reason})")
        if result.held_left:
            self.stdout.write(f"{result.held_left} host(s) still held; tried again by the workers")
