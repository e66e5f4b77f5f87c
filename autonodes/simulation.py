"""The scheduling simulation of dynamic pools, as Karpenter's: which pool and NodeType serve each Pending pod,
and how few new nodes hold them all."""
# The scheduling simulation of dynamic pools, as Karpenter's: which pool and NodeType serve each Pending pod, and
# how few new nodes hold them all. Pure: plain dataclasses in and out, no database, no I/O (autonodes.services
# reads the rows, calls `simulate` and writes what it decided).
#
# The rules, in order, for each pod, largest first (first-fit decreasing):
# 1. a node that exists (a Ready node or a claim in flight) where it fits (and that has no extended resource the
#    pod does not ask for, as in 3.): nothing is launched for it;
# 2. a node this pass already opened, if the pod fits it with one of the NodeTypes still possible for that node;
# 3. a new node of the first pool (highest weight first) that may serve it: its nodeSelector and required node
#    affinity against the pool's nodeLabels + the type's properties, its tolerations against the pool's taints;
#    of the pool's types those that hold the pod (allocatable less daemonset overhead), that have no extended
#    resource (nvidia.com/gpu, ...) the pod does not ask for, that fit in the pool's limits, the tenant's quota
#    and the free hosts. A node keeps every type that still holds all its pods; the cheapest is launched.
# A pod no pool and type could ever serve is unservable (with the reason); one that only a limit, the quota or
# the lack of free hosts keeps out is waiting (with the reason).
#
# All or nothing, twice:
# - a pool with `group.size` N gets new nodes only as whole groups of N of one NodeType (claims.reconcile.
#   claim_group_create): opening its first new node takes a group, which counts N nodes against the pool's limits
#   (N × the type's resources), the tenant's quota and the free hosts, and needs N free hosts in one rail group
#   (or what the pool's topology names: TypeOption.free_domains); the group's other seats take the next nodes of
#   that pool and type, and seats left empty are launched too (a group is never asked for in part). A group
#   that does not fit a limit is not asked for: its pods wait, saying so.
# - pods of one gang (a coscheduling PodGroup: PodDemand.gang, at least min_member of them) are placed together:
#   the gang's pods are decided first, and if any of them finds no room (on existing capacity or new nodes),
#   everything the pass planned for the gang is undone and all its pods wait, with that reason.
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .choices import DecisionReason
from .fit import Demand, format_quantity, total_resources, why_not

# Resources every node has: anything else (nvidia.com/gpu, rdma/ib, ...) is an extended resource, and a node
# type that has one is launched only for pods that ask for it.
BASIC_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})
EPSILON = 1e-9
# Resources a NodeType often does not declare although every node has them: not counted where undeclared.
UNCOUNTED_WHEN_UNDECLARED = ("ephemeral-storage", "pods")


def is_extended(resource: str) -> bool:
    return resource not in BASIC_RESOURCES and not resource.startswith("hugepages-")


def with_undeclared(resources: dict[str, float]) -> dict[str, float]:
    """A node's resources with those it has without declaring them (ephemeral-storage, pods) as unbounded."""
    return {**dict.fromkeys(UNCOUNTED_WHEN_UNDECLARED, float("inf")), **resources}


def over_limit(limits: dict[str, float], used: dict[str, float], allocatable: dict[str, float],
               count: int = 1) -> str | None:
    """The first of a pool's limits that `count` more nodes, each of `allocatable`, would pass over what is
    `used` already (nodes first, then the resources by name); None: within every limit. The one copy of the
    rule: the simulation asks it for new nodes, autonodes.disruption for a replacement."""
    if "nodes" in limits and limits["nodes"] - used.get("nodes", 0.0) < count - EPSILON:
        return "nodes"
    return next((k for k in sorted(limits) if k != "nodes"
                 and count * allocatable.get(k, 0.0) > limits[k] - used.get(k, 0.0) + EPSILON), None)


