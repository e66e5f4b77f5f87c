"""Reads across the fleet: the status summary that `manage.py status --json` prints; what a claim needs."""
from django.conf import settings
from django.db.models import Count, QuerySet
from django.utils import timezone

from core import scoping
from hosts.capacity import node_type_capacity
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.selectors import image_write_failures
from pools.models import OS_IMAGE_PROPERTY, NodePool, NodeType, OSImage, Tenant

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


def claim_image(claim: NodeClaim) -> tuple[OSImage | None, tuple[str, str] | None]:
    """The OSImage the claim's pool names, or (reason, message) saying why it cannot be written."""
    return os_image(claim.properties.get(OS_IMAGE_PROPERTY) or "")


def os_image(name: str) -> tuple[OSImage | None, tuple[str, str] | None]:
    """The OSImage of this name, or (reason, message): none named, not found, no url or checksum, or one that
    failed to write on IMAGE_FAILURE_HOSTS hosts within HOST_FAILURE_WINDOW_S."""
    if not name:
        return None, ("NoOSImage", f"the pool names no OS image ({OS_IMAGE_PROPERTY})")
    image = OSImage.objects.filter(name=name).first()
    if image is None:
        return None, ("OSImageNotFound", f"OS image {name} not found")
    if not image.url or not image.checksum:
        return None, ("OSImageInvalid", f"OS image {name} has no url or no checksum")
    failed = image_write_failures(name=image.name, url=image.url, checksum=image.checksum)
    if len(failed) >= settings.IMAGE_FAILURE_HOSTS:
        hours = settings.HOST_FAILURE_WINDOW_S / 3600
        last = list(failed.values())[-1]
        return image, ("ImageFailed", f"OS image {name} failed to write on {len(failed)} hosts within {hours:g}h "
                                      f"({', '.join(sorted(failed))}): {last}; fix its url or checksum")
    return image, None


# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def claims_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = NodeClaim.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)
