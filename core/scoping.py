"""Tenant scoping, in one place: who may see and change what. The API, the pages and the websocket
consumers all ask here.

Roles: a platform admin (superuser or staff) sees and changes everything; an auditor (member of the
`auditors` group) sees everything and changes nothing; a tenant member (TenantMembership) sees and
changes only the pools, claims and nodes of the tenants they belong to, and never BMC details or hosts
that do not serve them, plus the release-gate evidence (erase certificates, health runs) of the erases of
their tenants' data; anyone else sees nothing.

This is the rule; the querysets it narrows live with their models, in each app's selectors
(`pools.selectors.tenants_visible`, `claims.selectors.claims_visible`, `hosts.selectors.hosts_visible`,
`events.selectors.events_visible`, ...), so that no app has to import the others to ask."""


ADMIN, AUDITOR, MEMBER, NOBODY = "admin", "auditor", "member", "nobody"
AUDITORS_GROUP = "auditors"


def role(user) -> str:
    if user is None or not user.is_authenticated or not user.is_active:
        return NOBODY
    if user.is_superuser or user.is_staff:
        return ADMIN
    if user.groups.filter(name=AUDITORS_GROUP).exists():
        return AUDITOR
    return MEMBER


def sees_everything(user) -> bool:
    return role(user) in (ADMIN, AUDITOR)


def is_admin(user) -> bool:
    return role(user) == ADMIN


def tenant_ids(user) -> list[int] | None:
    """The tenants a user may see; None means all of them."""
    r = role(user)
    if r in (ADMIN, AUDITOR):
        return None
    if r == NOBODY:
        return []
    return list(user.tenant_memberships.values_list("tenant_id", flat=True))











def may_change_tenant(user, tenant) -> bool:
    r = role(user)
    if r == ADMIN:
        return True
    if r != MEMBER:
        return False
    return user.tenant_memberships.filter(tenant=tenant).exists()


def may_see_tenant(user, tenant) -> bool:
    ids = tenant_ids(user)
    return ids is None or tenant.pk in ids


def may_see_bmc(user) -> bool:
    return sees_everything(user)
