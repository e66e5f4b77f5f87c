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
def decide(tenant_id: int) -> dict:
    """One decision for one tenant's Pending pods (enqueued by its watcher's batch, a claim that ended, the sweep)."""
    result = services.tenant_decide(tenant_id=tenant_id)
    return {"launched": len(result.launched), "placed": len(result.placed), "waiting": len(result.waiting),
            "unservable": len(result.unservable), "skipped": result.skipped}


@shared_task(name=task_names.DECIDE_WAITING)
def decide_waiting() -> int:
    """Beat: the tenants whose pods wait (or were not decided) are decided again, each in its own task."""
    tenant_ids = services.tenants_to_decide()
    for tenant_id in tenant_ids:
        decide.delay(tenant_id=tenant_id)
    return len(tenant_ids)


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
