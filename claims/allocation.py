"""The allocator: pending claims get hosts, one by one, where their pool or group must sit, or a group whole."""
import time
from collections import defaultdict
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from core import live
from core.tasks import task_send, task_send_on_commit
from hosts.capacity import node_type_capacity, preflight_held_back
from hosts.choices import HostState
from hosts.lifecycle import ConcurrentTransition
from hosts.models import BareMetalHost
from hosts.services import hosts_kept_clear, hosts_transition_batch
from pools.choices import GroupFailurePolicy
from pools.fabric import fabric_partition_waits
from pools.matching import label_selector_q, normalize_requirement, requirements_match
from pools.models import OS_IMAGE_PROPERTY, SERVER_NAME_PROPERTY, NodePool, NodeType, external_provider_q

from . import task_names
from .choices import ClaimPhase as P
from .ipam import NO_ADDRESS, addresses_take, environments_lock, environments_of
from .models import ClaimGroup, NodeClaim
from .phases import claims_transition
from .selectors import (
    FREE_STATES,
    SHARES_WORDS,
    domain_name,
    free_by_domain,
    free_hosts,
    host_order,
    os_image,
    pool_domain,
)
from .tenant_check import tenant_api_holds


@dataclass
class AllocationResult:
    allocated: dict[str, str] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)


