"""python manage.py delete -f FILE [-f FILE ...] [--tenant NAME] [--dry-run] [--ignore-not-found]"""
import sys

from django.core.management.base import BaseCommand, CommandError

from events.services import cli_actor
from manifests.delete import delete_files
from manifests.source import ManifestError, read_sources


class Command(BaseCommand):
    help = ("Delete the objects that manifests name (kubectl-style): hosts, Secrets, providers with their node "
            "types, node types, environments, images, tenants and a vcluster.yaml's pools. All or nothing.")

    def add_arguments(self, parser):
        parser.add_argument("-f", "--filename", action="append", required=True, dest="files",
                            help="manifest file, or - for standard input; repeatable")
        parser.add_argument("--tenant", help="tenant whose pools a vcluster.yaml names")
        parser.add_argument("--dry-run", action="store_true", help="show what would be deleted; delete nothing")
        parser.add_argument("--ignore-not-found", action="store_true",
                            help="an object that does not exist is no error (it is skipped)")

    def handle(self, *args, files, tenant, dry_run, ignore_not_found, **options):
        try:
            sources = read_sources(files, sys.stdin)
        except OSError as exc:
            raise CommandError(f"{exc.filename}: {exc.strerror}") from None
        try:
            lines = delete_files(sources, actor=cli_actor(), tenant=tenant, dry_run=dry_run,
                                 ignore_not_found=ignore_not_found)
        except ManifestError as exc:
            raise CommandError(str(exc)) from None
        for line in lines:
            self.stdout.write(line)
