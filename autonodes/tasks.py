"""Celery tasks for Auto Nodes: thin, idempotent, safe to run twice."""
from celery import shared_task

from . import launches


@shared_task(name="autonodes.tasks.check_launches")
def check_launches() -> list[str]:
    """Beat: dynamic pools' claims past their launch deadline, reported once (never relaunched)."""
    return launches.launches_check()
