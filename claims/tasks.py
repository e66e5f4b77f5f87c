"""Celery tasks for claims: thin, idempotent, safe to run twice."""
from celery import shared_task

from . import services


@shared_task(name="claims.tasks.reconcile_pools")
def reconcile_pools(pool_ids: list[int] | None = None) -> dict:
    result = services.pools_reconcile(pool_ids=pool_ids)
    return {"created": len(result.created), "released": len(result.released), "allocated": len(result.allocated)}
