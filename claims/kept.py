"""Hosts held for a pool whose re-image kept data disks (hosts/gate/plan.py): when the hold ends, and the full
erase that follows before any other tenant has the host."""
from django.utils import timezone

from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import hosts_kept_release
from pools.choices import PoolKind

from .choices import ClaimPhase as P
from .models import NodeClaim


def kept_end_reason(host: BareMetalHost, *, now=None) -> str:
    """Why a free host's hold on kept data is over ("" while it holds): its time is up, the pool is gone, the
    pool's tenant is being deleted, or the pool wants no node (no claim of it waits, and a static pool has its
    quantity)."""
    if host.kept_until is None:
        return ""
    pool = host.kept_for_pool
    if pool is None:
        return "the pool it was held for was deleted"
    if host.kept_until <= (now or timezone.now()):
        return f"the hold for pool {pool} ran out at {host.kept_until:%Y-%m-%d %H:%M} UTC"
    if pool.tenant.deleting_since is not None:
        return f"tenant {pool.tenant.name} is being deleted"
    claims = NodeClaim.objects.filter(pool=pool)
    if claims.filter(phase=P.PENDING).exists():
        return ""
    if pool.kind != PoolKind.STATIC:
        return f"pool {pool} waits for no node"
    if claims.exclude(phase=P.RELEASED).count() >= (pool.quantity or 0):
        return f"pool {pool} was scaled down: it has its {pool.quantity} node(s) and waits for none"
    return ""


def kept_holds_end(*, actor: str = "system:kept-disks") -> list[str]:
    """Every available held host whose hold ended goes to the full erase (hosts.services.hosts_kept_release)."""
    now = timezone.now()
    held = BareMetalHost.objects.filter(kept_until__isnull=False, state=HostState.AVAILABLE).select_related(
        "kept_for_pool__tenant")
    ended = {h.pk: why for h in held if (why := kept_end_reason(h, now=now))}
    return hosts_kept_release(ended=ended, actor=actor) if ended else []
