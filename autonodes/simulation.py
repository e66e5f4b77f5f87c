"""The scheduling simulation of dynamic pools, as Karpenter's: which pool and NodeType serve each Pending pod, and
how few new nodes hold them all. Pure: plain dataclasses in and out, no database, no I/O (autonodes.services
reads the rows, calls `simulate` and writes what it decided).

The rules, in order, for each pod, largest first (first-fit decreasing):
1. a node that exists (a Ready node or a claim in flight) where it fits (and that has no extended resource the
   pod does not ask for, as in 3.): nothing is launched for it;
2. a node this pass already opened, if the pod fits it with one of the NodeTypes still possible for that node;
3. a new node of the first pool (highest weight first) that may serve it: its nodeSelector and required node
   affinity against the pool's nodeLabels + the type's properties, its tolerations against the pool's taints;
   of the pool's types those that hold the pod (allocatable less daemonset overhead), that have no extended
   resource (nvidia.com/gpu, ...) the pod does not ask for, that fit in the pool's limits, the tenant's quota
   and the free hosts. A node keeps every type that still holds all its pods; the cheapest is launched.
A pod no pool and type could ever serve is unservable (with the reason); one that only a limit, the quota or
the lack of free hosts keeps out is waiting (with the reason).
"""
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


@dataclass(frozen=True)
class PodDemand:
    """One Pending pod: what it needs (autonodes.fit.Demand), its key "ns/name" and its owner ("Job/train-7")."""

    key: str
    demand: Demand
    owner: str = ""


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
class Outcome:
    launches: list[Launch] = field(default_factory=list)
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
class _NewNode:
    pool: _Pool
    types: list[_Type]  # those that still hold every pod on it, cheapest first
    requested: dict
    pods: list[str]
    reservation: dict  # the most each limited resource may take: the max over `types`


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
        for t in types:
            over = next((k for k in sorted(limits) if k != "nodes"
                         and t.option.allocatable.get(k, 0.0) > self._limit_room(pool, k) + EPSILON), None)
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
            return [], Verdict(DecisionReason.NO_CAPACITY, f"not added: no free host of {noun} {names}", name)
        return free, None

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

    def run(self) -> Outcome:
        for pod in sorted(self.problem.pods, key=_size):
            if self.place_on_existing(pod):
                continue
            compatible = self.compatible(pod)
            if not compatible:
                self.outcome.unservable[pod.key] = self.unservable(pod)
                continue
            if self.add_to_new(pod, compatible):
                continue
            why = self.open_new(pod, compatible)
            if why is not None:
                self.outcome.waiting[pod.key] = why
        self.outcome.launches = [Launch(pool=n.pool.option.name, node_type=n.types[0].option.name, pods=n.pods)
                                 for n in self.new_nodes]
        return self.outcome


def simulate(problem: Problem) -> Outcome:
    """Decide for one tenant's Pending pods: launches, placements on existing capacity, waiting, unservable."""
    return _Simulation(problem).run()
