"""Making and revoking API tokens (the API, the admin and `manage.py token` all come here), and the service
users automation holds them for."""
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction

from core import scoping
from events.choices import EventKind, ObjectType
from events.services import event_record
from pools.models import Tenant
from pools.services import membership_add

from .models import PREFIX_LENGTH, ApiToken

SERVICE_ROLES = (scoping.ADMIN, scoping.AUDITOR, scoping.MEMBER)


def token_create(*, user, actor: str) -> tuple[ApiToken, str]:
    """A new key for `user`, replacing any earlier one (which stops working at once). Returns the token and
    its key: the caller shows the key this once, nothing can show it again."""
    key = secrets.token_hex(32)
    while ApiToken.objects.filter(prefix=key[:PREFIX_LENGTH]).exclude(user=user).exists():
        key = secrets.token_hex(32)  # prefixes name tokens: one in use by someone else is drawn again
    with transaction.atomic():
        ApiToken.objects.filter(user=user).delete()
        token = ApiToken.objects.create(user=user, prefix=key[:PREFIX_LENGTH], key_hash=ApiToken.hash(key))
        event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name=user.username, actor=actor,
                     message=f"API token {token.prefix}… made")
    return token, key


def token_revoke(*, token: ApiToken, actor: str) -> None:
    with transaction.atomic():
        token.delete()
        event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name=token.user.username, actor=actor,
                     message=f"API token {token.prefix}… revoked")


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