def claims_allocate(*, pool_ids: list[int] | None = None, claim_ids: list[int] | None = None,
                    actor: str = "system:allocator") -> AllocationResult:
    """Give each pending claim one available host of the cheapest matching NodeType that has one free.

    Hosts are taken with SELECT … FOR UPDATE SKIP LOCKED (PostgreSQL) and a compare-and-swap on their
    state (every backend), so two claims never get one host; the unique claim→host link guards too."""
    result = AllocationResult()
    # Claims on external providers get machines, not hosts (machines.services.claims_fill).
    pending = (NodeClaim.objects.filter(phase=P.PENDING, host__isnull=True).exclude(external_provider_q("provider__"))
               .order_by("created_at", "pk"))
    if pool_ids is not None:
        pending = pending.filter(pool_id__in=pool_ids)
    if claim_ids is not None:
        pending = pending.filter(pk__in=claim_ids)
    pending = list(pending)
    if not pending:
        return result
    waiting = {}  # claim → (reason, message)
    # What a claim needs before any host is touched: an OS image that can be written.
    images = {name: os_image(name)[1] for name in {c.properties.get(OS_IMAGE_PROPERTY) or "" for c in pending}}
    # … and a tenant API that the last server-side check reached (claims.tenant_check).
    holds = tenant_api_holds(tenant_ids={c.tenant_id for c in pending})
    for claim in pending:
        problem = images[claim.properties.get(OS_IMAGE_PROPERTY) or ""] or holds.get(claim.tenant_id)
        if problem:
            waiting[claim] = problem
    # ...and, where its environment configures a fabric range, a partition for its tenant (pools.fabric).
    for claim, message in fabric_partition_waits(c for c in pending if c not in waiting).items():
        waiting[claim] = ("NoFabricPartition", message)
    node_types = sorted(NodeType.objects.select_related("provider"), key=lambda t: (t.effective_cost(), t.name))
    # Where a claim's host must sit (hosts.topology): with the rest of its all-or-nothing group, or of its pool.
    claim_groups = ClaimGroup.objects.in_bulk({c.group_id for c in pending if c.group_id})
    topology_pools = {p.pk: p for p in NodePool.objects.filter(pk__in={c.pool_id for c in pending if c.pool_id
                                                                        and not c.group_id})
                      if p.shared_topology()}
    groups = defaultdict(list)
    environments = environments_of(pending)  # a group shares one NodeEnvironment: its addresses (claims.ipam)
    no_address = {}  # claim id → why it waits for an address (filled by _allocate_group)
    for claim in pending:
        if claim in waiting:
            continue
        pinned = claim.properties.get(SERVER_NAME_PROPERTY, "")
        tried = tuple(sorted(set(claim.failed_hosts)))
        where = None
        group = claim_groups.get(claim.group_id)
        if group is not None and group.placed_at is None:
            where, pinned, tried = ("group", group), "", ()  # placed whole: one host per member, in one go
        elif group is not None and group.on_member_failure == GroupFailurePolicy.RELEASE_GROUP:
            waiting[claim] = ("GroupReleasing", f"group {group.name} lost a member: it is released and placed again")
            continue
        elif group is not None:
            where = ("member", group)  # Replace: a new host from the group's rail group
        elif claim.pool_id in topology_pools:
            where = ("pool", topology_pools[claim.pool_id])
        env = environments[claim.pk]
        # By pool too: a host holding a pool's kept data disks is that pool's alone (claims.selectors.free_hosts).
        key = (claim.provider_id, _requirements_key(claim.requirements), pinned, tried, where, env.pk if env else None,
               claim.pool_id)
        groups[key].append(claim)
    for (provider_id, _, pinned, tried, where, _env, _pool), claims in groups.items():
        candidates = [t for t in node_types if t.provider_id == provider_id
                      and requirements_match(claims[0].requirements, t.effective_properties())]
        if not candidates:
            msg = f"no NodeType matches {_describe(claims[0].requirements)}"
            waiting.update({c: ("NoNodeType", msg) for c in claims})
            continue
        if where is not None:
            if where[0] == "group":
                allocated, why = _place_group(where[1], claims, candidates, actor)
            else:
                allocated, why = _allocate_in_place(where, claims, candidates, tried, actor)
            result.allocated.update(allocated)
            if why:
                waiting.update({c: why for c in claims if c.name not in allocated})
            continue
        # Hosts that failed these claims wait while another matching host is free or on its way back.
        excluded = tried if tried and _another_host_may_free_up(candidates, pinned, tried) else ()
        for round_ in range(3):
            for node_type in candidates:
                if not claims or no_address.keys() & {c.pk for c in claims}:
                    break
                taken = _allocate_group(claims, node_type, pinned, actor, excluded=excluded, no_address=no_address)
                for claim in claims[:taken]:
                    result.allocated[claim.name] = claim.host_name
                claims = claims[taken:]
            if not claims or no_address.keys() & {c.pk for c in claims}:
                break
            capacity = node_type_capacity(candidates)
            # Held back hosts count: the allocator takes one whose BMC is red last, not never.
            if excluded or not any(capacity[t.pk]["available"] + capacity[t.pk]["held_back"] for t in candidates):
                break
            # Hosts that look free but were skipped: other allocations hold them locked. Look again
            # once they commit, so the reason we give is true.
            time.sleep(0.05 * (round_ + 1))
        if claims and any(c.pk in no_address for c in claims):
            waiting.update({c: (NO_ADDRESS, no_address.get(c.pk) or next(iter(no_address.values()))) for c in claims})
        elif claims:
            msg = _no_capacity_message(candidates, capacity, pinned)
            if excluded:
                msg += f"; not {', '.join(excluded)} again while another host may free up (it failed this claim)"
            waiting.update({c: ("NoCapacity", msg) for c in claims})
    by_message = defaultdict(list)
    told: list[NodeClaim] = []  # claims whose reason changed: the live lists must hear of it
    for claim, (reason, msg) in waiting.items():
        result.pending[claim.name] = msg
        if (claim.reason, claim.message) != (reason, msg):
            by_message[(reason, msg)].append(claim.pk)
            told.append(claim)
    for (reason, msg), ids in by_message.items():
        NodeClaim.objects.filter(pk__in=ids, phase=P.PENDING).update(reason=reason, message=msg)
    for group in claim_groups.values():  # a group waiting to be placed says why, as its members do
        why = next((waiting[c] for c in pending if c.group_id == group.pk and c in waiting), None)
        if why and group.placed_at is None and (group.reason, group.message) != why:
            ClaimGroup.objects.filter(pk=group.pk, placed_at__isnull=True).update(reason=why[0], message=why[1])
            told += [c for c in pending if c.group_id == group.pk]
    if told:  # no Event for a reason that changed: the live lists hear of it from the claims' ids
        groups = ["claims", *sorted({f"tenant-{c.tenant_id}" for c in told})]
        message = {"object": "claim", "ids": [c.pk for c in told]}
        transaction.on_commit(lambda: live.publish(groups, message))
    return result


