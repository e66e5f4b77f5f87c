"""Celery tasks for claims: thin, idempotent, safe to run twice."""
from celery import shared_task

from hosts.restore import world_check

from . import ipam, kept, steps, task_names
from .allocation import allocate_soon
from .reconcile import claim_group_place_again, pools_reconcile
from .restore import world_reconcile as reconcile_with_world
from .tenant_api import TenantAPIError


@shared_task(name=task_names.RECONCILE_POOLS)
def reconcile_pools(pool_ids: list[int] | None = None) -> dict:
    if not world_check():  # after a restore no claim takes a host before the world reconcile read the hosts
        return {}
    result = pools_reconcile(pool_ids=pool_ids)
    return {"created": len(result.created), "released": len(result.released), "allocated": len(result.allocated)}


# A claim that lost its host may have left a join token in its tenant's API: delete it, retrying a while
# when the tenant API is away (the token also expires by itself after BOOTSTRAP_TOKEN_TTL_S).
@shared_task(name=task_names.REVOKE_JOIN_TOKEN, autoretry_for=(TenantAPIError,), retry_backoff=5, max_retries=6)
def revoke_join_token(claim_id: int, token_id: str) -> None:
    steps.claim_revoke_join_token(claim_id=claim_id, token_id=token_id)


@shared_task(name=task_names.PLACE_GROUP_AGAIN)
def place_group_again(group_id: int, placements: int) -> list[str]:
    return claim_group_place_again(group_id=group_id, placements=placements)


# Addresses whose claim is gone or holds no host (deleted behind the console's back): freed with an Event each;
# claims waiting for an address may take one now.
@shared_task(name=task_names.FREE_LEAKED_ADDRESSES)
def free_leaked_addresses() -> dict:
    freed = ipam.addresses_free_leaked()
    if freed:
        allocate_soon()
    return {"freed": freed}


# After a restore (hosts/restore.py), and at every worker's start: held hosts go where their real state says; the
# archived erase certificates the database lacks are re-imported. Idempotent; what stays held is asked again later.
@shared_task(name=task_names.WORLD_RECONCILE)
def world_reconcile(reimport: bool = True) -> dict:
    result = reconcile_with_world(reimport=reimport)
    return {"restored": result.restored, "decided": len(result.decisions) - result.held_left,
            "held": result.held_left, "reimported": result.reimported, "refused": len(result.refused)}


# A host held for a pool whose re-image kept its data disks: once the hold ends, the full erase (claims/kept.py).
@shared_task(name=task_names.END_KEPT_HOLDS)
def end_kept_holds() -> dict:
    return {"erasing": kept.kept_holds_end()}
