"""Telling the pool pages that Auto Nodes rows changed which carry no Event (PendingPod, TenantWatch, NodeUsage)."""
# Decisions are Events and claims record their own: those reach the pages through events.services. The watcher,
# the decision and the disruption call `demand_changed` after writing pods, watcher state or node use; the message
# goes to the tenant's live group on commit (at once outside a transaction). A page that misses it re-syncs anyway:
# its consumer compares autonodes.selectors.demand_signature at each re-sync.
from collections.abc import Iterable

from django.db import transaction

from core import live


def demand_changed(*, tenant_id: int, pool_ids: Iterable[int] = ()) -> None:
    """The tenant's Pending pods, its watcher's state or its nodes' use changed (in the pools named, or in any
    of its pools when none is named)."""
    message = {"object": "demand", "ids": sorted({int(p) for p in pool_ids}), "tenant": int(tenant_id)}
    transaction.on_commit(lambda: live.publish([f"tenant-{int(tenant_id)}"], message))
