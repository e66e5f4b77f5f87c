"""Celery tasks for hosts: thin, idempotent."""
from dataclasses import asdict

from celery import shared_task

from . import preflight, services, task_names
from .engine import drive as engine
from .flows import repair, warm
from .models import BareMetalHost
from .restore import world_check


@shared_task(name=task_names.SWEEP_OVERDUE_HOSTS)
def sweep_overdue_hosts() -> list[str]:
    # Here and below: after a restore nothing acts on a host before the world reconcile read it (hosts/restore.py).
    if not world_check():
        return []
    return services.hosts_sweep_overdue()


# No time limits: the workers run `-P threads`, where Celery enforces none. A drive is bounded by its steps,
# none of which waits (each outside call has its own timeout), and a dead worker's host by DRIVE_LEASE_S.
@shared_task(name=task_names.DRIVE_HOST, acks_late=True)
def drive_host(host_id: int) -> None:
    engine.drive(host_id)


# The same drive, asked for by an agent's call (its lookup, a result) or a boot fetch: sent by its own name so that it
# goes to the agent queue (vmetal_console/queues.py), where drives that wait on BMCs do not hold it up.
@shared_task(name=task_names.DRIVE_HOST_FOR_AGENT, acks_late=True)
def drive_host_for_agent(host_id: int) -> None:
    engine.drive(host_id)


@shared_task(name=task_names.DRIVE_STALE_HOSTS)
def drive_stale_hosts() -> int:
    return len(engine.drive_stale())


# At most once (no acks_late): a reset sent twice is worse than one an admin has to ask for again. The
# service skips a request already answered, should the task be delivered twice anyway.
@shared_task(name=task_names.POWER_CYCLE_HOST, acks_late=False)
def power_cycle_host(host_id: int, request_id: int) -> None:
    if not world_check():
        return
    services.host_power_send(host_id=host_id, request_id=request_id)


# A power cycle, power on or power off (the request's Event says which); at most once, as above.
@shared_task(name=task_names.POWER_HOST, acks_late=False)
def power_host(host_id: int, request_id: int) -> None:
    if not world_check():
        return
    services.host_power_send(host_id=host_id, request_id=request_id)


@shared_task(name=task_names.CHECK_BMCS)
def check_bmcs() -> list[str]:
    return services.hosts_bmc_check_due()


# The periodic preflight: hosts whose last one is older than PREFLIGHT_EVERY_S, PREFLIGHT_BATCH per pass. Each
# preflight is also its host's BMC contact, so check-bmcs skips a host preflight has just heard from.
@shared_task(name=task_names.PREFLIGHT_DUE)
def preflight_due() -> int:
    return len(preflight.hosts_preflight_due())


@shared_task(name=task_names.PREFLIGHT_HOSTS)
def preflight_hosts(host_ids: list[int], actor: str = "system:preflight") -> int:
    hosts = list(BareMetalHost.objects.filter(pk__in=host_ids).order_by("pk"))
    return len(preflight.hosts_preflight(hosts=hosts, actor=actor))


# The repair ladder's next rung (hosts/flows/repair.py), asked for on commit of a move into repair. Idempotent: a second
# delivery finds the rung started (or the host gone on) and does nothing.
@shared_task(name=task_names.REPAIR_ADVANCE, acks_late=True)
def repair_advance(host_id: int) -> str:
    if not world_check():
        return "held: the database was restored"
    return repair.host_repair_advance(host_id=host_id)


@shared_task(name=task_names.REPAIR_DUE)
def repair_due() -> int:
    if not world_check():
        return 0
    return len(repair.hosts_repair_due())


# Warm hosts idle too long, or whose agent went silent: no longer warm, powered off (hosts/flows/warm.py).
@shared_task(name=task_names.SWEEP_WARM_HOSTS)
def sweep_warm_hosts() -> list[str]:
    if not world_check():
        return []
    return warm.hosts_warm_sweep()


# The hosts it started a check on, and why it skipped a NodeType (claims wait for its hosts; hosts back off).
@shared_task(name=task_names.IDLE_CHECKS_START)
def idle_checks_start() -> dict:
    if not world_check():
        return {}
    return asdict(services.hosts_idle_check_start())
