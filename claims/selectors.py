"""Reads across the fleet: the status summary that `manage.py status --json` prints; what a claim needs; how
long a NodeType's claims take to launch."""
import json
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, F, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from core import scoping
from hosts.capacity import node_type_capacity
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.selectors import image_write_failures
from pools.matching import requirements_match
from pools.models import OS_IMAGE_PROPERTY, NodePool, NodeType, OSImage, Tenant

from .charts import percentile
from .choices import ClaimPhase
from .ipam import NO_ADDRESS
from .models import ClaimGroup, NodeClaim
from .tenant_check import WAIT_REASON

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
        # Warm: available hosts on in the agent's ramdisk, ready to write an image at once (hosts/flows/warm.py).
        "hosts": {"total": sum(by_state.values()), "by_state": by_state,
                  "warm": BareMetalHost.objects.filter(state=HostState.AVAILABLE, warm_since__isnull=False).count()},
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


# --- what holds the idle health checks back (hosts.services.hosts_idle_check_start) ---------------------------

# Reasons a Pending claim waits for something no host gives: an OS image that can be written, its tenant's API,
# an address, a fabric partition, its group's release, a NodeType at all. Such a claim holds no idle check back
# (it would hold them for as long as a person takes to fix it); a claim waiting for any other reason does.
NOT_WAITING_FOR_A_HOST = frozenset({"NoOSImage", "OSImageNotFound", "OSImageInvalid", "ImageFailed", WAIT_REASON,
                                    NO_ADDRESS, "NoFabricPartition", "GroupReleasing", "NoNodeType"})


def node_types_waited_for(node_types: Iterable[NodeType]) -> dict[int, str]:
    """Of these NodeTypes, those that could serve a claim waiting to be allocated (Pending, no host yet, for a
    host: NOT_WAITING_FOR_A_HOST), matched as the allocator matches them (its provider, its requirements against
    the type's properties); {type id: "2 claim(s) wait for a host: one-abc, one-def"}."""
    node_types = list(node_types)
    waiting = (NodeClaim.objects.filter(phase=ClaimPhase.PENDING, host__isnull=True)
               .exclude(reason__in=NOT_WAITING_FOR_A_HOST).order_by("created_at", "pk")
               .values_list("name", "provider_id", "requirements"))
    needs: dict[tuple[int, str], tuple[list, list[str]]] = {}  # one match per distinct need, not per claim
    for name, provider_id, requirements in waiting:
        needs.setdefault((provider_id, json.dumps(requirements, sort_keys=True)), (requirements, []))[1].append(name)
    held = {}
    for node_type in node_types:
        properties = node_type.effective_properties()
        names = [name for (provider_id, _), (requirements, claim_names) in needs.items()
                 if provider_id == node_type.provider_id and requirements_match(requirements, properties)
                 for name in claim_names]
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            held[node_type.pk] = f"{len(names)} claim(s) wait for a host: {', '.join(names[:3])}{more}"
    return held


# --- launch deadlines (issue 12, 7a) ---------------------------------------------------------------------------

@dataclass(frozen=True)
class LaunchDeadline:
    """How long a claim of one NodeType may take from creation to Available before it is reported as slow."""

    seconds: float  # the deadline: the measured p95 within [AUTONODES_LAUNCH_FLOOR_S, AUTONODES_LAUNCH_CAP_S]
    p95_s: float | None  # measured; None without history
    samples: int  # launches measured (at most AUTONODES_LAUNCH_HISTORY)
    why: str  # for people: "p95 of the last 50 gpu-server launches: 12 min"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def launch_deadlines(node_types: Iterable[NodeType]) -> dict[int, LaunchDeadline]:
    """Each NodeType's launch deadline, from its claims' measured provisioning time (created → Available) over the
    last AUTONODES_LAUNCH_HISTORY that got there (Released ones included: they launched), in one query. Bare metal
    takes minutes to tens of minutes and varies by type, so the deadline is measured, not a fixed 15 minutes;
    the floor keeps a few fast launches from making the next one "slow", and without history the cap applies
    (nothing measured yet says how long this hardware takes)."""
    node_types = list(node_types)
    floor, cap = settings.AUTONODES_LAUNCH_FLOOR_S, settings.AUTONODES_LAUNCH_CAP_S
    history = settings.AUTONODES_LAUNCH_HISTORY
    durations: dict[int, list[float]] = {t.pk: [] for t in node_types}
    if node_types:
        ranked = (NodeClaim.objects.filter(node_type_id__in=list(durations), available_at__isnull=False)
                  .annotate(rank=Window(RowNumber(), partition_by=[F("node_type_id")], order_by=F("available_at").desc()))
                  .filter(rank__lte=history).values_list("node_type_id", "created_at", "available_at"))
        for type_id, created, available in ranked:
            durations[type_id].append(max(0.0, (available - created).total_seconds()))
    result = {}
    for node_type in node_types:
        values = durations[node_type.pk]
        if not values:
            result[node_type.pk] = LaunchDeadline(
                seconds=cap, p95_s=None, samples=0,
                why=f"no {node_type.name} launch measured yet: the cap, {_minutes(cap)}")
            continue
        p95 = percentile(values, 95)
        seconds = min(cap, max(floor, p95))
        bound = " (the floor)" if seconds > p95 else " (the cap)" if seconds < p95 else ""
        result[node_type.pk] = LaunchDeadline(
            seconds=seconds, p95_s=p95, samples=len(values),
            why=f"p95 of the last {len(values)} {node_type.name} launches: {_minutes(p95)}; "
                f"deadline {_minutes(seconds)}{bound}")
    return result


def launch_deadline_unknown_type() -> LaunchDeadline:
    """A claim whose NodeType is not chosen yet: the cap."""
    cap = settings.AUTONODES_LAUNCH_CAP_S
    return LaunchDeadline(seconds=cap, p95_s=None, samples=0, why=f"no NodeType chosen: the cap, {_minutes(cap)}")


# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def claims_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = NodeClaim.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def claim_groups_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """All-or-nothing groups in the user's scope: admins and auditors every one, members their tenants'."""
    qs = ClaimGroup.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)
