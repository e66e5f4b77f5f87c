"""Tenant scoping, in one place: who may see and change what. The API, the pages and the websocket
consumers all ask here.

Roles: a platform admin (superuser or staff) sees and changes everything; an auditor (member of the
`auditors` group) sees everything and changes nothing; a tenant member (TenantMembership) sees and
changes only the pools, claims and nodes of the tenants they belong to, and never BMC details or hosts
that do not serve them, plus the release-gate evidence (erase certificates, health runs) of the erases of
their tenants' data; anyone else sees nothing."""
from django.db.models import Q, QuerySet

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun
from pools.models import NodeEnvironment, NodePool, Tenant

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


def tenants(user, qs: QuerySet | None = None) -> QuerySet:
    qs = Tenant.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    return qs if ids is None else qs.filter(pk__in=ids)


def pools(user, qs: QuerySet | None = None) -> QuerySet:
    qs = NodePool.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def claims(user, qs: QuerySet | None = None) -> QuerySet:
    qs = NodeClaim.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def hosts(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see only the hosts that serve their claims now."""
    qs = BareMetalHost.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    return qs if ids is None else qs.filter(claim__tenant_id__in=ids)


def events(user, qs: QuerySet | None = None) -> QuerySet:
    qs = Event.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def node_environments(user, qs: QuerySet | None = None) -> QuerySet:
    """Shared networks (no tenant) for everyone signed in; a tenant's own for those who see that tenant."""
    qs = NodeEnvironment.objects.all() if qs is None else qs
    r = role(user)
    if r in (ADMIN, AUDITOR):
        return qs
    if r == NOBODY:
        return qs.none()
    return qs.filter(Q(tenant__isnull=True) | Q(tenant_id__in=user.tenant_memberships.values("tenant_id")))


def _erases_of(ids: list[int]) -> Q:
    """The erases of these tenants' data: the previous tenant, by name, as the signed document names it."""
    return Q(previous_tenant__in=Tenant.objects.filter(pk__in=ids).values("name"))


def erase_certificates(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see the certificates of the erases of their own tenants' data: the proof they are owed, whichever
    host it was and whoever uses it now."""
    qs = EraseCertificate.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    return qs if ids is None else qs.filter(_erases_of(ids))


def health_runs(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see the health runs of the release gates whose certificates they see (the same flow run: how the
    host was checked after their use), never those of other tenants' releases or of registrations."""
    qs = HealthCheckRun.objects.all() if qs is None else qs
    ids = tenant_ids(user)
    if ids is None:
        return qs
    return qs.filter(flow_id__in=EraseCertificate.objects.filter(_erases_of(ids)).values("flow_id"))


def may_change_tenant(user, tenant: Tenant) -> bool:
    r = role(user)
    if r == ADMIN:
        return True
    if r != MEMBER:
        return False
    return user.tenant_memberships.filter(tenant=tenant).exists()


def may_see_tenant(user, tenant: Tenant) -> bool:
    ids = tenant_ids(user)
    return ids is None or tenant.pk in ids


def may_see_bmc(user) -> bool:
    return sees_everything(user)
