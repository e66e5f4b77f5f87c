"""One lock order for rows locked together, and a bounded retry of the transactions PostgreSQL kills anyway.

The lock order, everywhere rows of these tables are locked in one transaction:

    tenant → its pools, by id → hosts, by id → claims, by id

(hosts before claims because the allocator and the flows lock a host and then move its claim; a release
locks its claims' hosts before it moves the claims). A tenant is locked FOR NO KEY UPDATE
(`select_for_update(no_key=True)`), never FOR UPDATE unless it is deleted: every insert of a row that points
at a tenant (a claim, an Event) checks the foreign key with FOR KEY SHARE, which FOR UPDATE blocks and
FOR NO KEY UPDATE does not: a tenant locked FOR UPDATE by a quantity change, while a reconcile that holds
the pool inserts a claim of that tenant, deadlocks the two.

Lock order makes deadlocks rare; it cannot make them impossible (an apply of several tenants locks them
in document order; PostgreSQL's own locks on index pages). `retry_on_deadlock` runs a service again when
PostgreSQL aborted it as a deadlock victim or a serialization failure: only at the service boundary, the
outermost transaction. Inside someone else's transaction it retries nothing (the whole transaction is
lost; its owner retries)."""
import functools
import logging
import random
import time

from django.db import DatabaseError, connection

log = logging.getLogger(__name__)

# SQLSTATE: 40P01 deadlock_detected, 40001 serialization_failure (Django wraps psycopg's error; the
# original is the __cause__).
RETRIED_SQLSTATES = frozenset({"40P01", "40001"})


def is_deadlock(exc: BaseException) -> bool:
    """Whether PostgreSQL aborted the transaction as a deadlock victim or for a serialization failure."""
    while exc is not None:
        if getattr(exc, "sqlstate", None) in RETRIED_SQLSTATES:
            return True
        exc = exc.__cause__
    return False


def retry_on_deadlock(attempts: int = 3, backoff_s: float = 0.05, also: tuple[type[Exception], ...] = ()):
    """Run the decorated service again (up to `attempts` times in all, after a short jittered pause) when
    its transaction was killed by a deadlock or a serialization failure, or raised one of `also` (a
    compare-and-swap that lost, for a service that is safe to run again). Put it outside
    `@transaction.atomic`, on services whose whole effect is in the database (a retry repeats them)."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if connection.in_atomic_block:
                return fn(*args, **kwargs)  # not the boundary: the enclosing transaction is lost too
            for attempt in range(1, attempts + 1):
                try:
                    return fn(*args, **kwargs)
                except (DatabaseError, *also) as exc:
                    if attempt == attempts or not (isinstance(exc, also) or is_deadlock(exc)):
                        raise
                    log.info("%s: %s; trying again (%d of %d)", fn.__qualname__, _first_lines(exc),
                             attempt + 1, attempts)
                    time.sleep(random.uniform(0.5, 1.5) * backoff_s * attempt)

        return wrapper

    return decorate


def _first_lines(exc: BaseException) -> str:
    """The error and where PostgreSQL met it (the CONTEXT line names the table), on one line."""
    lines = str(exc).splitlines()
    return " | ".join(lines[:1] + [line for line in lines[1:] if line.startswith("CONTEXT")])
