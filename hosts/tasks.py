"""Celery tasks for hosts: thin, idempotent."""
from celery import shared_task

from . import flows, services


@shared_task(name="hosts.tasks.sweep_overdue_hosts")
def sweep_overdue_hosts() -> list[str]:
    return services.hosts_sweep_overdue()


@shared_task(name="hosts.tasks.drive_host", acks_late=True, soft_time_limit=240, time_limit=300)
def drive_host(host_id: int) -> None:
    flows.drive(host_id)


@shared_task(name="hosts.tasks.drive_stale_hosts")
def drive_stale_hosts() -> int:
    return len(flows.drive_stale())
