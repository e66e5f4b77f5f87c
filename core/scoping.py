"""Tenant scoping and roles, in one place: who may see and change what. The API, the pages, the websocket
consumers and the commands all ask here.

Roles: a platform admin (superuser or staff) sees and changes everything; an operator (the `operators` group)
sees everything and acts on hosts (maintenance, retry, power, retest, return to service, preflight) but changes
no catalogue, tenant, pool or credential; an auditor (the `auditors` group) sees everything and changes nothing;
a tenant member (TenantMembership) sees only the pools, claims and nodes of the tenants they belong to, never
BMC details or hosts that do not serve them, plus the release-gate evidence (erase certificates, health runs)
of the erases of their tenants' data; of those members a tenant admin changes its tenant's pools and
quantities, joins nodes and releases claims, a tenant viewer only reads. Anyone else sees nothing.

This is the rule; the querysets it narrows live with their models, in each app's selectors
(`pools.selectors.tenants_visible`, `claims.selectors.claims_visible`, `hosts.selectors.hosts_visible`,
`events.selectors.events_visible`, ...), so that no app has to import the others to ask."""


ADMIN, OPERATOR, AUDITOR, MEMBER, NOBODY = "admin", "operator", "auditor", "member", "nobody"
OPERATORS_GROUP, AUDITORS_GROUP = "operators", "auditors"
ROLE_GROUPS = (OPERATORS_GROUP, AUDITORS_GROUP)  # a fresh install has both (pools migration 0013)
STAFF = (ADMIN, OPERATOR, AUDITOR)  # the platform's roles: they see every tenant and the whole fleet
# A member's role in one tenant (TenantMembership.role).
TENANT_ADMIN, TENANT_VIEWER = "admin", "viewer"


def role(user) -> str:
    """The user's platform role; a member's role per tenant is `tenant_role`."""
    if user is None or not user.is_authenticated or not user.is_active:
        return NOBODY
    if user.is_superuser or user.is_staff:
        return ADMIN
    groups = set(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True))
    return OPERATOR if OPERATORS_GROUP in groups else AUDITOR if AUDITORS_GROUP in groups else MEMBER


def sees_everything(user) -> bool:
    return role(user) in STAFF


def is_admin(user) -> bool:
    return role(user) == ADMIN


def tenant_ids(user) -> list[int] | None:
    """The tenants a user may see; None means all of them."""
    r = role(user)
    if r in STAFF:
        return None
    if r == NOBODY:
        return []
    ids = list(user.tenant_memberships.values_list("tenant_id", flat=True))
    limit = token_limit(user)
    return ids if limit is None else [i for i in ids if i in limit]


def token_limit(user) -> set[int] | None:
    """The tenants the API token in use is limited to (access.authentication sets it on the user), or None."""
    limit = getattr(user, "token_tenant_ids", None)
    return None if limit is None else set(limit)


def acts_on_hosts(user) -> bool:
    """Host actions (maintenance, retry, power, retest, return to service, preflight, repair): admins and
    operators. Registering, editing (credentials) and deleting a host are the admin's alone."""
    return role(user) in (ADMIN, OPERATOR)


def admin_tenant_ids(user) -> list[int]:
    """The tenants a member administers (changes pools and quantities of, joins nodes to)."""
    if role(user) != MEMBER:
        return []
    ids = list(user.tenant_memberships.filter(role=TENANT_ADMIN).values_list("tenant_id", flat=True))
    limit = token_limit(user)
    return ids if limit is None else [i for i in ids if i in limit]


def tenant_role(user, tenant) -> str | None:
    """TENANT_ADMIN or TENANT_VIEWER for a member of `tenant`; None for anyone else (staff included)."""
    if role(user) != MEMBER:
        return None
    membership = user.tenant_memberships.filter(tenant=tenant).first()
    return membership.role if membership else None


def may_change_tenant(user, tenant) -> bool:
    r = role(user)
    if r == ADMIN:
        return True
    if r != MEMBER:
        return False
    limit = token_limit(user)
    if limit is not None and tenant.pk not in limit:
        return False
    return tenant.pk in admin_tenant_ids(user)


def may_change_some_tenant(user) -> bool:
    """Whether any write of a tenant's may be this user's: an admin, or a member who administers a tenant."""
    return is_admin(user) or bool(admin_tenant_ids(user))


def may_see_tenant(user, tenant) -> bool:
    ids = tenant_ids(user)
    return ids is None or tenant.pk in ids


def may_see_bmc(user) -> bool:
    return sees_everything(user)