def allocate_soon() -> None:
    """A host joined the free pool: pending claims may take it now rather than at the next beat. The look for
    a pending claim is made after the commit: a claim that turns Pending in a transaction this one cannot see
    yet then commits later, and its own reconcile sees this host free (looked for inside, both would miss)."""
    def send_if_pending():
        if NodeClaim.objects.filter(phase=P.PENDING).exists():
            task_send(task_names.RECONCILE_POOLS, pool_ids=None)

    transaction.on_commit(send_if_pending)


def _allocate_group(claims: list[NodeClaim], node_type: NodeType, pinned: str, actor: str, tries: int = 3,
                    excluded: tuple[str, ...] = (), no_address: dict | None = None,
                    only: list[int] | None = None) -> int:
    """Allocate up to len(claims) hosts of one type to these claims (not the `excluded` ones; `only` these
    hosts, when given); returns how many got one."""
    for _ in range(tries):
        try:
            with transaction.atomic():
                environments_lock(claims)  # before the hosts: one allocation at a time per environment (IPAM)
                pool_id = claims[0].pool_id
                free = free_hosts(node_type, excluded=excluded, pool_id=pool_id)
                if pinned:
                    free = free.filter(name=pinned)
                if only is not None:
                    free = free.filter(pk__in=only)
                tried = sorted({name for claim in claims for name in claim.failed_hosts})
                hosts = list(free.select_for_update(skip_locked=True, of=("self",))
                             .order_by(*host_order(tried, pool_id))[: len(claims)])
                if not hosts:
                    return 0
                # Each claim's address in this same transaction; one that cannot get one takes no host.
                chosen, hosts, short = addresses_take(claims=claims[: len(hosts)], hosts=hosts, actor=actor)
                if short and no_address is not None:
                    no_address.update(short)
                if not chosen:
                    return 0
                _bind(hosts, chosen, node_type, actor, message=f"a {node_type.name} host was allocated")
                return len(chosen)
        except ConcurrentTransition:
            for claim in claims:
                claim.host, claim.ip_address = None, None
                if no_address is not None:
                    no_address.pop(claim.pk, None)
            continue
    return 0


def _bind(hosts: list[BareMetalHost], claims: list[NodeClaim], node_type: NodeType, actor: str,
          message: str) -> None:
    """Hosts to provisioning and each claim to its host, in the caller's transaction (hosts locked by it)."""
    tenant_of = {h.pk: c.tenant_id for h, c in zip(hosts, claims)}
    for host, claim in zip(hosts, claims):
        if host.kept_until is not None:  # free_hosts gave it to its own pool only: the kept data is this node's
            hosts_kept_clear(host=host, actor=actor, reason=f"its pool {claim.pool}'s claim {claim.name} has it "
                                                            "back, with its kept data disks")
    _hosts_to_provisioning(hosts, actor=actor, reason=f"allocated to a {node_type.name} claim", tenant_ids=tenant_of)
    for host, claim in zip(hosts, claims):
        claim.host, claim.host_name, claim.node_type = host, host.name, node_type
        claim.attempts += 1
    _link_claims_to_hosts(claims)
    claims_transition(claims=claims, to_phase=P.PROVISIONING, actor=actor, reason="Scheduled", message=message,
                      fields={"node_type": node_type, "attempts": F("attempts") + 1,
                              "node_type_properties": node_type.effective_properties()},
                      event_messages={c.pk: f"host {c.host_name} ({node_type.name})" for c in claims})
    _say_retried(claims, node_type.name)


