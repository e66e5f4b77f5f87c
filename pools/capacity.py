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


# External providers' NodeTypes (machines/): {type id: {"total": int | None, "claimed": int, "error": str}}, the
# total from the provider's kind (None: no limit), claimed its live machines. The machines app registers it. The
# kinds answer over the network: ask only outside a transaction, never in the allocator's.
_machine_capacity = None


def machine_capacity_source(fn) -> None:
    global _machine_capacity
    _machine_capacity = fn


def machine_capacity(node_types: list) -> dict[int, dict]:
    if _machine_capacity is None or not node_types:
        return {}
    return _machine_capacity(node_types)


def capacity_shown(node_types: list) -> dict[int, dict]:
    """What the capacity views show (the node types page, the API, `manage.py status`): a host type's columns of
    hosts; an external provider's type its provider's capacity as the same columns (total, available, provisioned:
    its live machines) with `machines`: True, `claimed`, and `provider_error` when the provider could not be asked
    (not `error`: that column counts hosts in error). Total
    and available are None where the provider sets no limit. Network I/O: outside any transaction."""
    shown = node_type_capacity(node_types)
    for pk, m in machine_capacity(node_types).items():
        total, claimed = m["total"], m["claimed"]
        shown[pk] = {**dict.fromkeys(shown[pk], 0), "total": total, "provisioned": claimed,
                     "available": None if total is None else max(0, total - claimed),
                     "machines": True, "claimed": claimed, "provider_error": m.get("error") or ""}
    return shown


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
