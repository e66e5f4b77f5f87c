"""The pod watchers' leases: each tenant's watch is held by one `watch-pods` process at a time, and moves to another
when its holder stops renewing."""
# A lease is two fields of the tenant's TenantWatch row (holder, held_until), taken and renewed by compare-and-swap
# (an UPDATE whose WHERE says who may) on the database's own clock, so two machines' clocks never disagree about
# it. Each process also says it lives (PodWatcher.seen_until): the live processes share the tenants, each taking at
# most its share, so a second process gets half of them within a poll and a dead one's leases lapse to the others
# after AUTONODES_WATCH_LEASE_S. Each function is one short statement or two; none does network I/O.
import os
import secrets
import socket
from datetime import timedelta

from django.db.models import Q
from django.db.models.functions import Now

from .choices import WatchState
from .models import PodWatcher, TenantWatch


def watcher_name() -> str:
    """This process's name as a holder: its machine, its pid and a random part (a pid is reused after a restart)."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{secrets.token_hex(4)}"


def _until(lease_s: float):
    return Now() + timedelta(seconds=lease_s)


def watcher_alive(*, name: str, shard: str, lease_s: float) -> int:
    """Say that this process lives for lease_s more; → how many watcher processes of its shard live now (this one
    included)."""
    if not PodWatcher.objects.filter(name=name).update(seen_until=_until(lease_s)):
        PodWatcher.objects.create(name=name, shard=shard, seen_until=_until(lease_s))
    PodWatcher.objects.filter(seen_until__lt=Now() - timedelta(seconds=lease_s)).delete()  # long gone
    return max(1, PodWatcher.objects.filter(shard=shard, seen_until__gt=Now()).count())


def watcher_gone(*, name: str) -> None:
    """A process that stops cleanly says so: the others take its share at their next poll."""
    PodWatcher.objects.filter(name=name).delete()


def leases_renew(*, holder: str, tenant_ids, lease_s: float) -> set[int]:
    """Renew the leases `holder` still holds among tenant_ids; → those it holds (a lapsed lease that nobody took
    is still its own)."""
    held = TenantWatch.objects.filter(tenant_id__in=list(tenant_ids), holder=holder)
    held.update(held_until=_until(lease_s))
    return set(held.values_list("tenant_id", flat=True))


def lease_take(*, holder: str, tenant_id: int, lease_s: float) -> bool:
    """Take the tenant's watch if nobody holds it or its holder's lease lapsed; → whether `holder` holds it now."""
    TenantWatch.objects.get_or_create(tenant_id=tenant_id)
    free = Q(holder="") | Q(held_until__isnull=True) | Q(held_until__lt=Now()) | Q(holder=holder)
    return bool(TenantWatch.objects.filter(free, tenant_id=tenant_id).update(holder=holder,
                                                                             held_until=_until(lease_s)))


def lease_release(*, holder: str, tenant_id: int) -> None:
    """Give the tenant's watch up (stopped), if `holder` still holds it."""
    TenantWatch.objects.filter(tenant_id=tenant_id, holder=holder).update(
        holder="", held_until=None, state=WatchState.STOPPED, retry_at=None, updated_at=Now())


def held_watch(*, holder: str, tenant_id: int):
    """The tenant's TenantWatch row, as a queryset that is empty unless `holder` holds it: every write a watcher
    makes goes through it, so one that lost its lease overwrites nothing of the new holder's."""
    return TenantWatch.objects.filter(tenant_id=tenant_id, holder=holder)