def _allocate_in_place(where: tuple, claims: list[NodeClaim], candidates: list[NodeType], tried: tuple[str, ...],
                       actor: str) -> tuple[dict[str, str], tuple[str, str] | None]:
    """Claims whose hosts must sit in one place, taken one by one (a partial answer is fine): a group's new
    member (Replace) on the group's rail group; a pool with `topology` where its nodes already are, else in
    the domain with room for all of them (best fit), else the largest."""
    kind, owner = where
    shares = tuple(owner.shares) if kind == "member" else owner.shared_topology()
    allocated: dict[str, str] = {}
    no_address: dict[int, str] = {}
    domain = owner.domain() if kind == "member" else None
    excluded = tried if tried and _another_host_may_free_up(candidates, "", tried) else ()
    for node_type in candidates:
        if not claims:
            break
        with transaction.atomic():
            if kind == "pool":
                # One allocation per pool at a time, so that two workers do not start it on two domains.
                NodePool.objects.select_for_update(no_key=True).filter(pk=owner.pk).exists()
                domain = domain or pool_domain(owner, shares)
            by_domain = free_by_domain(node_type, shares, excluded=excluded, tried_last=tried,
                                       pool_id=claims[0].pool_id)
            if domain is None and by_domain:
                fits = [(len(pks), d) for d, pks in by_domain.items() if len(pks) >= len(claims)]
                domain = min(fits)[1] if fits else max((len(pks), d) for d, pks in by_domain.items())[1]
            if domain is None:
                continue
            taken = _allocate_group(claims, node_type, "", actor, excluded=excluded, only=by_domain.get(domain, []),
                                    no_address=no_address)
        for claim in claims[:taken]:
            allocated[claim.name] = claim.host_name
        claims = claims[taken:]
        if no_address:
            break
    if not claims:
        return allocated, None
    if no_address:
        return allocated, (NO_ADDRESS, no_address.get(claims[0].pk) or next(iter(no_address.values())))
    if kind == "member":
        return allocated, ("NoCapacity", (f"group {owner.name} needs {len(claims)} more on "
                                          f"{domain_name(shares, domain)} ({owner.on_member_failure}); "
                                          f"no free host of {_types(candidates)} there"))
    words = SHARES_WORDS.get(shares, ("together", "group"))[0]
    if domain is None:
        kinds = "a rail group" if "rail_group" in shares else "a rack"
        return allocated, ("NoCapacity", (f"pool {owner.name} keeps its nodes {words}; no free host of "
                                          f"{_types(candidates)} has {kinds} label"))
    return allocated, ("NoCapacity", (f"pool {owner.name} keeps its nodes {words} ({domain_name(shares, domain)}); "
                                      f"no free host of {_types(candidates)} there"))


