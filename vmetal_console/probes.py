"""Probes for Kubernetes and load balancers: `/healthz` (the process answers) and `/readyz` (it can do its work: the
database answers, its migrations are applied, the broker answers, the keys read this database), on the public
listener and on the agent listener alike; `manage.py probe` asks the same of workers and beat."""
# Answered by the first middleware, before the Host check (a kubelet's probe names the pod's address, which is in
# no ALLOWED_HOSTS), the HTTPS redirect, sessions and authentication: cheap, unauthenticated, and saying nothing
# a passer-by could use (a check's name and a short reason, never an address or an exception's text).
import logging
import time
from pathlib import Path

from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.http import JsonResponse

log = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 3
HEALTH_PATH, READY_PATH = "/healthz", "/readyz"
_expected_migrations: set[tuple[str, str]] | None = None


def _database() -> str:
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        log.warning("readiness: the database does not answer: %s", exc.__class__.__name__)
        return "database unreachable"
    return ""


def _migrations() -> str:
    """The leaf migrations this code ships, read from disk once per process, must be recorded as applied."""
    global _expected_migrations
    if _expected_migrations is None:
        _expected_migrations = set(MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes())
    try:
        applied = set(MigrationRecorder(connections["default"]).applied_migrations())
    except DatabaseError:
        return "migrations unknown (database unreachable)"
    missing = sorted(f"{app}.{name}" for app, name in _expected_migrations - applied)
    if missing:
        return f"migrations not applied: {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''} (manage.py migrate)"
    return ""


def _broker() -> str:
    from vmetal_console.celery import app

    if settings.CELERY_BROKER_URL.startswith("filesystem://"):
        folder = Path(settings.CELERY_BROKER_TRANSPORT_OPTIONS["data_folder_in"])
        return "" if folder.is_dir() else "broker folder missing"
    try:
        with app.connection_for_write(connect_timeout=BROKER_TIMEOUT_S) as connection:
            connection.ensure_connection(max_retries=0, timeout=BROKER_TIMEOUT_S)
    except Exception as exc:  # kombu raises the transport's own errors (redis, amqp, OSError)
        log.warning("readiness: the broker does not answer: %s", exc.__class__.__name__)
        return "broker unreachable"
    return ""


def _keys() -> str:
    from vmetal_console.checks import TAG

    errors = [e for e in checks.run_checks(tags=[TAG]) if e.is_serious()]
    return f"keys check failed ({', '.join(e.id for e in errors)}; manage.py check names it)" if errors else ""


def readiness() -> dict[str, str]:
    """Each check's reason for not being ready, '' when it passes. The database first: without it the others
    say little."""
    found = {"database": _database()}
    found["migrations"] = _migrations() if not found["database"] else "not checked (database unreachable)"
    found["broker"] = _broker()
    found["keys"] = _keys() if not found["database"] else "not checked (database unreachable)"
    return found


def not_ready_reason(found: dict[str, str]) -> str:
    return "; ".join(reason for reason in found.values() if reason)


class ProbeMiddleware:
    """GET or HEAD /healthz and /readyz, on whichever listener; every other request goes on."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path not in (HEALTH_PATH, READY_PATH) or request.method not in ("GET", "HEAD"):
            return self.get_response(request)
        if request.path == HEALTH_PATH:
            return JsonResponse({"status": "ok"})
        started = time.monotonic()
        found = readiness()
        reason = not_ready_reason(found)
        body = {"status": "not ready" if reason else "ready", "checks": {k: v or "ok" for k, v in found.items()},
                "took_s": round(time.monotonic() - started, 3)}
        if reason:
            body["reason"] = reason
        return JsonResponse(body, status=503 if reason else 200, headers={"Cache-Control": "no-store"})
