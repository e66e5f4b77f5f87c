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
    if r in scoping.STAFF:
        return qs
    if r == scoping.NOBODY:
        return qs.none()
    return qs.filter(Q(tenant__isnull=True) | Q(tenant_id__in=scoping.tenant_ids(user)))


# --- SKU conformance and labels from inspection (pools/sku.py) -------------------------------------

def labels_derived() -> bool:
    """Whether inspections write GPU labels on hosts: a metal3 NodeProvider says `deriveLabels: true`. Hosts
    belong to no provider (every one is inspected by this console's own bare-metal conductor, which all metal3
    providers share), so one provider's setting is the site's."""
    from .choices import ProviderKind
    from .models import NodeProvider

    return NodeProvider.objects.filter(kind=ProviderKind.METAL3, config__deriveLabels=True).exists()


def node_types_selecting(labels: dict, node_types=None) -> list:
    """The NodeTypes whose host selector matches these host labels (a NodeType without a selector selects no
    host), by name. `node_types`: an already-read list, so a list of hosts costs one query."""
    from .matching import label_selector_matches
    from .models import NodeType

    types = list(NodeType.objects.all()) if node_types is None else node_types
    return [t for t in types if t.host_selector and label_selector_matches(t.host_selector, labels or {})]


def sku_deviations_of(inventory: dict | None, labels: dict, node_types=None) -> dict[str, list[str]]:
    """{NodeType name: deviations} for every NodeType with a SKU that selects a host with these labels and
    inventory and that the inventory does not meet. {}: the host conforms to every type it could serve as."""
    from .sku import sku_deviations

    out = {}
    for node_type in node_types_selecting(labels, node_types):
        deviations = sku_deviations(node_type.sku, inventory)
        if deviations:
            out[node_type.name] = deviations
    return out
