"""python manage.py backup DIR: the database as a pg_dump directory, then a new epoch, so a restore of it is known."""
import json
import os
import subprocess

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.utils import timezone

from hosts.restore import db_epoch, epoch_turn, world_epoch

MANIFEST = "vmetal-backup.json"


def pg_environment() -> tuple[list[str], dict]:
    """The connection arguments of pg_dump and pg_restore, and their environment: the password in PGPASSWORD, never
    in argv."""
    if connection.vendor != "postgresql":
        raise CommandError("backup and restore need PostgreSQL (pg_dump, pg_restore); a SQLite database is one file: "
                           "copy it while the console is stopped")
    db = connection.settings_dict
    args = ["--dbname", db["NAME"], "--username", db["USER"] or "postgres"]
    if db.get("HOST"):
        args += ["--host", db["HOST"]]
    if db.get("PORT"):
        args += ["--port", str(db["PORT"])]
    env = dict(os.environ)
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = db["PASSWORD"]
    return args, env


class Command(BaseCommand):
    help = ("Back up the database with pg_dump --format=directory into DIR (which must not exist), then turn the "
            "console's epoch (in the database and in CERTIFICATE_ARCHIVE_DIR): a database later restored from this "
            "backup differs from the world's epoch, and the console holds every host until it read its real state "
            "(docs/operations.md, Backup and restore).")

    def add_arguments(self, parser):
        parser.add_argument("directory")
        parser.add_argument("--jobs", type=int, default=1, help="pg_dump's parallel jobs")

    def handle(self, *args, directory, jobs, **options):
        if os.path.exists(directory):
            raise CommandError(f"{directory} exists: a backup goes into a new directory")
        connect, env = pg_environment()
        dumped = db_epoch()
        done = subprocess.run(["pg_dump", "--format=directory", "--file", directory, "--jobs", str(jobs), *connect],
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise CommandError(f"pg_dump failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        with open(os.path.join(directory, MANIFEST), "w") as f:
            json.dump({"taken_at": timezone.now().isoformat(), "epoch": dumped}, f, indent=2)
        now = epoch_turn()
        self.stdout.write(f"backup written to {directory} (epoch {dumped[:12]}); the console's epoch is now {now[:12]}")
        if not settings.CERTIFICATE_ARCHIVE_DIR or world_epoch() != now:
            self.stderr.write("warning: CERTIFICATE_ARCHIVE_DIR is not set: a restore of this backup is known only "
                              "when it is made with `manage.py restore`")