@dataclass(frozen=True)
class PodDemand:
    """One Pending pod: what it needs (autonodes.fit.Demand), its key "ns/name" and its owner ("Job/train-7")."""

    key: str
    demand: Demand
    owner: str = ""
    gang: str = ""  # "ns/group": the coscheduling PodGroup it belongs to (all or nothing with the others)
    min_member: int | None = None  # the gang's minMember, when the pod says it
    not_on: frozenset[str] = frozenset()  # nodes its scheduler found without room for it (their use may look free)


@dataclass(frozen=True)
class TypeOption:
    """A NodeType a pool may launch: its cost (NodeType.effective_cost()), allocatable (its resources, parsed),
    the properties its nodes carry as labels (effective_properties()), and its free hosts (available hosts
    not yet promised to a pending claim; None: not counted)."""

    name: str
    cost: float
    allocatable: dict[str, float]
    properties: dict[str, str] = field(default_factory=dict)
    free_hosts: int | None = None
    # For pools of groups: free hosts per rail group (or rack: what the pool's groups share), {"rail r2": 3};
    # None: not counted.
    free_domains: dict[str, int] | None = None


@dataclass(frozen=True)
class PoolOption:
    """A dynamic pool of the tenant: its weight, nodeLabels, taints, the NodeTypes its nodeTypeSelector
    matches, its limits ({"nodes": 4, "nvidia.com/gpu": 32, ...} parsed) and what its live claims already
    count against them ({"nodes": 2, "nvidia.com/gpu": 16, ...}: each claim's type's resources)."""

    name: str
    types: tuple[TypeOption, ...]
    weight: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict, ...] = ()
    limits: dict[str, float] = field(default_factory=dict)
    used: dict[str, float] = field(default_factory=dict)
    group_size: int = 0  # new nodes come in all-or-nothing groups of this many (0: one by one)
    group_where: str = "on one rail group"  # what a group's hosts share, for messages
    # A pool with `topology` and no group: where its nodes are kept ("on one rail group (rail r3)"); its types'
    # free_hosts count only the hosts there.
    kept_where: str = ""


@dataclass
class Node:
    """Capacity that exists: a Ready node or a claim in flight (name: the claim's), its labels (the claim's
    node_labels + its type's properties), taints, and what is free on it (allocatable less daemonset overhead
    less what is bound or already planned there; every resource of its type is a key, 0 when used up)."""

    name: str
    pool: str
    labels: dict[str, str]
    taints: tuple[dict, ...]
    free: dict[str, float]


@dataclass(frozen=True)
class Problem:
    """One tenant's decision. `overhead`: the daemonset pods' requests on every node (settings.
    AUTONODES_DAEMONSET_OVERHEAD); `quota_nodes_left`: nodes the tenant's quota still allows (None: no quota)."""

    pods: tuple[PodDemand, ...]
    pools: tuple[PoolOption, ...]
    nodes: tuple[Node, ...] = ()
    overhead: dict[str, float] = field(default_factory=dict)
    quota_nodes_left: int | None = None


@dataclass(frozen=True)
class Verdict:
    """Why a pod waits or cannot be served: reason (a DecisionReason value), a sentence, the pool concerned."""

    reason: str
    message: str
    pool: str = ""


@dataclass
class Launch:
    """One new node: its pool, its NodeType (the cheapest that holds all its pods) and the pods ("ns/name")."""

    pool: str
    node_type: str
    pods: list[str]


@dataclass
class GroupLaunch:
    """One all-or-nothing group of new nodes: its pool, NodeType, where it is expected to go ("rail r2"), and
    each member's pods (`nodes`, `size` lists; a member may have none: a group is asked for whole)."""

    pool: str
    node_type: str
    domain: str
    nodes: list[list[str]]


@dataclass
class Outcome:
    launches: list[Launch] = field(default_factory=list)
    groups: list[GroupLaunch] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)  # pod → the existing node (claim) it fits on
    waiting: dict[str, Verdict] = field(default_factory=dict)
    unservable: dict[str, Verdict] = field(default_factory=dict)


