"""Giving people their roles: `manage.py user create`, and the roles an identity provider's groups map to at
each sign-in (access.oidc). The rule of what each role may do is core.scoping's; this only assigns them.

A role is one of ROLES: the platform's (admin, operator, auditor) or a tenant's (tenant-admin, tenant-viewer,
each of named tenants)."""
import re
import secrets
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import transaction

from core import scoping
from events.choices import EventKind, ObjectType
from events.services import event_record, object_update
from pools.models import Tenant, TenantMembership
from pools.services import membership_add, membership_remove

ADMIN, OPERATOR, AUDITOR = scoping.ADMIN, scoping.OPERATOR, scoping.AUDITOR
TENANT_ADMIN, TENANT_VIEWER = "tenant-admin", "tenant-viewer"
PLATFORM_ROLES = (ADMIN, OPERATOR, AUDITOR)  # strongest first: one person holds the strongest they are given
TENANT_ROLES = {TENANT_ADMIN: TenantMembership.Role.ADMIN, TENANT_VIEWER: TenantMembership.Role.VIEWER}
ROLES = (*PLATFORM_ROLES, *TENANT_ROLES)
GROUP_OF = {OPERATOR: scoping.OPERATORS_GROUP, AUDITOR: scoping.AUDITORS_GROUP}
PASSWORD_BYTES = 18  # 24 URL-safe characters


@dataclass
class Roles:
    """What one person is: at most one platform role, and a tenant role in each of some tenants."""

    platform: str | None = None
    tenants: dict[str, str] = field(default_factory=dict)  # tenant name → TenantMembership.Role

    def describe(self) -> str:
        parts = [self.platform] if self.platform else []
        parts += [f"{role} of {name}" for name, role in sorted(self.tenants.items())]
        return ", ".join(parts) or "no role"


def roles_from_groups(groups, mapping: dict[str, str] | None = None) -> Roles:
    """The roles an identity provider's groups give, by OIDC_GROUP_ROLES: {group pattern: role}, where a pattern
    may hold `{tenant}` (`tenant-{tenant}-admins`). Groups that match nothing give nothing."""
    mapping = settings.OIDC_GROUP_ROLES if mapping is None else mapping
    roles = Roles()
    for group in groups if isinstance(groups, (list, tuple)) else []:
        if not isinstance(group, str):
            continue
        for pattern, role in mapping.items():
            tenant = _match(pattern, group.strip().lstrip("/"))  # Keycloak sends group paths: "/platform-admins"
            if tenant is False:
                continue
            if role in PLATFORM_ROLES and tenant is None:
                if roles.platform is None or PLATFORM_ROLES.index(role) < PLATFORM_ROLES.index(roles.platform):
                    roles.platform = role
            elif role in TENANT_ROLES and tenant:
                wanted = TENANT_ROLES[role]
                if roles.tenants.get(tenant) != TenantMembership.Role.ADMIN:  # admin outranks viewer
                    roles.tenants[tenant] = wanted
    return roles


def _match(pattern: str, group: str):
    """None: the group is this pattern (no tenant in it); a tenant name: it is, for that tenant; False: no match."""
    if "{tenant}" not in pattern:
        return None if group == pattern else False
    before, _, after = pattern.partition("{tenant}")
    found = re.fullmatch(re.escape(before) + r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)" + re.escape(after), group)
    return found.group(1) if found else False


def mapping_errors(mapping) -> list[str]:
    """What is wrong with an OIDC_GROUP_ROLES value (settings check it at start)."""
    if not isinstance(mapping, dict):
        return ["OIDC_GROUP_ROLES: a JSON object {group pattern: role}"]
    errors = []
    for pattern, role in mapping.items():
        if role not in ROLES:
            errors.append(f"OIDC_GROUP_ROLES[{pattern!r}]: role {role!r}, expected one of {', '.join(ROLES)}")
        elif (role in TENANT_ROLES) != ("{tenant}" in pattern):
            errors.append(f"OIDC_GROUP_ROLES[{pattern!r}]: a tenant role's pattern, and only one, holds {{tenant}}")
    return errors


