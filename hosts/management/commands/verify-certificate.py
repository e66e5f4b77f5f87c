"""python manage.py verify-certificate FILE: is this erase certificate the one this console signed?"""
from django.core.management.base import BaseCommand, CommandError

from hosts import certificates


class Command(BaseCommand):
    help = "Check an erase certificate (the signed JSON from the console): prints valid, or tampered and why."

    def add_arguments(self, parser):
        parser.add_argument("file", help="the downloaded certificate (.json); - reads standard input")

    def handle(self, *args, **options):
        import sys

        path = options["file"]
        try:
            if path == "-":
                text = sys.stdin.buffer.read().decode("utf-8", "replace")
            else:
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        valid, reasons, body = certificates.verify_text(text)
        if valid:
            media = body.get("media") or {}
            self.stdout.write(f"valid: certificate {body.get('certificate_id')} for host "
                              f"{(body.get('host') or {}).get('name')}, {media.get('source')}, serial "
                              f"{media.get('serial')}: {(body.get('sanitization') or {}).get('method')} erase, result "
                              f"{body.get('result')}, previous tenant {body.get('previous_tenant') or 'none'}; signed "
                              f"with key {certificates.key_id()}")
            return
        self.stdout.write("tampered: " + "; ".join(reasons))
        raise SystemExit(1)
