"""Reads across the fleet: the status summary that `manage.py status --json` prints."""
from django.db.models import Count
from django.utils import timezone

from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.capacity import node_type_capacity
from pools.models import NodePool, NodeType, Tenant

from .choices import ClaimPhase
from .models import NodeClaim

STATUS_VERSION = 1


def fleet_status() -> dict:
    """Hosts by state, claims by phase per tenant and pool, NodeType capacity. Stable: scripts rely on it."""
    by_state = dict.fromkeys(HostState.values, 0)
    for row in BareMetalHost.objects.values("state").annotate(n=Count("pk")).order_by():
        by_state[row["state"]] = row["n"]
    claim_counts: dict[tuple, dict] = {}
    for row in NodeClaim.objects.exclude(phase=ClaimPhase.RELEASED).values("tenant_id", "pool_name", "phase") \
            .annotate(n=Count("pk")).order_by():
        claim_counts.setdefault((row["tenant_id"], row["pool_name"]), {})[row["phase"]] = row["n"]
    pools_by_tenant: dict[int, list] = {}
    for pool in NodePool.objects.select_related("provider").order_by("name"):
        pools_by_tenant.setdefault(pool.tenant_id, []).append(pool)
    tenants = []
    for tenant in Tenant.objects.order_by("name"):
        pools = []
        for pool in pools_by_tenant.get(tenant.pk, []):
            phases = dict.fromkeys([p for p in ClaimPhase.values if p != ClaimPhase.RELEASED], 0)
            phases.update(claim_counts.get((tenant.pk, pool.name), {}))
            pools.append({"name": pool.name, "kind": pool.kind, "provider": pool.provider.name,
                          "quantity": pool.quantity, "claims": phases})
        tenants.append({"name": tenant.name, "namespace": tenant.namespace, "pools": pools})
    node_types = list(NodeType.objects.select_related("provider").order_by("name"))
    capacity = node_type_capacity(node_types)
    return {
        "version": STATUS_VERSION,
        "generated_at": timezone.now().isoformat(),
        "hosts": {"total": sum(by_state.values()), "by_state": by_state},
        "tenants": tenants,
        "node_types": [{"name": t.name, "provider": t.provider.name, "cost": t.effective_cost(),
                        "capacity": capacity[t.pk]} for t in node_types],
    }
