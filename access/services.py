"""Making, using and revoking API tokens (the API, the admin and `manage.py token` all come here), and the service
users automation holds them for."""
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core import scoping
from events.choices import EventKind, ObjectType
from events.services import event_record
from pools.models import Tenant
from pools.services import membership_add

from .durations import parse_duration
from .models import PREFIX_LENGTH, ApiToken

SERVICE_ROLES = (scoping.ADMIN, scoping.AUDITOR, scoping.MEMBER)
LAST_USE_EVERY = timedelta(minutes=1)


class TokenRefused(ValidationError):
    """A token that may not be made as asked: the message says why; nothing was made."""


def token_lifetime(expires: str | None) -> timedelta:
    """The lifetime asked for (a duration such as 12h), the default when none, never past the maximum."""
    try:
        longest = parse_duration(settings.API_TOKEN_EXPIRES_MAX)
        seconds = parse_duration(expires) if expires else min(parse_duration(settings.API_TOKEN_EXPIRES_DEFAULT),
                                                                longest)
    except ValueError as error:
        raise TokenRefused(str(error)) from None
    if seconds > longest:
        raise TokenRefused(f"expires {expires}: longer than the most a token may live "
                           f"(API_TOKEN_EXPIRES_MAX {settings.API_TOKEN_EXPIRES_MAX})")
    return timedelta(seconds=seconds)


def token_create(*, user, actor: str, name: str | None = None, expires: str | None = None, read_only: bool = False,
                 tenants=(), made_with: ApiToken | None = None) -> tuple[ApiToken, str]:
    """A new named key for `user`; the user's other tokens are untouched (a name in use is refused, not
    replaced; no name: "token", "token-2", ... whichever is free). `tenants` limits it to some of a member's tenants. Made with a token (`made_with`), it is no
    broader than that one: read only if it is, within its tenants, expiring no later. Returns the token and its
    key: the caller shows the key this once, nothing can show it again. TokenRefused says why not."""
    name = _free_name(user) if name is None else name.strip()
    if not name or len(name) > 64:
        raise TokenRefused("a token's name: 1 to 64 characters")
    now = timezone.now()
    expires_at = now + token_lifetime(expires)
    tenants = list(tenants)
    if tenants:
        if scoping.role(user) != scoping.MEMBER:
            raise TokenRefused(f"an {scoping.role(user)}'s token sees every tenant: a tenant limit is for members")
        outside = sorted(t.name for t in tenants if not scoping.may_see_tenant(user, t))
        if outside:
            raise TokenRefused(f"{user.get_username()} is not a member of {', '.join(outside)}")
    if made_with is not None:
        if made_with.read_only and not read_only:
            raise TokenRefused("a read-only token makes read-only tokens only")
        own = set(made_with.tenants.values_list("pk", flat=True))
        if own and not tenants:
            tenants = list(made_with.tenants.all())  # no broader: the maker's tenants, unless narrowed further
        elif own and not {t.pk for t in tenants} <= own:
            raise TokenRefused("a tenant-limited token makes tokens for its own tenants only")
        if expires_at > made_with.expires_at:
            if expires:
                raise TokenRefused(f"expires {expires}: after the token that makes it "
                                   f"({made_with.expires_at.isoformat()})")
            expires_at = made_with.expires_at
    if ApiToken.objects.filter(user=user, name=name).exists():
        raise TokenRefused(f"{user.get_username()} has a token named {name!r}: revoke it first, or choose another name")
    key = secrets.token_hex(32)
    while ApiToken.objects.filter(prefix=key[:PREFIX_LENGTH]).exists():
        key = secrets.token_hex(32)  # prefixes name tokens: one in use is drawn again
    scope = "read-only" if read_only else "read-write"
    limit = f", tenants {', '.join(sorted(t.name for t in tenants))}" if tenants else ""
    with transaction.atomic():
        token = ApiToken.objects.create(user=user, prefix=key[:PREFIX_LENGTH], key_hash=ApiToken.hash(key), name=name,
                                        read_only=read_only, expires_at=expires_at)
        token.tenants.set(tenants)
        event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name=user.username, actor=actor,
                     message=f"API token {token.prefix}… made ({name}, {scope}{limit}, "
                             f"expires {expires_at.isoformat(timespec='seconds')})",
                     data={"after": {"prefix": token.prefix, "name": name, "scope": scope,
                                     "tenants": sorted(t.name for t in tenants),
                                     "expires_at": expires_at.isoformat()}})
    return token, key


def _free_name(user) -> str:
    taken = set(ApiToken.objects.filter(user=user).values_list("name", flat=True))
    return next(n for n in ("token", *(f"token-{i}" for i in range(2, len(taken) + 3))) if n not in taken)


def token_revoke(*, token: ApiToken, actor: str) -> None:
    with transaction.atomic():
        token.delete()
        event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name=token.user.username, actor=actor,
                     message=f"API token {token.prefix}… revoked",
                     data={"before": {"prefix": token.prefix, "name": token.name, "scope": token.scope}})


def token_used(token: ApiToken, now=None) -> None:
    """Record a use, at most once a minute (one UPDATE, and none on most calls)."""
    now = now or timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USE_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


def service_user_create(*, username: str, role: str, tenant_name: str | None = None, actor: str):
    """The user automation acts as, made when missing: an admin (staff), an auditor (the auditors group) or a
    member of `tenant_name`, with no password (it signs in with its token only). A user that exists already is
    taken as it is if it has that role (and that tenant); otherwise ValidationError, and nothing changes."""
    if role not in SERVICE_ROLES:
        raise ValidationError(f"role {role!r}: expected one of {', '.join(SERVICE_ROLES)}")
    if role == scoping.MEMBER and not tenant_name:
        raise ValidationError("a member belongs to a tenant: give --tenant NAME")
    if role != scoping.MEMBER and tenant_name:
        raise ValidationError(f"an {role} sees every tenant: --tenant is for members only")
    tenant = None
    if tenant_name:
        tenant = Tenant.objects.filter(name=tenant_name).first()
        if tenant is None:
            raise ValidationError(f"no tenant {tenant_name!r}")
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.filter(username=username).first()
        if user is not None:
            if scoping.role(user) != role:
                raise ValidationError(f"user {username!r} exists and is {scoping.role(user)}, not {role}")
            if tenant is not None and not user.tenant_memberships.filter(tenant=tenant).exists():
                raise ValidationError(f"user {username!r} exists and is not a member of {tenant.name!r}")
            return user
        user = User(username=username, is_staff=role == scoping.ADMIN)
        user.set_unusable_password()
        try:
            user.full_clean()
        except ValidationError as error:
            raise ValidationError("; ".join(f"{field}: {' '.join(msgs)}"
                                            for field, msgs in error.message_dict.items())) from None
        user.save()
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.USER, object_name=username, actor=actor,
                     message=f"service user made ({role}{f' of {tenant.name}' if tenant else ''}; no password)")
        if role == scoping.AUDITOR:
            user.groups.add(Group.objects.get_or_create(name=scoping.AUDITORS_GROUP)[0])
        if tenant is not None:
            membership_add(tenant=tenant, user=user, actor=actor)
    return user
