"""NodeType capacity, derived from the hosts each type's selector matches (never stored). Registered as
pools.capacity's source when the hosts app is ready: the catalogue asks pools, which knows no hosts."""
from dataclasses import dataclass

from django.db.models import Count, Q
from django.db.models.fields.json import KeyTextTransform

from pools.matching import label_selector_q
from pools.models import NodeType, external_provider_q

from .choices import HostState
from .lifecycle import CLAIMED, FREE
from .models import BareMetalHost


def external_types(node_types: list[NodeType]) -> set[int]:
    """The types whose machines come from an external provider (machines/): none of the console's hosts is theirs,
    whatever their selector says. From the rows' providers when loaded, else in one query."""
    provider = NodeType._meta.get_field("provider")
    external = {t.pk for t in node_types if provider.is_cached(t) and t.provider.external}
    unread = [t.pk for t in node_types if not provider.is_cached(t)]
    if unread:
        external |= set(NodeType.objects.filter(external_provider_q("provider__"), pk__in=unread)
                        .values_list("pk", flat=True))
    return external


def host_selector_q(node_type: NodeType, external: set[int]) -> Q:
    return Q(pk__in=[]) if node_type.pk in external else label_selector_q(node_type.host_selector)


def node_type_capacity(node_types: list[NodeType]) -> dict[int, dict[str, int]]:
    """{type id: {"total", and each of COLUMNS}} in one query, whatever the number of types: the hosts each type's
    selector matches, each counted once in exactly one column. An external provider's type matches no host (its
    machines are counted by pools.capacity.machine_capacity)."""
    if not node_types:
        return {}
    aggregates = {}
    external = external_types(node_types)
    for t in node_types:
        q = host_selector_q(t, external)
        aggregates[f"t{t.pk}_total"] = Count("pk", filter=q)
        for name, column in COLUMNS.items():
            aggregates[f"t{t.pk}_{name}"] = Count("pk", filter=q & column.q)
    counts = BareMetalHost.objects.aggregate(**aggregates)
    return {t.pk: {k: counts[f"t{t.pk}_{k}"] for k in ("total", *COLUMNS)} for t in node_types}


# --- the fleet board's capacity card and GET /api/v1/capacity/ ----------------------------------------------

# Why an available host is not allocatable, each a filter on the host row: a red BMC (its last contact failed,
# hosts.services.host_bmc_contact) and a red preflight (hosts/preflight.py). Such a host is "Held back", never
# plainly Available, in every count (the capacity card, /node-types/, the API) and needs attention.
NOT_ALLOCATABLE: dict[str, Q] = {
    "bmc_red": Q(bmc_ok=False),
    "preflight_red": Q(preflight_ok=False),
}
# What the allocator never takes, even when nothing else is free: a red preflight (its BMC or boot path is known
# broken: a claim would only fail on it). A red BMC alone is taken last instead (the flow's BMC step retries it).
NEVER_ALLOCATED = Q(preflight_ok=False)
NO_RACK = ""


def not_allocatable_q() -> Q:
    q = Q(pk__in=[])
    for reason in NOT_ALLOCATABLE.values():
        q |= reason
    return q


@dataclass(frozen=True)
class Column:
    label: str
    title: str  # what it counts, for a header's tooltip
    states: frozenset
    q: Q


def _column(label: str, title: str, states, extra: Q | None = None) -> Column:
    q = Q(state__in=sorted(states))
    return Column(label, title, frozenset(states), q & extra if extra is not None else q)


# The capacity vocabulary: every capacity view (the fleet board's card, /node-types/, the API, `manage.py status`)
# counts hosts in these columns, each host in exactly one, so that they add up to the host count.
COLUMNS: dict[str, Column] = {
    "available": _column("Available", "free for the next claim", FREE, ~not_allocatable_q()),
    "held_back": _column("Held back", "free, but its BMC does not answer or its preflight is red: fix it first",
                         FREE, not_allocatable_q()),
    "provisioned": _column("Provisioned", "provisioning or provisioned for a claim", CLAIMED),
    "preparing": _column("Preparing", "registering, inspecting, being cleaned after a release, or serviced (a firmware "
                         "update)", {HostState.REGISTERING, HostState.INSPECTING, HostState.DEPROVISIONING,
                                     HostState.SERVICING}),
    "repair": _column("Repair", "in repair, being retested or repaired",
                      {HostState.REPAIR, HostState.RETESTING, HostState.REPAIRING}),
    "error": _column("Error", "failed: retry it", {HostState.ERROR}),
    "maintenance": _column("Maintenance", "taken out of service by a person", {HostState.MAINTENANCE}),
    "held": _column("Held", "held after a restore of the database until the world reconcile reads its real state",
                    {HostState.HELD}),
    "retired": _column("Retired", "out of the fleet for good", {HostState.RETIRED}),
}
CAPACITY_COLUMNS = ("total", *COLUMNS, *NOT_ALLOCATABLE)


def capacity_columns() -> list[dict]:
    """The columns' names, labels and titles, in order, for a table's headers and the API."""
    return [{"name": name, "label": c.label, "title": c.title} for name, c in COLUMNS.items()]


def column_of(host: BareMetalHost) -> str:
    """The one column a host counts in (as COLUMNS' filters count it, from the row in memory)."""
    held = host.bmc_ok is False or host.preflight_ok is False
    for name, column in COLUMNS.items():
        if host.state in column.states and (name != "available" or not held):
            return name
    raise LookupError(f"no capacity column for state {host.state!r}")


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
    return COLUMNS["available"].q


def _columns(prefix: str, where: Q | None) -> dict:
    def scoped(q: Q) -> Q:
        return q if where is None else where & q

    free = Q(state__in=list(FREE))
    columns = {
        "total": Count("pk", filter=where) if where is not None else Count("pk"),
        **{name: Count("pk", filter=scoped(column.q)) for name, column in COLUMNS.items()},
        # Why the held back are: a host may be both.
        **{name: Count("pk", filter=scoped(free & q)) for name, q in NOT_ALLOCATABLE.items()},
    }
    return {f"{prefix}{name}": agg for name, agg in columns.items()}


def fleet_capacity(node_types: list[NodeType] | None = None) -> dict:
    """Can the fleet serve the next claim: per NodeType (the hosts its selector matches), per rack (the `rack`
    label) and in all, the hosts in each of COLUMNS, with the held back hosts each NOT_ALLOCATABLE reason holds
    back. One query whatever the fleet's size: hosts grouped by rack, each NodeType a set of filtered counts summed
    over the racks."""
    if node_types is None:
        node_types = list(NodeType.objects.select_related("provider").order_by("name"))
    # The hosts' card: an external provider's types have no host here (their machines: the node types page).
    external = external_types(node_types)
    node_types = [t for t in node_types if t.pk not in external]
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
    return {"columns": capacity_columns(),
            "total": totals, "node_types": types, "racks": racks}