def _size(pod: PodDemand) -> tuple:
    """First-fit decreasing order: extended resources (GPUs) first, then cpu, then memory; then by key."""
    requests = pod.demand.requests
    extended = sum(v for k, v in requests.items() if is_extended(k))
    return (-extended, -requests.get("cpu", 0.0), -requests.get("memory", 0.0), pod.key)


def _holds(usable: dict[str, float], requested: dict[str, float]) -> bool:
    return all(v <= usable.get(k, 0.0) + EPSILON for k, v in requested.items() if v > 0)


@dataclass
class _Type:
    option: TypeOption
    labels: dict  # the pool's nodeLabels + the type's properties
    usable: dict  # allocatable less overhead
    extended: frozenset


@dataclass
class _Pool:
    option: PoolOption
    types: list[_Type]  # cheapest first
    opened: int = 0
    reserved: dict = field(default_factory=dict)  # what the nodes opened in this pass may use of the limits


@dataclass
class _Group:
    """An all-or-nothing group this pass asks for: its seats are taken by new nodes of its pool and type."""

    pool: _Pool
    type: _Type
    domain: str
    members: list = field(default_factory=list)  # _NewNode


@dataclass
class _NewNode:
    pool: _Pool
    types: list[_Type]  # those that still hold every pod on it, cheapest first
    requested: dict
    pods: list[str]
    reservation: dict  # the most each limited resource may take: the max over `types`
    group: _Group | None = None


