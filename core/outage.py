"""The answer while the database or Redis is away (a restart, a failover): 503 with Retry-After and a short body,
never a traceback or the 500 page. Both listeners' 500 handlers ask this first (vmetal_console/urls.py,
agent_urls.py): Django calls them for an exception raised anywhere in a request, middleware included."""
import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse
from kombu.exceptions import OperationalError as BrokerError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# An outage, not a defect: what a client may simply try again. Redis carries the cache (the agents' rate limits,
# rechecks) and the broker; the database is PostgreSQL's.
OUTAGE_ERRORS = (OperationalError, InterfaceError, BrokerError, RedisConnectionError, RedisTimeoutError)
RETRY_AFTER_S = 5  # a restart takes seconds; the agents back off by themselves, capped at 10 s

MESSAGE = "the console's database or Redis is unreachable for the moment; try again shortly"
PAGE = ("<!doctype html><title>503 Service Unavailable</title><h1>Service unavailable</h1>"
        f"<p>{MESSAGE}.</p>")


def outage_now() -> bool:
    """The exception being handled is an outage (or is caused by one)."""
    exc = sys.exc_info()[1]
    while exc is not None:
        if isinstance(exc, OUTAGE_ERRORS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def unavailable(request, *, json: bool) -> HttpResponse:
    if json:
        response = JsonResponse({"error": "service unavailable", "detail": MESSAGE}, status=503)
    else:
        response = HttpResponse(PAGE, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER_S)
    response["Cache-Control"] = "no-store"
    return response


def wants_json(request) -> bool:
    return request.path.startswith("/api/") or "json" in request.headers.get("Accept", "")
