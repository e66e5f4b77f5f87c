"""Celery tasks for machines of external providers: thin, idempotent, safe to run twice."""
from celery import shared_task

from hosts.restore import world_check

from . import task_names
from .services import machine_advance, machine_power_send, machines_reconcile


@shared_task(name=task_names.RECONCILE_MACHINES)
def reconcile_machines() -> dict:
    if not world_check():  # after a restore nothing is made or released before the world reconcile ran
        return {}
    return machines_reconcile()


@shared_task(name=task_names.ADVANCE_MACHINE)
def advance_machine(machine_id: int) -> str:
    return machine_advance(machine_id=machine_id)


@shared_task(name=task_names.POWER_MACHINE)
def power_machine(machine_id: int, request_id: int) -> str:
    return machine_power_send(machine_id=machine_id, request_id=request_id)