class _Simulation:
    def __init__(self, problem: Problem):
        self.problem = problem
        overhead = problem.overhead
        self.pools = []
        for pool in sorted(problem.pools, key=lambda p: (-(p.weight or 0), p.name)):
            types = [_Type(option=t, labels={**pool.labels, **t.properties},
                           usable={k: v - overhead.get(k, 0.0) for k, v in with_undeclared(t.allocatable).items()},
                           extended=frozenset(k for k, v in t.allocatable.items() if is_extended(k) and v > 0))
                     for t in sorted(pool.types, key=lambda t: (t.cost, t.name))]
            self.pools.append(_Pool(option=pool, types=types))
        self.nodes = [Node(n.name, n.pool, n.labels, n.taints, dict(n.free)) for n in problem.nodes]
        self.new_nodes: list[_NewNode] = []
        self.quota_left = problem.quota_nodes_left
        self.host_use: Counter = Counter()  # type name → new nodes that would take one of its free hosts
        self.domain_use: Counter = Counter()  # (type name, domain) → hosts the groups of this pass take there
        self.groups: list[_Group] = []
        self.outcome = Outcome()
        self._compat_cache: dict = {}

    # --- which pools and types may serve a pod at all ------------------------------------------------------
    def compatible(self, pod: PodDemand) -> list[tuple[_Pool, list[_Type]]]:
        """The pools that may serve the pod, each with the types that hold it alone: labels, taints,
        resources, and no extended resource it does not ask for."""
        d = pod.demand
        asked = frozenset(k for k, v in d.requests.items() if v > 0)
        key = (repr(d.node_selector), repr(d.node_affinity), repr(d.tolerations), tuple(sorted(d.requests.items())))
        if key in self._compat_cache:
            return self._compat_cache[key]
        out = []
        for pool in self.pools:
            types = [t for t in pool.types
                     if t.extended <= asked and _holds(t.usable, d.requests)
                     and why_not(d, t.labels, list(pool.option.taints), None) is None]
            if types:
                out.append((pool, types))
        self._compat_cache[key] = out
        return out

    def unservable(self, pod: PodDemand) -> Verdict:
        d = pod.demand
        asked = frozenset(k for k, v in d.requests.items() if v > 0)
        matching: list[tuple[_Pool, list[_Type]]] = []
        refusals = []
        for pool in self.pools:
            if not pool.types:
                refusals.append(f"pool {pool.option.name}: no NodeType matches its nodeTypeSelector")
                continue
            reasons = [why_not(d, t.labels, list(pool.option.taints), None) for t in pool.types]
            types = [t for t, r in zip(pool.types, reasons) if r is None]
            if types:
                matching.append((pool, types))
            else:
                refusals.append(f"pool {pool.option.name}: {reasons[0]}")
        if not matching:
            if not self.pools:
                return Verdict(DecisionReason.NO_POOL, f"no pool matches pod {pod.key}: the tenant has no dynamic pool")
            more = f"; and {len(refusals) - 3} more" if len(refusals) > 3 else ""
            return Verdict(DecisionReason.NO_POOL, f"no pool matches pod {pod.key}: " + "; ".join(refusals[:3]) + more)
        pool = matching[0][0].option.name
        candidates = [t for _, types in matching for t in types]
        sized = [t for t in candidates if t.extended <= asked]
        if not sized:
            t = candidates[0]
            extra = ", ".join(sorted(t.extended - asked))
            names = ", ".join(sorted({c.option.name for c in candidates}))
            return Verdict(DecisionReason.NO_NODE_TYPE,
                           f"no NodeType fits pod {pod.key}: {names} {'has' if ',' not in names else 'have'} "
                           f"{extra}, which it does not ask for", pool)
        for resource, value in sorted(d.requests.items(), key=lambda kv: (not is_extended(kv[0]), kv[0])):
            largest = max(t.usable.get(resource, 0.0) for t in sized)
            if value > largest + EPSILON:
                return Verdict(DecisionReason.NO_NODE_TYPE,
                               f"no NodeType fits pod {pod.key}: asks {format_quantity(resource, value)} {resource}, "
                               f"largest type has {format_quantity(resource, largest)}", pool)
        asks = ", ".join(f"{format_quantity(k, v)} {k}" for k, v in sorted(d.requests.items()) if v > 0)
        return Verdict(DecisionReason.NO_NODE_TYPE, f"no NodeType fits pod {pod.key}: none has {asks} together", pool)

    # --- limits, quota, free hosts --------------------------------------------------------------------------
    def _limit_room(self, pool: _Pool, resource: str) -> float:
        return pool.option.limits[resource] - pool.option.used.get(resource, 0.0) - pool.reserved.get(resource, 0.0)

    def _counted(self, pool: _Pool) -> dict[str, float]:
        """What the pool's live claims and the nodes this pass opened count against its limits."""
        return {k: pool.option.used.get(k, 0.0) + pool.reserved.get(k, 0.0) for k in pool.option.limits}

    def _launchable(self, pool: _Pool, types: list[_Type]) -> tuple[list[_Type], Verdict | None]:
        """The types of which one more node may be launched in this pool now, or why none."""
        name = pool.option.name
        limits = pool.option.limits
        if self.quota_left is not None and self.quota_left <= 0:
            return [], Verdict(DecisionReason.QUOTA, "not added: the tenant's node quota is reached", name)
        if "nodes" in limits and self._limit_room(pool, "nodes") < 1 - EPSILON:
            return [], Verdict(DecisionReason.LIMIT, f"not added: limit nodes {limits['nodes']:g} reached", name)
        within = []
        first_limit = None
        counted = self._counted(pool)
        for t in types:
            over = over_limit(limits, counted, t.option.allocatable)  # not nodes: checked above
            if over is None:
                within.append(t)
            elif first_limit is None:
                first_limit = over
        if not within:
            return [], Verdict(DecisionReason.LIMIT,
                               f"not added: limit {first_limit} {format_quantity(first_limit, limits[first_limit])} reached",
                               name)
        free = [t for t in within if t.option.free_hosts is None or t.option.free_hosts > self.host_use[t.option.name]]
        if not free:
            names = ", ".join(t.option.name for t in within)
            noun = "type" if len(within) == 1 else "types"
            kept = f"; pool {name} keeps its nodes {pool.option.kept_where}" if pool.option.kept_where else ""
            return [], Verdict(DecisionReason.NO_CAPACITY, f"not added: no free host of {noun} {names}{kept}", name)
        return free, None

    def _group_launchable(self, pool: _Pool, types: list[_Type]) -> tuple[_Type | None, str, Verdict | None]:
        """The cheapest type of which a whole group (pool.option.group_size nodes) may be asked for now, and the
        rail group (or rack) expected to hold it; or why none: the quota, a limit, free hosts, or no rail group
        with room for the whole group."""
        name, size = pool.option.name, pool.option.group_size
        limits = pool.option.limits
        if self.quota_left is not None and self.quota_left < size:
            return None, "", Verdict(DecisionReason.QUOTA, f"not added: a group of {size} would pass the tenant's "
                                                           f"node quota ({max(self.quota_left, 0)} left)", name)
        if "nodes" in limits and self._limit_room(pool, "nodes") < size - EPSILON:
            left = max(self._limit_room(pool, "nodes"), 0.0)
            return None, "", Verdict(DecisionReason.LIMIT, f"not added: a group of {size} would pass limit nodes "
                                                           f"{limits['nodes']:g} ({left:g} left)", name)
        first_limit, short, best = None, None, None
        counted = self._counted(pool)
        for t in types:
            over = over_limit(limits, counted, t.option.allocatable, size)  # not nodes: checked above
            if over is not None:
                first_limit = first_limit or (over, t)
                continue
            # Free hosts of the type (less those promised to claims waiting for one), then per rail group.
            enough = t.option.free_hosts is None or t.option.free_hosts - self.host_use[t.option.name] >= size
            if t.option.free_domains is None:
                if enough:
                    return t, "", None
                short = short or t
                continue
            room = {d: n - self.domain_use[(t.option.name, d)] for d, n in t.option.free_domains.items()}
            fitting = sorted((n, d) for d, n in room.items() if n >= size)
            if fitting and enough:  # best fit, as the allocator places groups: the smallest domain with room
                return t, fitting[0][1], None
            if fitting:
                short = short or t
                continue
            largest = max(((n, d) for d, n in room.items()), default=None)
            if best is None or (largest is not None and largest > best[:2]):
                best = (*(largest or (0, "")), t)
        if best is not None:
            n, domain, t = best
            noun = "rack" if "rack" in pool.option.group_where and "rail" not in pool.option.group_where else "group"
            kind = f", {t.option.name}" if len(types) > 1 else ""
            where = (f"largest free {noun} has {n} ({domain}{kind})" if domain
                     else f"no free host of type {t.option.name} has a rail group label")
            return None, "", Verdict(DecisionReason.NO_CAPACITY,
                                     f"not added: needs {size} {pool.option.group_where}; {where}", name)
        if short is not None:
            left = max(short.option.free_hosts - self.host_use[short.option.name], 0)
            return None, "", Verdict(DecisionReason.NO_CAPACITY, f"not added: a group needs {size} free hosts of "
                                                                 f"type {short.option.name}; {left} free", name)
        over, t = first_limit
        return None, "", Verdict(DecisionReason.LIMIT, f"not added: a group of {size} {t.option.name} would pass "
                                                       f"limit {over} {format_quantity(over, limits[over])}", name)

    def _open_group(self, pool: _Pool, t: _Type, domain: str) -> _Group:
        size = pool.option.group_size
        group = _Group(pool=pool, type=t, domain=domain)
        for k in pool.option.limits:
            if k != "nodes":
                pool.reserved[k] = pool.reserved.get(k, 0.0) + size * t.option.allocatable.get(k, 0.0)
        pool.reserved["nodes"] = pool.reserved.get("nodes", 0.0) + size
        pool.opened += size
        if self.quota_left is not None:
            self.quota_left -= size
        self.host_use[t.option.name] += size
        if domain:
            self.domain_use[(t.option.name, domain)] += size
        self.groups.append(group)
        return group

    def _reserve(self, node: _NewNode, types: list[_Type]) -> None:
        limits = node.pool.option.limits
        new = {k: max(t.option.allocatable.get(k, 0.0) for t in types) for k in limits if k != "nodes"}
        for k, most in new.items():
            node.pool.reserved[k] = node.pool.reserved.get(k, 0.0) - node.reservation.get(k, 0.0) + most
        node.reservation = new
        old_cheapest = node.types[0].option.name if node.types else None
        node.types = types
        if old_cheapest != types[0].option.name:
            if old_cheapest is not None:
                self.host_use[old_cheapest] -= 1
            self.host_use[types[0].option.name] += 1

    # --- the pass ------------------------------------------------------------------------------------------
    def place_on_existing(self, pod: PodDemand) -> bool:
        asked = {k for k, v in pod.demand.requests.items() if v > 0}
        for node in self.nodes:
            if node.name in pod.not_on:
                continue
            # The extended-resource rule holds here too: a CPU pod does not wait for a GPU server.
            if any(is_extended(k) and k not in asked for k in node.free):
                continue
            if why_not(pod.demand, node.labels, list(node.taints), node.free) is None:
                for k, v in pod.demand.requests.items():
                    node.free[k] = node.free.get(k, 0.0) - v
                self.outcome.placed[pod.key] = node.name
                return True
        return False

    def add_to_new(self, pod: PodDemand, compatible: list[tuple[_Pool, list[_Type]]]) -> bool:
        allowed = {id(pool): {id(t) for t in types} for pool, types in compatible}
        for node in self.new_nodes:
            ids = allowed.get(id(node.pool))
            if ids is None:
                continue
            requested = total_resources([node.requested, pod.demand.requests])
            types = [t for t in node.types if id(t) in ids and _holds(t.usable, requested)]
            if node.group is not None:  # its type is the group's: reserved with it
                if types:
                    node.requested = requested
                    node.pods.append(pod.key)
                    return True
                continue
            # A new cheapest type must have a free host of its own.
            types = [t for t in types if t is node.types[0] or t.option.free_hosts is None
                     or t.option.free_hosts > self.host_use[t.option.name]]
            if types:
                self._reserve(node, types)
                node.requested = requested
                node.pods.append(pod.key)
                return True
        return False

    def open_new(self, pod: PodDemand, compatible: list[tuple[_Pool, list[_Type]]]) -> Verdict | None:
        first = None
        for pool, types in compatible:
            if pool.option.group_size:
                why = self._open_in_group(pod, pool, types)
                if why is None:
                    return None
                first = first or why
                continue
            launchable, why = self._launchable(pool, types)
            if not launchable:
                first = first or why
                continue
            node = _NewNode(pool=pool, types=[], requested=dict(pod.demand.requests), pods=[pod.key], reservation={})
            self._reserve(node, launchable)
            pool.opened += 1
            pool.reserved["nodes"] = pool.reserved.get("nodes", 0.0) + 1
            if self.quota_left is not None:
                self.quota_left -= 1
            self.new_nodes.append(node)
            return None
        return first

    def _open_in_group(self, pod: PodDemand, pool: _Pool, types: list[_Type]) -> Verdict | None:
        """A new node of a pool of groups: a free seat of a group this pass already asks for (same type), else a
        new group of the cheapest type that may have one."""
        ids = {id(t) for t in types}
        group = next((g for g in self.groups if g.pool is pool and id(g.type) in ids
                      and len(g.members) < pool.option.group_size), None)
        if group is None:
            t, domain, why = self._group_launchable(pool, types)
            if t is None:
                return why
            group = self._open_group(pool, t, domain)
        node = _NewNode(pool=pool, types=[group.type], requested=dict(pod.demand.requests), pods=[pod.key],
                        reservation={}, group=group)
        group.members.append(node)
        self.new_nodes.append(node)
        return None

    def place(self, pod: PodDemand) -> tuple[str, Verdict | None]:
        """One pod: "placed" (on existing capacity or a new node), "waiting" or "unservable" with the verdict."""
        if self.place_on_existing(pod):
            return "placed", None
        compatible = self.compatible(pod)
        if not compatible:
            return "unservable", self.unservable(pod)
        if self.add_to_new(pod, compatible):
            return "placed", None
        why = self.open_new(pod, compatible)
        return ("waiting", why) if why is not None else ("placed", None)

    def _save(self) -> tuple:
        """What placing pods changes, to undo a gang that did not fit (cheaper than a deep copy: a pass may
        have hundreds of gangs)."""
        return ([dict(n.free) for n in self.nodes],
                [(list(n.types), dict(n.requested), len(n.pods), dict(n.reservation)) for n in self.new_nodes],
                [(p.opened, dict(p.reserved)) for p in self.pools],
                [len(g.members) for g in self.groups],
                self.quota_left, Counter(self.host_use), Counter(self.domain_use), len(self.outcome.placed))

    def _restore(self, saved: tuple) -> None:
        free, new_nodes, pools, groups, self.quota_left, self.host_use, self.domain_use, placed = saved
        for node, was in zip(self.nodes, free):
            node.free = was
        del self.new_nodes[len(new_nodes):]
        for node, (types, requested, pods, reservation) in zip(self.new_nodes, new_nodes):
            node.types, node.requested, node.reservation = types, requested, reservation
            del node.pods[pods:]
        for pool, (opened, reserved) in zip(self.pools, pools):
            pool.opened, pool.reserved = opened, reserved
        del self.groups[len(groups):]
        for group, members in zip(self.groups, groups):
            del group.members[members:]
        for key in list(self.outcome.placed)[placed:]:
            del self.outcome.placed[key]

    def place_gang(self, gang: str, pods: list[PodDemand]) -> None:
        """All of the gang's pods, or none: a pod that finds no room undoes what was planned for the others."""
        saved = self._save()
        for pod in sorted(pods, key=_size):
            outcome, why = self.place(pod)
            if outcome == "placed":
                continue
            self._restore(saved)
            together = (f"gang {gang}: its {len(pods)} pods are added together or not at all; "
                        f"pod {pod.key} {'cannot be served' if outcome == 'unservable' else 'finds no room'}")
            for other in pods:
                if other is pod and outcome == "unservable":
                    self.outcome.unservable[pod.key] = why
                else:
                    self.outcome.waiting[other.key] = Verdict(why.reason, f"{together}: {why.message}", why.pool)
            return

    def run(self) -> Outcome:
        gangs: dict[str, list[PodDemand]] = {}
        alone = []
        for pod in self.problem.pods:
            if pod.gang:
                gangs.setdefault(pod.gang, []).append(pod)
            else:
                alone.append(pod)
        # Gangs first (all or nothing is the harder fit), largest first; then the other pods, largest first.
        for gang, pods in sorted(gangs.items(), key=lambda kv: (min(_size(p) for p in kv[1]), kv[0])):
            self.place_gang(gang, pods)
        for pod in sorted(alone, key=_size):
            outcome, why = self.place(pod)
            if outcome == "unservable":
                self.outcome.unservable[pod.key] = why
            elif outcome == "waiting":
                self.outcome.waiting[pod.key] = why
        self.outcome.launches = [Launch(pool=n.pool.option.name, node_type=n.types[0].option.name, pods=n.pods)
                                 for n in self.new_nodes if n.group is None]
        self.outcome.groups = [
            GroupLaunch(pool=g.pool.option.name, node_type=g.type.option.name, domain=g.domain,
                        nodes=[n.pods for n in g.members] + [[] for _ in range(g.pool.option.group_size
                                                                              - len(g.members))])
            for g in self.groups]
        return self.outcome


def simulate(problem: Problem) -> Outcome:
    """Decide for one tenant's Pending pods: launches, placements on existing capacity, waiting, unservable."""
    return _Simulation(problem).run()
