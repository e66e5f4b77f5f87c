"""Celery tasks for claims: thin, idempotent, safe to run twice."""
from celery import shared_task

from . import ipam, services, steps
from .tenant_api import TenantAPIError


@shared_task(name="claims.tasks.reconcile_pools")
def reconcile_pools(pool_ids: list[int] | None = None) -> dict:
    result = services.pools_reconcile(pool_ids=pool_ids)
    return {"created": len(result.created), "released": len(result.released), "allocated": len(result.allocated)}


# A claim that lost its host may have left a join token in its tenant's API: delete it, retrying a while
# when the tenant API is away (the token also expires by itself after BOOTSTRAP_TOKEN_TTL_S).
@shared_task(name="claims.tasks.revoke_join_token", autoretry_for=(TenantAPIError,), retry_backoff=5,
             max_retries=6)
def revoke_join_token(claim_id: int, token_id: str) -> None:
    steps.claim_revoke_join_token(claim_id=claim_id, token_id=token_id)


@shared_task(name="claims.tasks.place_group_again")
def place_group_again(group_id: int, placements: int) -> list[str]:
    return services.claim_group_place_again(group_id=group_id, placements=placements)


# Addresses whose claim is gone or holds no host (deleted behind the console's back): freed with an Event each;
# claims waiting for an address may take one now.
@shared_task(name="claims.tasks.free_leaked_addresses")
def free_leaked_addresses() -> dict:
    freed = ipam.addresses_free_leaked()
    if freed:
        services.allocate_soon()
    return {"freed": freed}
