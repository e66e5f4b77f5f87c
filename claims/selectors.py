"""Reads of claims and the fleet: the status summary of `manage.py status --json`, what a claim needs, where
free hosts sit for the allocator, how long a NodeType's claims take to launch, and who may see which."""
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Case, Count, F, Q, QuerySet, When, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from core import scoping
from hosts.capacity import NEVER_ALLOCATED, not_allocatable_q
from hosts.choices import HostState
from hosts.lifecycle import FREE
from hosts.models import BareMetalHost
from hosts.selectors import image_write_failures
from hosts.topology import host_topology
from pools.capacity import capacity_shown
from pools.matching import label_selector_q, requirements_match
from pools.models import OS_IMAGE_PROPERTY, NodePool, NodeType, OSImage, Tenant

from .choices import ClaimPhase
from .ipam import NO_ADDRESS
from .models import ClaimGroup, NodeClaim
from .stats import percentile
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
    capacity = capacity_shown(node_types)  # an external provider's types: asked over the network, no transaction
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


# --- where hosts sit: all-or-nothing groups, pools on one rack or rail group (hosts.topology) ----------------

SHARES_WORDS = {("rail_group",): ("on one rail group", "group"), ("rack",): ("in one rack", "rack"),
                ("rack", "rail_group"): ("in one rack and rail group", "group")}


def group_where(shares: tuple[str, ...]) -> str:
    """("rail_group",) → "on one rail group": what a group's hosts share, as the messages say it."""
    return SHARES_WORDS.get(tuple(shares), ("together", "group"))[0]


def domain_name(shares: tuple[str, ...], domain: tuple[str, ...]) -> str:
    """("rail_group",) ("r2",) → "rail r2"; ("rack", "rail_group") ("a1", "r2") → "rack a1, rail r2"."""
    return ", ".join(f"{'rail' if key == 'rail_group' else key} {value}" for key, value in zip(shares, domain))


# A host under its idle health check is free: a claim pre-empts the check (the host is taken after the available
# ones: host_order).
FREE_STATES = tuple(sorted(FREE))


def held_for_others_q(pool_id: int | None) -> Q:
    """Hosts whose kept data disks hold them for a pool other than `pool_id` (hosts/gate/plan.py), or whose hold
    ended and whose full erase has not run yet: no claim but one of that pool's, in time, may have them."""
    held = Q(kept_until__isnull=False)
    if pool_id is None:
        return held
    return held & ~(Q(kept_for_pool_id=pool_id) & Q(kept_until__gt=timezone.now()))


def free_hosts(node_type: NodeType, *, excluded: tuple[str, ...] = (), pool_id: int | None = None):
    """The available hosts of a type the allocator may take for a claim of pool `pool_id` (both paths: one by one
    and whole groups); what must never be allocated is left out here, once."""
    return (BareMetalHost.objects.filter(label_selector_q(node_type.host_selector), state__in=FREE_STATES)
            .exclude(name__in=excluded)
            .exclude(held_for_others_q(pool_id))  # another tenant's data is never handed over
            .exclude(NEVER_ALLOCATED))  # a red preflight: never (hosts/preflight.py)


def host_order(tried: list[str], pool_id: int | None = None) -> list:
    """The order the allocator takes free hosts in: hosts that already failed these claims last (when they are
    all that is left), before them hosts held back (a BMC that does not answer: hosts.capacity), which the
    flow's BMC step would only confirm or clear; among the rest a host held for the claims' own pool first (its
    kept data disks are that pool's), then warm hosts (hosts/flows/warm.py: on in the ramdisk, they skip
    power-on, boot and lookup), the longest warm first."""
    own = [Case(When(kept_for_pool_id=pool_id, then=0), default=1)] if pool_id else []
    return [Case(When(name__in=list(tried), then=2), When(not_allocatable_q(), then=1), default=0),
            Case(When(state=HostState.CHECKING, then=1), default=0),  # an idle check is pre-empted last
            *own, F("warm_since").asc(nulls_last=True), "pk"]


def free_by_domain(node_type: NodeType, shares: tuple[str, ...], excluded: tuple[str, ...] = (),
                    tried_last: list[str] | tuple = (), pool_id: int | None = None) -> dict[tuple[str, ...], list[int]]:
    """The free hosts of a type, by what they share ({("r2",): [host ids]}), each list in the order the
    allocator takes them (as _allocate_group: hosts held back, then hosts that failed these claims, last).
    A host that does not say where it sits (no such label) is in no domain."""
    free = free_hosts(node_type, excluded=excluded, pool_id=pool_id)
    order = host_order(list(tried_last), pool_id)
    by_domain = defaultdict(list)
    for pk, labels in free.order_by(*order).values_list("pk", "labels"):
        topology = host_topology(labels)
        domain = tuple(getattr(topology, key) for key in shares)
        if all(domain):
            by_domain[domain].append(pk)
    return by_domain


def group_free_domains(node_type: NodeType, shares: tuple[str, ...]) -> dict[str, int]:
    """Free hosts of a type per rail group (or what `shares` names), by name: {"rail r2": 3}. What a dynamic
    pool's decision reads before it asks for a group (the allocator decides where the group goes)."""
    return {domain_name(shares, domain): len(pks) for domain, pks in free_by_domain(node_type, shares).items()}


def pool_free_domain(pool: NodePool, node_type: NodeType) -> tuple[str, int] | None:
    """A pool with `topology` (no group): where its next nodes of the type go and how many free hosts are there
    (the domain its serving nodes are in, else the one with the most free: at most what the allocator finds).
    None for a pool without topology; ("", 0) when no free host of the type says where it sits."""
    shares = pool.shared_topology()
    if not shares:
        return None
    by_domain = free_by_domain(node_type, shares)
    domain = pool_domain(pool, shares)
    if domain is None:
        if not by_domain:
            return "", 0
        domain = max((len(pks), d) for d, pks in by_domain.items())[1]
    return domain_name(shares, domain), len(by_domain.get(domain, []))


def pool_domain(pool: NodePool, shares: tuple[str, ...]) -> tuple[str, ...] | None:
    """Where the pool's nodes are: the domain of most of its serving hosts (then the first by name)."""
    counts: dict[tuple, int] = defaultdict(int)
    serving = (NodeClaim.objects.filter(pool=pool, host__isnull=False)
               .exclude(phase__in=[ClaimPhase.RELEASING, ClaimPhase.RELEASED])
               .values_list("host__labels", flat=True))
    for labels in serving:
        topology = host_topology(labels)
        domain = tuple(getattr(topology, key) for key in shares)
        if all(domain):
            counts[domain] += 1
    if not counts:
        return None
    return min(counts, key=lambda d: (-counts[d], d))


# --- launch deadlines ---------------------------------------------------------------------------------------

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


# --- what still uses a NodeType or a tenant (pools.usage: refused deletes, a tenant's deletion) -------------

def claims_unreleased(*, node_type=None, tenant=None, first: int = 4) -> tuple[list[str], int]:
    """The claims of a NodeType or of a tenant that are not released yet: (the first names, by name; how many)."""
    holding = NodeClaim.objects.exclude(phase=ClaimPhase.RELEASED)
    holding = holding.filter(node_type=node_type) if node_type is not None else holding.filter(tenant=tenant)
    names = list(holding.order_by("name").values_list("name", flat=True)[:first]) if first else []
    return names, (holding.count() if len(names) == first else len(names))


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
