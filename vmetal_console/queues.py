"""The Celery queues, one per kind of work, and which task goes to which, so that a slow kind (BMCs that do not
answer) cannot starve another (a pool change's reconcile). docs/operations.md, "Queues", gives each its workers."""
from functools import lru_cache

from kombu import Exchange, Queue

from autonodes import task_names as autonodes_tasks
from claims import task_names as claims_tasks
from events import task_names as events_tasks
from hosts import task_names as hosts_tasks
from machines import task_names as machines_tasks

DRIVES, AGENT, AUTONODES, DEFAULT = "drives", "agent", "autonodes", "celery"
# DEFAULT keeps Celery's own name, so tasks queued before the queues were split are still taken after an upgrade.
KINDS = (DRIVES, AGENT, AUTONODES, DEFAULT)

# Every task not named here goes to DEFAULT: reconciles, claims' follow-ups, and the sweeps and re-drives that only
# read and write the database (they ask for drives; they do not run them).
TASK_KIND = {
    # BMC and flow drives: each call to a BMC may wait BMC_TIMEOUT_S, with retries, and a flow's steps call BMCs.
    **dict.fromkeys([hosts_tasks.DRIVE_HOST, hosts_tasks.POWER_HOST, hosts_tasks.POWER_CYCLE_HOST,
                     hosts_tasks.CHECK_BMCS, hosts_tasks.PREFLIGHT_DUE, hosts_tasks.PREFLIGHT_HOSTS,
                     hosts_tasks.REPAIR_ADVANCE, hosts_tasks.SWEEP_WARM_HOSTS,
                     # After a restore: reads every held host's BMC (and the tenants' APIs) before any acts.
                     claims_tasks.WORLD_RECONCILE,
                     # External providers' machines: each look calls the provider's cluster (or runs OpenTofu).
                     machines_tasks.RECONCILE_MACHINES, machines_tasks.ADVANCE_MACHINE,
                     machines_tasks.POWER_MACHINE], DRIVES),
    # A drive an agent's call asked for (its lookup, a result, a boot fetch): the agent waits for its next command.
    hosts_tasks.DRIVE_HOST_FOR_AGENT: AGENT,
    # Auto Nodes: decisions and disruption read tenants' Kubernetes APIs (TENANT_API_TIMEOUT_S a call).
    # Static pools' drift roll reads them too (a tenant with a drifted node).
    **dict.fromkeys([autonodes_tasks.DECIDE, autonodes_tasks.DECIDE_WAITING, autonodes_tasks.DISRUPT,
                     autonodes_tasks.CHECK_LAUNCHES, autonodes_tasks.ROLL], AUTONODES),
    # Named to say they stay in DEFAULT: each is quick and only touches the database (the join token's revoke: one
    # call with its timeout, retried by countdown, not by waiting).
    **dict.fromkeys([hosts_tasks.SWEEP_OVERDUE_HOSTS, hosts_tasks.DRIVE_STALE_HOSTS, hosts_tasks.REPAIR_DUE,
                     hosts_tasks.IDLE_CHECKS_START, claims_tasks.RECONCILE_POOLS, claims_tasks.REVOKE_JOIN_TOKEN,
                     claims_tasks.PLACE_GROUP_AGAIN, claims_tasks.FREE_LEAKED_ADDRESSES, claims_tasks.END_KEPT_HOLDS,
                     events_tasks.PRUNE_AUDIT, events_tasks.PRUNE_EVENTS],
                    DEFAULT),
}


def queue_name(prefix: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"no queue kind {kind!r}: one of {', '.join(KINDS)}")
    return prefix + kind


@lru_cache(maxsize=256)
def queue(name: str) -> Queue:
    """A queue as both sides declare it: its own direct exchange, routed by its name (what Celery makes of a queue it
    was not told of, so a sender and a worker agree whichever of them declares it first)."""
    return Queue(name, Exchange(name, "direct"), routing_key=name)


def declared(prefix: str) -> list[Queue]:
    """Celery's task_queues: a worker started without -Q consumes every one of them."""
    return [queue(queue_name(prefix, kind)) for kind in KINDS]


def route(name, args=None, kwargs=None, options=None, task=None, **kw) -> dict:
    """Celery's router (task_routes): every task to its kind's queue under the CELERY_QUEUE_PREFIX of now (read at
    each send: a test gives its own worker and its own sends a prefix of their own)."""
    from django.conf import settings

    return {"queue": queue(queue_name(settings.CELERY_QUEUE_PREFIX, TASK_KIND.get(name, DEFAULT)))}