def _place_group(group: ClaimGroup, claims: list[NodeClaim], candidates: list[NodeType],
                 actor: str) -> tuple[dict[str, str], tuple[str, str] | None]:
    """Place a group whole: one host per member, all from one rail group (or what the group shares), taken in
    one transaction, or none. Best fit: the smallest domain with room, then its name (deterministic); the
    cheapest NodeType first. No host is held while the rest is looked for: a domain that falls short rolls back
    to its savepoint, which lets its row locks go. Returns {claim: host} and, unplaced, (reason, message)."""
    shares = tuple(group.shares)
    need = len(claims)
    tried = sorted({name for claim in claims for name in claim.failed_hosts})
    best: tuple[int, tuple[str, ...], str] | None = None  # the largest free domain seen: (hosts, domain, type)
    for round_ in range(3):
        busy = False
        for node_type in candidates:
            outcome, counts = _place_group_once(group, claims, node_type, shares, tried, actor)
            if outcome == "placed":
                return {c.name: c.host_name for c in claims}, None
            if outcome == "gone":  # another worker holds it, placed it, or moved a member: theirs to say
                return {}, None
            if outcome.startswith(f"{NO_ADDRESS}:"):
                return {}, (NO_ADDRESS, outcome.split(":", 1)[1])
            for domain, n in counts.items():
                if best is None or (n, domain) > best[:2]:
                    best = (n, domain, node_type.name)
            busy = busy or outcome == "busy"
        if not busy:
            break
        time.sleep(0.05 * (round_ + 1))  # hosts others hold locked: look again once they commit
    where, noun = SHARES_WORDS.get(shares, ("together", "group"))
    msg = f"needs {need} {where}; "
    if best is None:
        kinds = "a rail group" if "rail_group" in shares else "a rack"
        msg += f"no free host of {_types(candidates)} has {kinds} label"
    else:
        kind = f", {best[2]}" if len(candidates) > 1 else ""
        msg += f"largest free {noun} has {best[0]} ({domain_name(shares, best[1])}{kind})"
    return {}, ("NoGroupPlacement", msg)


class _FellShort(Exception):
    """A domain that looked big enough lost hosts to another allocation meanwhile: its locks are let go."""


class _NoAddress(Exception):
    """The group's environment has fewer free addresses than it has members: nothing is placed."""


def _place_group_once(group: ClaimGroup, claims: list[NodeClaim], node_type: NodeType, shares: tuple[str, ...],
                      tried: list[str], actor: str) -> tuple[str, dict]:
    """One try with one NodeType: "placed", "none" (no domain has room), "busy" (some had, on paper, but
    others hold their hosts) or "gone"; with the free hosts per domain it saw."""
    need = len(claims)
    try:
        with transaction.atomic():
            # The lock order (core/transactions.py): pools, claim groups, hosts, claims. SKIP LOCKED: a group
            # another worker is placing is theirs.
            if not ClaimGroup.objects.select_for_update(skip_locked=True).filter(
                    pk=group.pk, placed_at__isnull=True).exists():
                return "gone", {}
            environments_lock(claims)  # before the hosts, as _allocate_group (claims.ipam)
            by_domain = free_by_domain(node_type, shares, tried_last=tried, pool_id=claims[0].pool_id)
            counts = {domain: len(pks) for domain, pks in by_domain.items()}
            fitting = sorted((n, domain) for domain, n in counts.items() if n >= need)
            for _, domain in fitting:
                try:
                    with transaction.atomic():
                        hosts = list(BareMetalHost.objects.filter(pk__in=by_domain[domain], state__in=FREE_STATES)
                                     .select_for_update(skip_locked=True, of=("self",))
                                     .order_by(*host_order(tried, claims[0].pool_id))[:need])
                        if len(hosts) < need:
                            raise _FellShort
                        # Every member's address in this same transaction (claims.ipam), or none placed.
                        chosen, hosts, short = addresses_take(claims=claims, hosts=hosts, actor=actor)
                        if short:
                            raise _NoAddress(next(iter(short.values())))
                        _bind(hosts, chosen, node_type, actor,
                              message=f"group {group.name}: {need} {node_type.name} hosts on "
                                      f"{domain_name(shares, domain)}")
                except _FellShort:
                    continue
                except _NoAddress as short:
                    return f"{NO_ADDRESS}:{short}", counts
                placed = {"placed_at": timezone.now(), "placements": F("placements") + 1, "reason": "Placed",
                          "message": f"{need} hosts on {domain_name(shares, domain)}",
                          **dict(zip(shares, domain))}
                ClaimGroup.objects.filter(pk=group.pk).update(**placed)
                return "placed", counts
            return ("busy" if fitting else "none"), counts
    except ConcurrentTransition:
        for claim in claims:
            claim.host, claim.ip_address = None, None
        return "gone", {}


