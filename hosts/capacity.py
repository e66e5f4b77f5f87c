"""NodeType capacity, derived from the hosts each type's selector matches (never stored). Registered as
pools.capacity's source when the hosts app is ready: the catalogue asks pools, which knows no hosts."""
from django.db.models import Count, Q

from pools.matching import label_selector_q
from pools.models import NodeType

from .choices import HostState
from .lifecycle import CLAIMED
from .models import BareMetalHost


def node_type_capacity(node_types: list[NodeType]) -> dict[int, dict[str, int]]:
    """{type id: {total, available, provisioned}} in one query, whatever the number of types."""
    if not node_types:
        return {}
    aggregates = {}
    for t in node_types:
        q = label_selector_q(t.host_selector)
        aggregates[f"t{t.pk}_total"] = Count("pk", filter=q)
        aggregates[f"t{t.pk}_available"] = Count("pk", filter=q & Q(state=HostState.AVAILABLE))
        aggregates[f"t{t.pk}_provisioned"] = Count("pk", filter=q & Q(state__in=list(CLAIMED)))
    counts = BareMetalHost.objects.aggregate(**aggregates)
    return {t.pk: {k: counts[f"t{t.pk}_{k}"] for k in ("total", "available", "provisioned")} for t in node_types}
