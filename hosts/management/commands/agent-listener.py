"""`manage.py agent-listener [--bind ADDRESS:PORT]`: serve the agent listener (the agent protocol, the boot
path, the OS images) and nothing else, apart from the public console."""
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from hosts.protocol.listener import bind_mismatch, serve


class Command(BaseCommand):
    help = "Serve the agent listener: /agent/*, /boot/* and /images/* only. Bind it to the provisioning network."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.AGENT_LISTEN,
                            help=f"ADDRESS:PORT to listen on (default AGENT_LISTEN, {settings.AGENT_LISTEN})")

    def handle(self, *args, bind: str, **options):
        address, _, port = bind.rpartition(":")
        if not address or not port.isdigit():
            raise CommandError(f"--bind {bind!r}: expected ADDRESS:PORT, e.g. 10.0.0.1:8001")
        mismatch = bind_mismatch(bind, boot_url_set=bool(os.environ.get("AGENT_BOOT_URL")))
        if mismatch:
            raise CommandError(f"the agent listener does not start: {mismatch}")
        self.stdout.write(f"agent listener on http://{bind}/ (agent protocol, boot path, images; "
                          f"{settings.AGENT_LISTENER_THREADS} threads, "
                          f"{settings.AGENT_LISTENER_CONNECTIONS} connections at most)")
        self.stdout.flush()
        serve(host=address.strip("[]"), port=int(port))
