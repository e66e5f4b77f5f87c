"""Sending Celery tasks by name: an app asks for work of another without importing it (pools asks claims'
reconciler to run), and a broker outage is logged, not fatal: the periodic tasks catch up."""
import logging

from celery import current_app
from django.db import transaction

log = logging.getLogger(__name__)


def task_send(name: str, **kwargs) -> None:
    try:
        current_app.send_task(name, kwargs=kwargs, retry=True,
                              retry_policy={"max_retries": 2, "interval_start": 0.2})
    except Exception:
        log.warning("could not enqueue %s; the periodic tasks will catch up", name, exc_info=True)


def task_send_on_commit(name: str, **kwargs) -> None:
    """After the current transaction commits, so that the worker sees what it committed."""
    transaction.on_commit(lambda: task_send(name, **kwargs))
