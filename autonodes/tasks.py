"""Celery tasks for Auto Nodes: thin, idempotent, safe to run twice."""
from celery import shared_task


@shared_task(name="autonodes.tasks.decide")
def decide(tenant_id: int) -> None:
    """One scheduling decision for the tenant's pending pods: sent when the tenant's batch window closes
    (autonodes.watcher) and when a claim gives its pods back."""
    # Imported here: autonodes.services comes with the decide part of issue 12.
    from . import services

    services.tenant_decide(tenant_id=tenant_id)
