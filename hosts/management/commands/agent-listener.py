"""`manage.py agent-listener [--bind ADDRESS:PORT]`: serve the agent listener (the agent protocol, the boot
path, the OS images) and nothing else, apart from the public console."""
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler


class QuietHandler(WSGIRequestHandler):
    """One line per request that failed; a fleet's heartbeats would drown the log otherwise."""

    def log_message(self, format, *args):
        if args and str(args[1] if len(args) > 1 else "").startswith(("4", "5")):
            super().log_message(format, *args)


class Command(BaseCommand):
    help = "Serve the agent listener: /agent/*, /boot/* and /images/* only. Bind it to the provisioning network."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=settings.AGENT_LISTEN,
                            help=f"ADDRESS:PORT to listen on (default AGENT_LISTEN, {settings.AGENT_LISTEN})")

    def handle(self, *args, bind: str, **options):
        from hosts.listener import AgentListener

        address, _, port = bind.rpartition(":")
        if not address or not port.isdigit():
            raise CommandError(f"--bind {bind!r}: expected ADDRESS:PORT, e.g. 10.0.0.1:8001")
        self.stdout.write(f"agent listener on http://{bind}/ (agent protocol, boot path, images)")
        server = ThreadedWSGIServer((address.strip("[]"), int(port)), QuietHandler, ipv6=":" in address)
        server.daemon_threads = True
        server.set_app(AgentListener())
        server.serve_forever()

