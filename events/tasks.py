"""The Event log's periodic work: pruning audit rows past AUDIT_RETENTION_DAYS (events.audit) and routine step
events past EVENT_RETENTION_DAYS (events.retention)."""
from celery import shared_task

from . import task_names
from .audit import audit_prune
from .retention import events_prune


@shared_task(name=task_names.PRUNE_AUDIT)
def prune_audit() -> int:
    return audit_prune()


@shared_task(name=task_names.PRUNE_EVENTS)
def prune_events() -> int:
    return events_prune()
