"""Whether a pod fits a node, as kube-scheduler's filters and Karpenter's simulation decide it: requests against
what is free, nodeSelector and required node affinity against labels, tolerations against taints."""
# One place for these rules: the console's scheduling simulation (which pool and NodeType serve a Pending pod)
# and disruption (would this node's pods fit elsewhere) call them; the lab's scheduler has its own
# (lab/scheduling.py), so that a wrong rule here fails a lab test. Plain dicts in, so that pods read from the API,
# PendingPod rows and simulated nodes are all the same thing here.
from __future__ import annotations

from dataclasses import dataclass, field

from pools.matching import requirements_match
from pools.validators import parse_quantity

DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SCHEDULING_EFFECTS = {"NoSchedule", "NoExecute"}  # PreferNoSchedule does not keep a pod off a node


def quantities(values: dict | None) -> dict[str, float]:
    """{"cpu": "500m", "memory": "1Gi"} → {"cpu": 0.5, "memory": 1073741824.0}; bad values are skipped."""
    out: dict[str, float] = {}
    for key, value in (values or {}).items():
        try:
            out[key] = parse_quantity(value)
        except (TypeError, ValueError):
            continue
    return out


def add_resources(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Adds `more` into `total` (in place) and returns it."""
    for key, value in more.items():
        total[key] = total.get(key, 0.0) + value
    return total


def total_resources(parts) -> dict[str, float]:
    """The sum of several parsed resource maps, as a new map."""
    total: dict[str, float] = {}
    for part in parts:
        add_resources(total, part)
    return total


def pod_requests(pod: dict) -> dict[str, float]:
    """What the pod asks for: its containers' requests summed (a limit stands for a missing request, as the API
    server defaults it), the largest init container where that is more, plus the pod's overhead."""
    spec = pod.get("spec") or {}

    def asked(container: dict) -> dict[str, float]:
        resources = container.get("resources") or {}
        return {**quantities(resources.get("limits")), **quantities(resources.get("requests"))}

    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        add_resources(total, asked(container))
    for container in spec.get("initContainers") or []:
        for key, value in asked(container).items():
            total[key] = max(total.get(key, 0.0), value)
    return add_resources(total, quantities(spec.get("overhead")))


def is_daemonset_pod(pod: dict) -> bool:
    return any(ref.get("kind") == "DaemonSet" for ref in (pod.get("metadata") or {}).get("ownerReferences") or [])


def is_unschedulable(pod: dict) -> bool:
    """Pending, not bound, and the scheduler said PodScheduled=False with reason Unschedulable."""
    status = pod.get("status") or {}
    return ((pod.get("spec") or {}).get("nodeName") in (None, "") and status.get("phase", "Pending") == "Pending"
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
                    for c in status.get("conditions") or []))


def do_not_disrupt(pod: dict) -> bool:
    return str(((pod.get("metadata") or {}).get("annotations") or {}).get(DO_NOT_DISRUPT, "")).lower() == "true"


@dataclass(frozen=True)
class Demand:
    """What a pod needs from a node: everything the filters look at."""

    requests: dict = field(default_factory=dict)  # parsed: {"cpu": 4.0, "nvidia.com/gpu": 8.0}
    node_selector: dict = field(default_factory=dict)
    node_affinity: list = field(default_factory=list)  # required nodeSelectorTerms
    tolerations: list = field(default_factory=list)

    @classmethod
    def of_pod(cls, pod: dict) -> Demand:
        spec = pod.get("spec") or {}
        return cls(requests=pod_requests(pod), node_selector=dict(spec.get("nodeSelector") or {}),
                   node_affinity=required_node_affinity(pod), tolerations=list(spec.get("tolerations") or []))


def required_node_affinity(pod: dict) -> list:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return list((affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])


def selector_matches(node_selector: dict, labels: dict) -> bool:
    return all(str(labels.get(key)) == str(value) and key in labels for key, value in (node_selector or {}).items())


def affinity_matches(terms: list, labels: dict) -> bool:
    """nodeSelectorTerms: any term, every matchExpression of it (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    if not terms:
        return True
    for term in terms:
        expressions = (term or {}).get("matchExpressions") or []
        requirements = [{"property": e.get("key", ""), "operator": e.get("operator", "In"), "values": e.get("values") or []}
                        for e in expressions]
        if requirements_match(requirements, labels):
            return True
    return False


def _tolerated(taint: dict, toleration: dict) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if not toleration.get("key"):  # an empty key with Exists tolerates everything
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return str(toleration.get("value", "")) == str(taint.get("value", ""))


def untolerated_taint(tolerations: list, taints: list) -> dict | None:
    """The first NoSchedule/NoExecute taint no toleration covers, or None."""
    for taint in taints or []:
        if taint.get("effect") in SCHEDULING_EFFECTS and not any(_tolerated(taint, t) for t in tolerations or []):
            return taint
    return None


def short_of(requests: dict[str, float], free: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The resources the node lacks: {name: (asked, free)}. A resource the node does not have is free 0."""
    return {key: (value, free.get(key, 0.0)) for key, value in requests.items() if value > free.get(key, 0.0) + 1e-9}


def why_not(demand: Demand, labels: dict, taints: list, free: dict[str, float] | None) -> str | None:
    """None when the pod fits; otherwise the first reason, for people. `free` None: do not check resources
    (asking whether a pool could ever serve the pod, before choosing its size)."""
    if not selector_matches(demand.node_selector, labels):
        missing = {k: v for k, v in demand.node_selector.items() if str(labels.get(k)) != str(v) or k not in labels}
        return "nodeSelector " + ", ".join(f"{k}={v}" for k, v in missing.items()) + " does not match"
    if not affinity_matches(demand.node_affinity, labels):
        return "required node affinity does not match"
    if (taint := untolerated_taint(demand.tolerations, taints)) is not None:
        value = f"={taint['value']}" if taint.get("value") else ""
        return f"does not tolerate taint {taint.get('key')}{value}:{taint.get('effect')}"
    if free is not None and (short := short_of(demand.requests, free)):
        return "; ".join(f"asks {format_quantity(k, a)} {k}, {format_quantity(k, f)} free" for k, (a, f) in short.items())
    return None


def fits(demand: Demand, labels: dict, taints: list, free: dict[str, float]) -> bool:
    return why_not(demand, labels, taints, free) is None


def format_quantity(resource: str, value: float) -> str:
    """For messages: memory in Gi, cpu in cores (or m), counts as integers."""
    if resource == "memory" or resource.endswith("storage"):
        return f"{value / 2**30:g}Gi"
    if resource == "cpu" and value != int(value):
        return f"{round(value * 1000)}m"
    return f"{value:g}"
