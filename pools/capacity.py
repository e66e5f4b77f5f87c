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
