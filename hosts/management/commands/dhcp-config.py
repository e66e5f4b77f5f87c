"""python manage.py dhcp-config [--output FILE]: the provisioning network's dnsmasq configuration (hosts/boot/dhcp.py)."""
import os
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from hosts.boot.dhcp import DHCPConfigError, render_config


class Command(BaseCommand):
    help = ("Write the dnsmasq configuration of the provisioning network: one dhcp-host line per host (boot MAC, "
            "name, its claim's address), iPXE chain-loading to the console's per-host script. To stdout, or to FILE "
            "(replaced whole, so a dnsmasq reading it never sees half a file).")

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")

    def handle(self, *args, output=None, **options):
        try:
            text = render_config()
        except DHCPConfigError as exc:
            raise CommandError(str(exc)) from None
        if not output:
            self.stdout.write(text, ending="")
            return
        target = Path(output)
        try:
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except OSError as exc:
            raise CommandError(f"cannot write {output}: {exc.strerror or exc}") from None
        hosts = sum(1 for line in text.splitlines() if line.startswith("dhcp-host="))
        self.stderr.write(f"wrote {output}: {hosts} host(s)")
