"""python manage.py restore DIR: a backup of `manage.py backup` back into the database, every host held."""
import os
import subprocess

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from hosts.gate.archive import certificates_reimport
from hosts.restore import hosts_hold

from .backup import MANIFEST, pg_environment


class Command(BaseCommand):
    help = ("Restore the database from DIR (a `manage.py backup` directory) with pg_restore --clean, with every "
            "console process stopped; then hold every host (no flow, no power action) and re-import the archived "
            "erase certificates. The first worker to start reconciles the held hosts with the world: each host's "
            "BMC and every tenant's nodes are read before any host is acted on (`manage.py reconcile-world` does it "
            "at once).")

    def add_arguments(self, parser):
        parser.add_argument("directory")

    def handle(self, *args, directory, **options):
        if not os.path.isfile(os.path.join(directory, "toc.dat")):
            raise CommandError(f"{directory} is not a pg_dump directory (no toc.dat)")
        if not os.path.isfile(os.path.join(directory, MANIFEST)):
            self.stderr.write(f"warning: {directory} has no {MANIFEST}: not made by `manage.py backup`")
        connect, env = pg_environment()
        connection.close()  # pg_restore drops and makes the tables again
        done = subprocess.run(["pg_restore", "--clean", "--if-exists", "--single-transaction", "--no-owner",
                               *connect, directory], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise CommandError(f"pg_restore failed ({done.returncode}), the database is as it was: "
                               f"{done.stderr.strip()[-2000:]}")
        held = hosts_hold(reason=f"the database was restored from {os.path.basename(directory.rstrip('/'))}",
                          actor="system:restore")
        archive = certificates_reimport()
        self.stdout.write(f"restored from {directory}; {held} host(s) held until their real state is read; "
                          f"{len(archive.imported)} archived certificate(s) re-imported")
        for name, why in archive.refused:
            self.stderr.write(f"refused archived certificate {name}: {why}")
        self.stdout.write("start the console (its workers reconcile the held hosts), or run "
                          "`manage.py reconcile-world`")
