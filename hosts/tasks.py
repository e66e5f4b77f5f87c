"""Celery tasks for hosts: thin, idempotent."""
from celery import shared_task

from . import services


@shared_task(name="hosts.tasks.sweep_overdue_hosts")
def sweep_overdue_hosts() -> list[str]:
    return services.hosts_sweep_overdue()
