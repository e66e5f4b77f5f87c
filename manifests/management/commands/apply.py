"""python manage.py apply -f FILE [-f FILE ...] [--tenant NAME] [--dry-run]"""
import sys

from django.core.management.base import BaseCommand, CommandError

from events.services import cli_actor
from manifests.apply import apply_files
from manifests.source import ManifestError, read_sources


class Command(BaseCommand):
    help = "Apply manifests (kubectl-style): multi-document YAML, idempotent, all or nothing."

    def add_arguments(self, parser):
        parser.add_argument("-f", "--filename", action="append", required=True, dest="files",
                            help="manifest file, or - for standard input; repeatable")
        parser.add_argument("--tenant", help="tenant for vcluster.yaml documents (created when missing)")
        parser.add_argument("--dry-run", action="store_true", help="show what would change; change nothing")

    def handle(self, *args, files, tenant, dry_run, **options):
        try:
            sources = read_sources(files, sys.stdin)
        except OSError as exc:
            raise CommandError(f"{exc.filename}: {exc.strerror}") from None
        try:
            result = apply_files(sources, actor=cli_actor(), tenant=tenant, dry_run=dry_run)
        except ManifestError as exc:
            raise CommandError(str(exc)) from None
        for line in result.lines:
            self.stdout.write(line)
