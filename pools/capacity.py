"""NodeType capacity, derived from the hosts each type's selector matches (never stored)."""
from django.db.models import Count, Q

from hosts.choices import HostState
from hosts.lifecycle import CLAIMED
from hosts.models import BareMetalHost

from .models import NodeType
from .matching import label_selector_q


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
