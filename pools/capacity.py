"""NodeType capacity (total, available, provisioned hosts per type), derived from hosts, never stored. The
catalogue asks here; the hosts app, which knows the hosts, registers the source (hosts.capacity)."""
_source = None


def capacity_source(fn) -> None:
    global _source
    _source = fn


def node_type_capacity(node_types: list) -> dict[int, dict[str, int]]:
    """{type id: {total, available, provisioned}} in one query, whatever the number of types."""
    if _source is None or not node_types:
        return {}
    return _source(node_types)


# NodeEnvironments' addresses ({env id: {size, used, free, leaked}}): the claims app, which hands them out
# (claims.ipam), registers the source.
_address_usage = None


def address_usage_source(fn) -> None:
    global _address_usage
    _address_usage = fn


def environment_addresses(environments: list) -> dict[int, dict]:
    if _address_usage is None or not environments:
        return {}
    return _address_usage(environments)
