"""NodeType capacity, derived from the hosts each type's selector matches (never stored). Registered as
pools.capacity's source when the hosts app is ready: the catalogue asks pools, which knows no hosts."""
from django.db.models import Count, Q
from django.db.models.fields.json import KeyTextTransform

from pools.matching import label_selector_q
from pools.models import NodeType

from .choices import HostState
from .lifecycle import CLAIMED, FREE
from .models import BareMetalHost


def node_type_capacity(node_types: list[NodeType]) -> dict[int, dict[str, int]]:
    """{type id: {total, available, provisioned}} in one query, whatever the number of types."""
    if not node_types:
        return {}
    aggregates = {}
    for t in node_types:
        q = label_selector_q(t.host_selector)
        aggregates[f"t{t.pk}_total"] = Count("pk", filter=q)
        aggregates[f"t{t.pk}_available"] = Count("pk", filter=q & Q(state__in=list(FREE)))
        aggregates[f"t{t.pk}_provisioned"] = Count("pk", filter=q & Q(state__in=list(CLAIMED)))
    counts = BareMetalHost.objects.aggregate(**aggregates)
    return {t.pk: {k: counts[f"t{t.pk}_{k}"] for k in ("total", "available", "provisioned")} for t in node_types}


# --- the fleet board's capacity card and GET /api/v1/capacity/ ----------------------------------------------

# Why an available host is not allocatable, each a filter on the host row: a red BMC (its last contact failed,
# hosts.services.host_bmc_contact) and a red preflight (hosts/preflight.py). Every count (the card, the API, the
# "Available" figure) follows.
NOT_ALLOCATABLE: dict[str, Q] = {
    "bmc_red": Q(bmc_ok=False),
    "preflight_red": Q(preflight_ok=False),
}
# What the allocator never takes, even when nothing else is free: a red preflight (its BMC or boot path is known
# broken: a claim would only fail on it). A red BMC alone is taken last instead (the flow's BMC step retries it).
NEVER_ALLOCATED = Q(preflight_ok=False)
# Hosts that need someone before they serve: in error, in repair, or being retested in repair.
BROKEN = (HostState.ERROR, HostState.REPAIR, HostState.RETESTING, HostState.REPAIRING)
CAPACITY_COLUMNS = ("total", "free", "allocatable", "serving", "broken", *NOT_ALLOCATABLE)
NO_RACK = ""


def not_allocatable_q() -> Q:
    q = Q(pk__in=[])
    for reason in NOT_ALLOCATABLE.values():
        q |= reason
    return q


def preflight_held_back(node_types: list[NodeType], limit: int = 3) -> list[str]:
    """The available hosts of these types that a red preflight holds back, as "name (reason)", for a claim's
    waiting message."""
    match = Q(pk__in=[])
    for t in node_types:
        match |= label_selector_q(t.host_selector)
    rows = (BareMetalHost.objects.filter(match, NEVER_ALLOCATED, state__in=list(FREE))
            .order_by("name").values_list("name", "preflight_reason")[:limit + 1])
    shown = [f"{name} ({reason})" if reason else name for name, reason in rows[:limit]]
    return shown + (["…"] if len(rows) > limit else [])


def allocatable_q() -> Q:
    """Available hosts that nothing stops from serving the next claim."""
    return Q(state__in=list(FREE)) & ~not_allocatable_q()


def _columns(prefix: str, where: Q | None) -> dict:
    def scoped(q: Q) -> Q:
        return q if where is None else where & q

    free = Q(state__in=list(FREE))
    columns = {
        "total": Count("pk", filter=where) if where is not None else Count("pk"),
        "free": Count("pk", filter=scoped(free)),
        "allocatable": Count("pk", filter=scoped(allocatable_q())),
        "serving": Count("pk", filter=scoped(Q(state__in=list(CLAIMED)))),
        "broken": Count("pk", filter=scoped(Q(state__in=list(BROKEN)))),
        **{name: Count("pk", filter=scoped(free & q)) for name, q in NOT_ALLOCATABLE.items()},
    }
    return {f"{prefix}{name}": agg for name, agg in columns.items()}


def fleet_capacity(node_types: list[NodeType] | None = None) -> dict:
    """Can the fleet serve the next claim: per NodeType (the hosts its selector matches), per rack (the `rack`
    label) and in all, the hosts free (available), allocatable (free, and no entry of NOT_ALLOCATABLE applies),
    serving a claim, and broken, with the free hosts each NOT_ALLOCATABLE reason holds back. One query whatever
    the fleet's size: hosts grouped by rack, each NodeType a set of filtered counts summed over the racks."""
    if node_types is None:
        node_types = list(NodeType.objects.order_by("name"))
    aggregates = _columns("", None)
    for t in node_types:
        aggregates.update(_columns(f"t{t.pk}_", label_selector_q(t.host_selector)))
    rows = list(BareMetalHost.objects.order_by().annotate(rack=KeyTextTransform("rack", "labels"))
                .values("rack").annotate(**aggregates))
    racks = sorted(({"name": row["rack"] or NO_RACK, **{c: row[c] for c in CAPACITY_COLUMNS}} for row in rows),
                   key=lambda r: (r["name"] == NO_RACK, r["name"]))
    totals = {c: sum(row[c] for row in rows) for c in CAPACITY_COLUMNS}
    types = [{"name": t.name, **{c: sum(row[f"t{t.pk}_{c}"] for row in rows) for c in CAPACITY_COLUMNS}}
             for t in node_types]
    return {"columns": list(CAPACITY_COLUMNS), "total": totals, "node_types": types, "racks": racks}
