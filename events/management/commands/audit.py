"""python manage.py audit export [--since WHEN] [--until WHEN] [--format jsonl|csv] [--output FILE]"""
from django.core.management.base import BaseCommand, CommandError

from events.audit import audit_between, audit_rows, audit_text, parse_moment


class Command(BaseCommand):
    help = ("The audit trail (docs/audit.md): `export` writes people's changes, secret reads and security events "
            "from --since up to --until (ISO 8601 dates or times, UTC unless they say), oldest first, as JSON lines "
            "or CSV, to standard output or --output.")

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        export = actions.add_parser("export", help="write the audit rows of a time range")
        export.add_argument("--since", help="from this moment on (included)")
        export.add_argument("--until", help="up to this moment (excluded)")
        export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
        export.add_argument("--output", help="a file to write (default: standard output)")

    def handle(self, *args, action, since, until, format, output, **options):
        try:
            since = parse_moment(since) if since else None
            until = parse_moment(until) if until else None
        except ValueError as error:
            raise CommandError(str(error)) from None
        if since and until and until <= since:
            raise CommandError("--until must come after --since")
        chunks = audit_text(audit_rows(audit_between(since, until).iterator(chunk_size=1000)), format)
        if output:
            with open(output, "w", encoding="utf-8", newline="") as f:
                f.writelines(chunks)
        else:
            for chunk in chunks:
                self.stdout.write(chunk, ending="")
