"""NodeType capacity (total, available, provisioned hosts per type), derived from hosts, never stored, and the
NodeEnvironments' addresses. The catalogue asks here; the apps that know register the sources at start."""
from django.core.exceptions import ImproperlyConfigured

_source = None


def capacity_source(fn) -> None:
    global _source
    _source = fn


def node_type_capacity(node_types: list) -> dict[int, dict[str, int]]:
    """{type id: {total, available, provisioned}} in one query, whatever the number of types."""
    if _source is None:
        raise ImproperlyConfigured("pools.capacity: no capacity source registered (the hosts app registers "
                                   "hosts.capacity.node_type_capacity when it starts)")
    if not node_types:
        return {}
    return _source(node_types)


# NodeEnvironments' addresses ({env id: {size, used, free, leaked}}): the claims app, which hands them out
# (claims.ipam), registers the source.
_address_usage = None


def address_usage_source(fn) -> None:
    global _address_usage
    _address_usage = fn


def environment_addresses(environments: list) -> dict[int, dict]:
    if _address_usage is None:
        raise ImproperlyConfigured("pools.capacity: no address usage source registered (the claims app registers "
                                   "claims.ipam.environments_usage when it starts)")
    if not environments:
        return {}
    return _address_usage(environments)
