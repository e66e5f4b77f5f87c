"""python manage.py adopt NAME --bmc-address A --bmc-username U --bmc-password-file F --boot-mac M [--tenant T]
[--claim C] [--label k=v ...]"""
import sys

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from claims.restore import AdoptRefused, host_adopt


class Command(BaseCommand):
    help = ("Adopt a server that already runs an OS installed outside the console, as Ironic's adopt does: it is "
            "registered as provisioned, neither powered nor re-imaged, bound to the claim of the tenant node it "
            "serves (a node named NAME). Its BMC must answer with these credentials and show the server on. Its "
            "first release goes through the full release gate. The password is read from a file (- : standard "
            "input), never from the command line.")

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--bmc-address", required=True)
        parser.add_argument("--bmc-username", required=True)
        parser.add_argument("--bmc-password-file", required=True, help="a file holding the password (- : stdin)")
        parser.add_argument("--bmc-disable-certificate-verification", action="store_true")
        parser.add_argument("--boot-mac", required=True)
        parser.add_argument("--tenant", default="", help="the tenant whose node it serves (checked)")
        parser.add_argument("--claim", default="", help="the claim it serves (default: the node's vmetal.dev/claim)")
        parser.add_argument("--label", action="append", default=[], help="a host label, key=value (repeatable)")
        parser.add_argument("--actor", default="admin:cli")

    def handle(self, *args, **o):
        path = o["bmc_password_file"]
        try:
            password = (sys.stdin.read() if path == "-" else open(path).read()).rstrip("\n")
        except OSError as exc:
            raise CommandError(f"cannot read the BMC password file: {exc.strerror}") from None
        labels = {}
        for item in o["label"]:
            key, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"label {item!r} is not key=value")
            labels[key] = value
        values = {"name": o["name"], "bmc_address": o["bmc_address"], "bmc_username": o["bmc_username"],
                  "bmc_password": password, "boot_mac": o["boot_mac"], "labels": labels,
                  "bmc_disable_certificate_verification": o["bmc_disable_certificate_verification"]}
        try:
            host = host_adopt(values=values, actor=o["actor"], tenant=o["tenant"], claim=o["claim"])
        except AdoptRefused as exc:
            raise CommandError(f"not adopted: {exc}") from None
        except ValidationError as exc:
            errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            raise CommandError(f"not adopted: {errors}") from None
        claim = getattr(host, "claim", None)
        self.stdout.write(f"{host.name} adopted as provisioned (not powered, not re-imaged)"
                          + (f", serving claim {claim.name}" if claim else ""))
