"""The long poll of a warm host's idle agent: its ask for work held open until there is work or
WARM_POLL_S pass."""
# The long poll of a warm host's idle agent (hosts/flows/warm.py): its ask for work is held open by the agent listener
# until there is work for it or WARM_POLL_S pass, so a warm fleet costs the console one request per host every few
# minutes instead of one a second, and a claim still reaches the agent at once.
#
# - `agent_wake(host_id)`: there is work for the host's agent (a command was queued: hosts.engine.agent.agent_command).
#   Published on Redis (REDIS_URL) after the commit; without Redis (the embedded mode) nothing is sent and the
#   waiting side looks at the database every WARM_POLL_TICK_S instead.
# - `agent_wait(host_id, timeout_s, idle, gone)`: hold until woken, `idle()` turns false, the timeout, or `gone()`
#   (the ask's client closed its connection: `client_gone`). It subscribes before it asks `idle()`, so a wake sent
#   between the caller's look at the host and the wait is never missed, and it gives its database connection back
#   before it blocks (a held poll holds no connection of the pool).
# - `client_gone(environ)`: how a held ask notices that its connection closed, from what the WSGI server offers, so
#   that no command is handed to a connection nobody reads (it stays queued for the agent's next ask).
#
# A lost wake (Redis down, restarted) costs no claim: the command waits for the agent's next ask, and the provision
# step's silence check sends a warm host whose agent does not answer down the cold path (claims.steps).
import io
import logging
import os
import socket
import threading
import time
from typing import Callable

import redis
from django.conf import settings
from django.db import connection, transaction

log = logging.getLogger(__name__)
_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def _channel(host_id: int) -> str:
    """Redis' channels span its databases: the console's own database name keeps two consoles (or two test
    runs) on one Redis from waking each other's agents."""
    return f"vmetal:{settings.DATABASES['default']['NAME']}:agent-wake:{host_id}"


def held_key(session_id: int) -> str:
    """The cache key that marks a session's ask as held (one at a time). The cache names its keys by the database
    (vmetal_console/cache_keys.py), so two consoles (or two test runs) on one Redis never count each other's asks."""
    return f"agent-poll:{session_id}"


def _redis() -> redis.Redis | None:
    url = settings.REDIS_URL
    if not url:
        return None
    with _clients_lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10,
                                                 health_check_interval=30)
        return _clients[url]


def agent_wake(host_id: int) -> None:
    """Wake the host's held poll, if any, once the current transaction commits (what it is woken for must be
    visible to the listener's next query)."""
    transaction.on_commit(lambda: _publish(host_id))


def _publish(host_id: int) -> None:
    client = _redis()
    if client is None:
        return
    try:
        client.publish(_channel(host_id), b"1")
    except redis.RedisError as exc:
        log.warning("host %s: agent wake not sent (%s): its agent finds the work at its next ask", host_id, exc)


GONE_CHECK_S = 1.0  # how often a held ask looks at its connection


def agent_wait(host_id: int, timeout_s: float, idle: Callable[[], bool],
               gone: Callable[[], bool] | None = None) -> bool:
    """Hold until the host's agent has work (woken, or `idle()` false), `timeout_s` pass, or `gone()` (the client
    closed the connection: the hold ends early, and the caller gives it nothing). True when woken."""
    deadline = time.monotonic() + timeout_s
    gone = gone or (lambda: False)
    client = _redis()
    if client is not None:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(_channel(host_id))
            if not idle():
                return True
            _release_connection()
            while (left := deadline - time.monotonic()) > 0 and not gone():
                if pubsub.get_message(timeout=min(left, GONE_CHECK_S)) is not None:
                    return True
            return False
        except redis.RedisError as exc:
            log.warning("host %s: agent long poll without Redis (%s): looking at the database instead", host_id, exc)
        finally:
            try:
                pubsub.close()
            except redis.RedisError:
                pass
    while (left := deadline - time.monotonic()) > 0 and not gone():
        if not idle():
            return True
        _release_connection()  # a held poll holds no connection of the pool between two looks
        time.sleep(min(settings.WARM_POLL_TICK_S, GONE_CHECK_S, left))
    return False


def client_gone(environ: dict) -> Callable[[], bool] | None:
    """A check of whether the request's client closed its connection, from what the WSGI server offers: waitress'
    `waitress.client_disconnected`, gunicorn's `gunicorn.socket`, else the socket under `wsgi.input` (Django's own
    threaded server, wsgiref). None when the server offers none: a hold then ends by a wake or its timeout only,
    and a command may be marked sent into a closed connection (its agent's next ask gets it again)."""
    check = environ.get("waitress.client_disconnected")
    if callable(check):
        return check
    sock = environ.get("gunicorn.socket")
    fd = _fileno(sock) if sock is not None else _input_fileno(environ.get("wsgi.input"))
    return None if fd is None else (lambda: _closed(fd))


def _fileno(obj) -> int | None:
    try:
        return obj.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _input_fileno(stream) -> int | None:
    for _ in range(4):  # Django's LimitedStream keeps only its stream's bound read(): follow it to the socket file
        if stream is None:
            return None
        if (fd := _fileno(stream)) is not None:
            return fd
        stream = getattr(getattr(stream, "_read", None), "__self__", None)
    return None


def _closed(fd: int) -> bool:
    """The peer closed (end of stream) or reset the connection. Bytes waiting (a pipelined request) or none yet:
    still there. A peek on a duplicate of the descriptor: nothing is read from the request's socket."""
    try:
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return True
    try:
        return probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        probe.close()


def _release_connection() -> None:
    """Give the request's database connection back while it waits (outside a transaction only; the pool's, or
    a fresh one, serves the queries after the wait)."""
    if not connection.in_atomic_block:
        connection.close()
