"""What still uses a NodeType or a tenant: the claims app, which makes the claims, registers the source at start
(claims.selectors.claims_unreleased); pools ask here before a delete."""
from django.core.exceptions import ImproperlyConfigured

_source = None


def claims_unreleased_source(fn) -> None:
    global _source
    _source = fn


def claims_unreleased(*, node_type=None, tenant=None, first: int = 4) -> tuple[list[str], int]:
    """The claims of a NodeType (or of a tenant) not released yet: (the first `first` names, by name; how many)."""
    if _source is None:
        raise ImproperlyConfigured("pools.usage: no source of unreleased claims registered (the claims app "
                                   "registers claims.selectors.claims_unreleased when it starts)")
    return _source(node_type=node_type, tenant=tenant, first=first)
