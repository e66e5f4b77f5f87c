"""python manage.py export [--include-secrets] [-o FILE]"""
from django.core.management.base import BaseCommand

from events.choices import EventKind, ObjectType
from events.services import cli_actor, event_record
from manifests.export import export_text


class Command(BaseCommand):
    help = "Write every object back as manifests that `apply` accepts. Secrets are redacted unless asked for."

    def add_arguments(self, parser):
        parser.add_argument("--include-secrets", action="store_true",
                            help="write BMC credentials into the Secrets (for a backup or a move)")
        parser.add_argument("-o", "--output", help="file to write (default: standard output)")

    def handle(self, *args, include_secrets, output, **options):
        text = export_text(include_secrets=include_secrets)
        if include_secrets:  # reading secrets is on the record (the audit trail)
            event_record(kind=EventKind.READ, object_type=ObjectType.HOST, object_name="(every host)",
                         actor=cli_actor(), message="export with the BMC credentials (--include-secrets)")
        if output:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:
            self.stdout.write(text, ending="")
