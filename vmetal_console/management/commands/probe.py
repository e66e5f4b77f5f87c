"""python manage.py probe ready | worker [--node NAME] | beat [--max-age S]: a Kubernetes exec probe's answer, exit
0 or 1 with one line."""
import socket
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from vmetal_console.probes import not_ready_reason, readiness


class Command(BaseCommand):
    help = ("Probes for processes without an HTTP port (docs/operations.md, \"Probes\"). `ready`: the database "
            "answers, migrations are applied, the broker answers, the keys read this database (what /readyz "
            "says). `worker`: the Celery worker NODE answers a ping through the broker. `beat`: this machine's "
            "beat ticked within --max-age seconds (BEAT_HEARTBEAT_FILE). Exit 0 with `ok …`, else 1 with the reason.")
    requires_system_checks = []  # the probe reports a failing check as its answer, it does not refuse to run

    def add_arguments(self, parser):
        kinds = parser.add_subparsers(dest="kind", required=True)
        kinds.add_parser("ready", help="database, migrations, broker, keys")
        worker = kinds.add_parser("worker", help="the worker answers a ping through the broker")
        worker.add_argument("--node", default=f"celery@{socket.gethostname()}",
                            help="the worker's node name (its -n; default celery@<this host name>)")
        worker.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for its answer (5)")
        beat = kinds.add_parser("beat", help="beat's scheduler ticked lately")
        beat.add_argument("--max-age", type=float, default=120.0,
                          help="seconds since beat's last tick (120; it ticks at least every 10 s)")

    def handle(self, *args, kind, **options):
        if kind == "ready":
            reason = not_ready_reason(readiness())
            self._answer(reason, "ok: ready")
        elif kind == "worker":
            self._answer(self._worker(options["node"], options["timeout"]), f"ok: {options['node']} answers")
        else:
            self._answer(self._beat(options["max_age"]), "ok: beat ticks")

    def _answer(self, reason: str, ok: str) -> None:
        if reason:
            raise CommandError(f"not ok: {reason}", returncode=1)
        self.stdout.write(ok)

    @staticmethod
    def _worker(node: str, timeout: float) -> str:
        from vmetal_console.celery import app

        try:
            replies = app.control.ping(destination=[node], timeout=timeout)
        except Exception as exc:  # the broker's own errors
            return f"broker unreachable ({exc.__class__.__name__})"
        if not any(node in reply for reply in replies):
            return f"worker {node} did not answer a ping within {timeout:g}s"
        return ""

    @staticmethod
    def _beat(max_age: float) -> str:
        path = Path(settings.BEAT_HEARTBEAT_FILE)
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return f"beat has not ticked ({path} missing)"
        if age > max_age:
            return f"beat last ticked {age:.0f}s ago (more than {max_age:g}s)"
        return ""
