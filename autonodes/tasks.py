"""Celery tasks of Auto Nodes: thin, idempotent, safe to run twice."""
from celery import shared_task

from . import disruption


@shared_task(name="autonodes.tasks.disrupt")
def disrupt() -> dict:
    """Celery beat's disruption pass (AUTONODES_DISRUPT_EVERY_S): empty, underutilized, expired and drifted
    nodes of dynamic pools given back within their budgets."""
    result = disruption.pools_disrupt()
    return {"tenants": len(result.tenants), "skipped": result.skipped, "released": result.released,
            "replacing": result.replacing, "blocked": len(result.blocked)}
