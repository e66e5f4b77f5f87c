"""python manage.py verify-certificate FILE [--public-key PEM_FILE]: whether this console (or the key)
signed this erase certificate and still stands by it."""
# python manage.py verify-certificate FILE [--public-key PEM_FILE]: is this erase certificate one this console
# (or the key in PEM_FILE) signed, and does the console still stand by it (not revoked: signed from a boot found
# raced afterwards)? With --public-key the check needs nothing of the console: no database, no secret, and so it
# cannot tell a revoked certificate.
import json
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from hosts.gate import certificates
from hosts.models import EraseCertificate


class Command(BaseCommand):
    help = ("Check an erase certificate (the signed JSON from the console): prints valid, or tampered and why. "
            "Checked against the console's public keys, or those in --public-key.")
    requires_system_checks = []  # a check needs no database and no secret key

    def add_arguments(self, parser):
        parser.add_argument("file", help="the downloaded certificate (.json); - reads standard input")
        parser.add_argument("--public-key", metavar="PEM_FILE",
                            help="check with these public keys only (one or more PEM blocks, e.g. the console's "
                                 "/certificates/signing-keys.pem)")

    def handle(self, *args, **options):
        public_keys = None
        if options["public_key"]:
            try:
                with open(options["public_key"]) as f:
                    public_keys = certificates.public_keys_from_pem(f.read(), options["public_key"])
            except OSError as exc:
                raise CommandError(f"cannot read {options['public_key']}: {exc.strerror}") from None
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        path = options["file"]
        try:
            if path == "-":
                text = sys.stdin.buffer.read().decode("utf-8", "replace")
            else:
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
        try:
            valid, reasons, body = certificates.verify_text(text, public_keys)
        except ValueError as exc:  # CERTIFICATE_VERIFY_KEYS holds something that is not a public key
            raise CommandError(str(exc)) from None
        if valid and not options["public_key"]:
            revoked = _revoked(body.get("certificate_id"))
            if revoked:
                self.stdout.write(f"revoked: certificate {body.get('certificate_id')} is signed by this console, "
                                  f"which no longer stands by it: {revoked}")
                raise SystemExit(1)
        if valid:
            media = body.get("media") or {}
            host = (body.get("host") or {}).get("name")
            # The media's source names the host too ("bare-metal host gpu-03, disk /dev/sda"): the host once.
            source = str(media.get("source") or "").removeprefix(f"bare-metal host {host}, ")
            self.stdout.write(f"valid: certificate {body.get('certificate_id')} for host {host}, {source}, serial "
                              f"{media.get('serial')}: {(body.get('sanitization') or {}).get('method')} erase, result "
                              f"{body.get('result')}, previous tenant {body.get('previous_tenant') or 'none'}; signed "
                              f"with key {json.loads(text)['signature']['key_id']}")
            return
        self.stdout.write("tampered: " + "; ".join(reasons))
        raise SystemExit(1)


def _revoked(certificate_id) -> str:
    """Why the console revoked this certificate ('' when it did not, or it is not in this console's database)."""
    if not isinstance(certificate_id, str) or not certificate_id:
        return ""
    try:
        cert = EraseCertificate.objects.filter(document__certificate_id=certificate_id).first()
    except DatabaseError:
        return ""
    if cert is None or cert.revoked_at is None:
        return ""
    return f"revoked at {cert.revoked_at:%Y-%m-%d %H:%M:%S} UTC: {cert.revoked_reason}"
