"""The bootstrap (join) tokens the console makes for people ("Join Node…" on a tenant's page): one live token per
person and tenant, shown again on the next click rather than minted anew; listed on the tenant's page with whom
it was made for, when, its expiry and whether a node has used it; revoked by deleting it in the tenant's API.
Network I/O happens outside any transaction; the database is written after the tenant API answered."""
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.services import event_record

from .models import JoinToken
from .tenant_api import BootstrapToken, TenantAPI, TenantAPIError

# A token with less life left than this is not shown again: a machine being set up by hand needs some time.
REUSE_MARGIN = timedelta(minutes=10)
LISTED = 50  # the newest on the tenant's page


def tenant_api(tenant, timeout: float | None = None) -> TenantAPI:
    return TenantAPI(tenant.kubeconfig, timeout=timeout or settings.TENANT_API_TIMEOUT_S)


def live_join_token(tenant, user, now=None) -> JoinToken | None:
    now = now or timezone.now()
    return (JoinToken.objects.filter(tenant=tenant, made_for=user, revoked_at__isnull=True,
                                     expires_at__gt=now + REUSE_MARGIN).order_by("-expires_at").first())


def join_token_for(api: TenantAPI, tenant, user, actor: str) -> tuple[BootstrapToken, bool]:
    """The person's live join token for the tenant, or a new one made in its API: (the token, whether reused)."""
    live = live_join_token(tenant, user)
    if live is not None:
        return BootstrapToken(id=live.token_id, secret=str(live.secret), expires_at=live.expires_at), True
    token = api.create_bootstrap_token(ttl_s=settings.BOOTSTRAP_TOKEN_TTL_S,
                                       description=f"manual join by {user.get_username()}")
    JoinToken.objects.create(tenant=tenant, token_id=token.id, secret=token.secret, made_for=user,
                             made_for_name=user.get_username(), expires_at=token.expires_at)
    event_record(kind=EventKind.ACTION, object_type=ObjectType.TENANT, object_name=tenant.name, tenant=tenant,
                 actor=actor, message=f"join token {token.id} created for a manual node",
                 data={"after": {"join_token": token.id, "made_for": user.get_username(),
                                 "expires_at": token.expires_at.isoformat()}})
    return token, False


def join_command_shown(tenant, token_id: str, *, reused: bool, actor: str) -> None:
    """Reading a secret is on the record: the join command carries the token."""
    event_record(kind=EventKind.READ, object_type=ObjectType.TENANT, object_name=tenant.name, tenant=tenant,
                 actor=actor, message=f"join command shown (join token {token_id}{', again' if reused else ''})")


def join_tokens_of(tenant) -> list[JoinToken]:
    return list(JoinToken.objects.filter(tenant=tenant).select_related("tenant")[:LISTED])


def join_tokens_use_refresh(tenant, tokens: list[JoinToken]) -> str:
    """Mark the listed live tokens a node has used (one list of the tenant's CSRs, with the console's short check
    timeout: this runs while a page renders). Returns "" or why it could not tell."""
    now = timezone.now()
    open_ = [t for t in tokens if t.used_at is None and t.revoked_at is None and t.expires_at > now]
    if not open_ or not tenant.kubeconfig:
        return ""
    try:
        used = tenant_api(tenant, timeout=settings.TENANT_API_CHECK_TIMEOUT_S).bootstrap_tokens_used()
    except (TenantAPIError, ValueError) as error:
        return f"whether a node used them is unknown: {error}"
    for token in open_:
        if token.token_id in used:
            JoinToken.objects.filter(pk=token.pk, used_at__isnull=True).update(used_at=now)
            token.used_at = now
    return ""


def join_token_revoke_manual(join_token: JoinToken, actor: str) -> bool:
    """Delete the token in the tenant's API, then record it revoked; False when the API had it no more (expired
    and cleaned up, or deleted there). TenantAPIError/ValueError when the API cannot be asked: nothing changes."""
    tenant = join_token.tenant
    deleted = tenant_api(tenant).delete_bootstrap_token(join_token.token_id)
    now = timezone.now()
    if not JoinToken.objects.filter(pk=join_token.pk, revoked_at__isnull=True).update(revoked_at=now,
                                                                                      revoked_by=actor):
        return deleted  # revoked meanwhile, on the record already
    join_token.revoked_at, join_token.revoked_by = now, actor
    event_record(kind=EventKind.ACTION, object_type=ObjectType.TENANT, object_name=tenant.name, tenant=tenant,
                 actor=actor, message=f"join token {join_token.token_id} (made for {join_token.made_for_name}) revoked"
                                      f"{'' if deleted else '; the tenant API had it no more'}",
                 data={"before": {"join_token": join_token.token_id, "state": "live"},
                       "after": {"join_token": join_token.token_id, "state": "revoked"}})
    return deleted
