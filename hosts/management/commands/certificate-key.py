"""python manage.py certificate-key generate|public: a new signing key for a rotation, and the public keys."""
from django.core.management.base import BaseCommand, CommandError

from core import keys
from hosts.gate import certificates


class Command(BaseCommand):
    help = ("generate: print a new Ed25519 private key (PEM) for CERTIFICATE_SIGNING_KEY; public: print the public "
            "keys that verify this console's erase certificates (current and retired), as /certificates/"
            "signing-keys.pem publishes them")
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["generate", "public"])

    def handle(self, *args, action, **options):
        if action == "generate":
            self.stdout.write(keys.new_signing_key(), ending="")
            return
        try:
            self.stdout.write(certificates.published_keys(), ending="")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
