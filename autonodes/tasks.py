"""Celery tasks of Auto Nodes: thin, idempotent, safe to run twice."""
from celery import shared_task

from . import disruption, launches, roll, services, task_names


@shared_task(name=task_names.DISRUPT)
def disrupt() -> dict:
    """Celery beat's disruption pass (AUTONODES_DISRUPT_EVERY_S): empty, underutilized, expired and drifted
    nodes of dynamic pools given back within their budgets."""
    result = disruption.pools_disrupt()
    return {"tenants": len(result.tenants), "skipped": result.skipped, "released": result.released,
            "replacing": result.replacing, "blocked": len(result.blocked)}


@shared_task(name=task_names.DECIDE)
def decide(tenant_id: int | None = None, tenant_ids: list[int] | None = None) -> dict:
    """A pass of decisions for the tenants' Pending pods (services.tenants_decide): one tenant for its watcher's
    closed batch; the tenants of claims that ended together."""
    ids = [*([tenant_id] if tenant_id is not None else []), *(tenant_ids or [])]
    return _summary(services.tenants_decide(tenant_ids=ids))


@shared_task(name=task_names.DECIDE_WAITING)
def decide_waiting() -> dict:
    """Beat: the tenants whose pods wait (or were not decided) are decided again, in one pass (the fleet's
    NodeTypes, free hosts and launch deadlines read once for all of them)."""
    return _summary(services.tenants_decide(tenant_ids=services.tenants_to_decide()))


def _summary(decisions: dict) -> dict:
    return {"tenants": len(decisions), "launched": sum(len(d.launched) for d in decisions.values()),
            "placed": sum(len(d.placed) for d in decisions.values()),
            "waiting": sum(len(d.waiting) for d in decisions.values()),
            "unservable": sum(len(d.unservable) for d in decisions.values()),
            "skipped": sum(1 for d in decisions.values() if d.skipped)}


@shared_task(name=task_names.CHECK_LAUNCHES)
def check_launches() -> list[str]:
    """Beat: dynamic pools' claims past their launch deadline, reported once (never relaunched)."""
    return launches.launches_check()


@shared_task(name=task_names.ROLL)
def roll_pools() -> dict:
    """Celery beat's roll pass (AUTONODES_ROLL_EVERY_S): static pools' drifted nodes replaced within their budgets."""
    result = roll.pools_roll()
    return {"tenants": len(result.tenants), "skipped": result.skipped, "drifted": len(result.drifted),
            "replacing": result.replacing, "reimaging": result.reimaging, "released": result.released,
            "held": result.held}