@transaction.atomic
def roles_set(*, user, roles: Roles, actor: str, unknown_tenants: list | None = None) -> bool:
    """Make `user` exactly `roles`: the platform flags and groups, and the memberships (each change recorded).
    Tenants that do not exist are skipped (named in `unknown_tenants` when given). True: something changed."""
    changed = False
    admin = roles.platform == ADMIN
    created, changes = object_update(user, {"is_staff": admin, "is_superuser": admin}, actor=actor,
                                     object_type=ObjectType.USER)
    changed |= bool(changes)
    for role, name in GROUP_OF.items():
        group, _ = Group.objects.get_or_create(name=name)
        holds = user.groups.filter(pk=group.pk).exists()
        if holds != (roles.platform == role):
            (user.groups.remove if holds else user.groups.add)(group)
            event_record(kind=EventKind.CHANGE, object_type=ObjectType.USER, object_name=user.username, actor=actor,
                         message=f"{'left' if holds else 'joined'} group {name} ({role})")
            changed = True
    tenants = {t.name: t for t in Tenant.objects.filter(name__in=roles.tenants)}
    if unknown_tenants is not None:
        unknown_tenants += sorted(set(roles.tenants) - set(tenants))
    for membership in user.tenant_memberships.select_related("tenant"):
        if membership.tenant.name not in tenants:
            changed |= membership_remove(tenant=membership.tenant, user=user, actor=actor)
    for name, tenant in tenants.items():
        changed |= membership_add(tenant=tenant, user=user, actor=actor, role=roles.tenants[name])
    return changed


def roles_given(role: str, tenant_names) -> Roles:
    """A role as `manage.py user create` names it: a platform role alone, or a tenant role of some tenants."""
    tenant_names = list(tenant_names or [])
    if role not in ROLES:
        raise ValidationError(f"role {role!r}: expected one of {', '.join(ROLES)}")
    if role in TENANT_ROLES:
        if not tenant_names:
            raise ValidationError(f"a {role} belongs to a tenant: give --tenant NAME")
        missing = sorted(set(tenant_names) - set(Tenant.objects.filter(name__in=tenant_names)
                                                 .values_list("name", flat=True)))
        if missing:
            raise ValidationError(f"no tenant {', '.join(map(repr, missing))}")
        return Roles(tenants={name: TENANT_ROLES[role] for name in tenant_names})
    if tenant_names:
        raise ValidationError(f"an {role} sees every tenant: --tenant is for tenant-admin and tenant-viewer")
    return Roles(platform=role)


def user_create(*, username: str, role: str, tenant_names=(), password: str | None, actor: str):
    """A person who signs in with a password: a new user in `role`. With no password given one is made
    (returned, to be shown once). Returns (user, password made or None). ValidationError, and nothing made, for
    a user that exists, an unknown role or tenant, or a password the validators refuse."""
    from django.contrib.auth.password_validation import validate_password

    roles = roles_given(role, tenant_names)
    User = get_user_model()
    if User.objects.filter(username=username).exists():
        raise ValidationError(f"user {username!r} exists already")
    made = None
    if password is None:
        made = password = secrets.token_urlsafe(PASSWORD_BYTES)
    user = User(username=username)
    try:
        user.full_clean(exclude=["password"])
        validate_password(password, user)
    except ValidationError as error:
        messages = (["; ".join(f"{k}: {' '.join(v)}" for k, v in error.message_dict.items())]
                    if hasattr(error, "error_dict") else error.messages)
        raise ValidationError(messages) from None
    with transaction.atomic():
        user.set_password(password)
        user.save()
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.USER, object_name=username, actor=actor,
                     message=f"person user made ({roles.describe()}; password set)")
        roles_set(user=user, roles=roles, actor=actor)
    return user, made