def _types(candidates: list[NodeType]) -> str:
    return ("type " if len(candidates) == 1 else "types ") + ", ".join(t.name for t in candidates)


# States from which a host comes back to the pool by itself (no admin needed).
ON_ITS_WAY = (HostState.AVAILABLE, HostState.DEPROVISIONING, HostState.INSPECTING, HostState.REGISTERING)


def _another_host_may_free_up(candidates: list[NodeType], pinned: str, tried: tuple[str, ...]) -> bool:
    """A host of these types that did not fail the claim is available, or will be (cleaning, inspecting)."""
    match = Q()
    for node_type in candidates:
        match |= label_selector_q(node_type.host_selector)
    others = BareMetalHost.objects.filter(match, state__in=ON_ITS_WAY).exclude(name__in=tried)
    return (others.filter(name=pinned) if pinned else others).exists()


def _hosts_to_provisioning(hosts: list[BareMetalHost], *, actor: str, reason: str, tenant_ids: dict) -> None:
    """The allocated hosts to provisioning, a batch per state they are in (an idle check is abandoned)."""
    for state in FREE_STATES:
        batch = [h for h in hosts if h.state == state]
        if batch:
            hosts_transition_batch(hosts=batch, to_state=HostState.PROVISIONING, actor=actor, tenant_ids=tenant_ids,
                                   reason=reason + ("; its idle health check is abandoned"
                                                    if state == HostState.CHECKING else ""))


def _link_claims_to_hosts(claims: list[NodeClaim]) -> None:
    """Set each claim's host in one statement. Django's bulk_update writes a CASE per row, which costs
    seconds for a thousand claims on PostgreSQL; UPDATE … FROM (VALUES …) costs milliseconds."""
    if connection.vendor != "postgresql":
        NodeClaim.objects.bulk_update(claims, ["host", "host_name"])
        return
    rows = ", ".join(["(%s, %s, %s)"] * len(claims))
    params = [value for c in claims for value in (c.pk, c.host_id, c.host_name)]
    table = NodeClaim._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} AS c SET host_id = v.host_id, host_name = v.host_name "
                       f"FROM (VALUES {rows}) AS v(id, host_id, host_name) WHERE c.id = v.id", params)


def _requirements_key(requirements: list[dict]) -> tuple:
    return tuple(sorted((p, op, tuple(v)) for p, op, v in map(normalize_requirement, requirements)))


def _describe(requirements: list[dict]) -> str:
    parts = []
    for prop, op, values in map(normalize_requirement, requirements):
        parts.append(f"{prop}={values[0]}" if op == "" else f"{prop} {op} {','.join(values)}".strip())
    return "; ".join(parts) or "(no selector)"


def _say_retried(claims: list[NodeClaim], node_type: str) -> None:
    """A claim given another host after one failed it says so: "allocated" alone would hide the failure its
    page shows (one update per retried claim; first attempts keep the batch's message)."""
    for claim in claims:
        if claim.attempts > 1:
            failed = ", ".join(claim.failed_hosts)
            claim.message = (f"a {node_type} host was allocated: {claim.host_name}, attempt {claim.attempts}"
                             + (f" ({failed} failed it before)" if failed else " (the attempt before failed)"))
            NodeClaim.objects.filter(pk=claim.pk).update(message=claim.message)


def _no_capacity_message(candidates: list[NodeType], capacity: dict, pinned: str) -> str:
    parts = [f"{t.name}: {capacity[t.pk]['available']} of {capacity[t.pk]['total']} available" for t in candidates]
    noun = "type" if len(candidates) == 1 else "types"
    where = f" named {pinned}" if pinned else ""
    red = preflight_held_back(candidates)
    held = f"; preflight red, not allocated: {', '.join(red)}" if red else ""
    if len(candidates) == 1:
        return f"no free host{where} of type {candidates[0].name}: " + parts[0].split(": ", 1)[1] + held
    return f"no free host{where} of {noun} " + "; ".join(parts) + held
