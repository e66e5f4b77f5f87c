"""Reads of the catalogue: what each user may see of tenants, pools and NodeEnvironments."""
from django.db.models import Q, QuerySet

from core import scoping

from .models import NodeEnvironment, NodePool, Tenant

# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def tenants_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = Tenant.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(pk__in=ids)


def pools_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = NodePool.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def node_environments_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Shared networks (no tenant) for everyone signed in; a tenant's own for those who see that tenant."""
    qs = NodeEnvironment.objects.all() if qs is None else qs
    r = scoping.role(user)
    if r in (scoping.ADMIN, scoping.AUDITOR):
        return qs
    if r == scoping.NOBODY:
        return qs.none()
    return qs.filter(Q(tenant__isnull=True) | Q(tenant_id__in=user.tenant_memberships.values("tenant_id")))
