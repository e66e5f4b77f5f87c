"""Counters that every process of the console adds to and /metrics reads (vmetal_console/metrics.py): kept in Redis
(REDIS_URL), so a count made by a worker on one machine is read by a web process on another, and outlives the
processes. Without Redis (the embedded mode) nothing is counted. A count that cannot be written is lost, never an
error of the work it counts."""
import logging

from django.conf import settings

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5
PREFIX = "vmetal:counter:"
BMC_REQUESTS = "bmc_requests"  # BMC operations by result (hosts/apps.py counts them)
_client = None


def _redis():
    global _client
    if _client is None and settings.REDIS_URL:
        import redis

        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    return _client


def counter_add(name: str, label: str, n: int = 1) -> None:
    client = _redis()
    if client is None:
        return
    try:
        client.hincrby(PREFIX + name, label, n)
    except Exception as exc:  # redis' own errors: Redis away or slow
        log.debug("counter %s not counted: %s", name, exc.__class__.__name__)


def counters_read(name: str) -> dict[str, int]:
    client = _redis()
    if client is None:
        return {}
    try:
        return {k.decode(): int(v) for k, v in client.hgetall(PREFIX + name).items()}
    except Exception as exc:
        log.warning("counters %s not read: %s", name, exc.__class__.__name__)
        return {}
