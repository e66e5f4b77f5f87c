"""The lab scheduler's filters, written from kube-scheduler's documented rules and not from the console's, so that
a wrong rule in the console (autonodes/fit.py) leaves a lab pod Pending instead of agreeing with it.

The filters, in kube-scheduler's order, each with its message:
- NodeUnschedulable: a cordoned node (spec.unschedulable) takes only a pod that tolerates
  node.kubernetes.io/unschedulable:NoSchedule ("node(s) were unschedulable").
- NodeName: a pod that names a node fits that node only ("node(s) didn't match the requested node name").
- TaintToleration: every NoSchedule and NoExecute taint needs a toleration that matches it: the toleration's
  effect empty or equal, its key empty or equal, its operator Exists (any value) or Equal (the default: the same
  value); an empty key with Exists tolerates every taint. PreferNoSchedule never filters
  ("node(s) had untolerated taint {key: value}").
- NodeAffinity: every nodeSelector pair equals a label, and one of the required nodeSelectorTerms matches: all of
  its matchExpressions (In, NotIn, Exists, DoesNotExist, Gt, Lt; NotIn and DoesNotExist hold where the label is
  absent, Gt and Lt compare integers) and all of its matchFields (metadata.name, In or NotIn); an empty term
  matches no node ("node(s) didn't match Pod's node affinity/selector").
- NodeResourcesFit: each resource the pod requests (more than 0) is at most the node's allocatable less what
  its pods request, a resource the node does not list counting 0, and one more pod fits its pod count
  ("Insufficient <resource>" for each, "Too many pods").
A pod's request: per resource, the larger of its app and sidecar containers summed and the largest need of an
init container (its own request plus the sidecars started before it), plus the pod's overhead; a container's
limit stands for a request it leaves out, as the API server defaults it. Quantities are exact (fractions).
"""
from __future__ import annotations

import re
from fractions import Fraction

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
# The node lifecycle controller's taint on a node that is not Ready: Ready False, or Unknown.
NOT_READY_TAINTS = {"False": "node.kubernetes.io/not-ready", "Unknown": "node.kubernetes.io/unreachable"}
FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
SUFFIXES = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
            "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")


def parse_quantity(text) -> Fraction:
    """A Kubernetes quantity ("500m", "2Gi", "1e3", "1.5", 8) as an exact number. Raises ValueError."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    return value * (Fraction(10) ** int(exponent[1:]) if exponent else SUFFIXES[suffix or ""])


def resource_map(values: dict | None) -> dict[str, Fraction]:
    """{"cpu": "500m"} → {"cpu": Fraction(1, 2)}; a value that is no quantity is left out (the API server would
    have refused the object)."""
    out = {}
    for name, value in (values or {}).items():
        try:
            out[name] = parse_quantity(value)
        except ValueError:
            continue
    return out


def container_requests(container: dict) -> dict[str, Fraction]:
    resources = container.get("resources") or {}
    return {**resource_map(resources.get("limits")), **resource_map(resources.get("requests"))}


def pod_requests(pod: dict) -> dict[str, Fraction]:
    spec = pod.get("spec") or {}
    running: dict[str, Fraction] = {}
    for container in spec.get("containers") or []:
        _add(running, container_requests(container))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for container in spec.get("initContainers") or []:
        asked = container_requests(container)
        if container.get("restartPolicy") == "Always":  # a sidecar: it keeps running beside what follows
            _add(sidecars, asked)
            need = dict(sidecars)
        else:
            need = _add(dict(sidecars), asked)
        for name, value in need.items():
            init_peak[name] = max(init_peak.get(name, Fraction(0)), value)
    total = _add(running, sidecars)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, Fraction(0)), value)
    return _add(total, resource_map(spec.get("overhead")))


def _add(total: dict[str, Fraction], more: dict[str, Fraction]) -> dict[str, Fraction]:
    for name, value in more.items():
        total[name] = total.get(name, Fraction(0)) + value
    return total


def tolerates(toleration: dict, taint: dict) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(tolerations: list, taints: list) -> dict | None:
    """The first NoSchedule or NoExecute taint that no toleration matches; None when all are tolerated."""
    return next((taint for taint in taints or [] if taint.get("effect") in FILTERING_EFFECTS
                 and not any(tolerates(t, taint) for t in tolerations or [])), None)


def requirement_matches(requirement: dict, values_of: dict) -> bool:
    """One matchExpressions (or matchFields) entry against labels (or fields)."""
    key, operator = requirement.get("key", ""), requirement.get("operator")
    wanted = [str(v) for v in requirement.get("values") or []]
    present = key in values_of
    value = str(values_of[key]) if present else None
    if operator == "In":
        return present and value in wanted
    if operator == "NotIn":
        return not present or value not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: dict, labels: dict, node_name: str) -> bool:
    expressions = (term or {}).get("matchExpressions") or []
    fields = (term or {}).get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return (all(requirement_matches(e, labels) for e in expressions)
            and all(f.get("key") == "metadata.name" and f.get("operator") in ("In", "NotIn")
                    and requirement_matches(f, {"metadata.name": node_name}) for f in fields))


def node_affinity_matches(pod: dict, node: dict) -> bool:
    spec = pod.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if any(key not in labels or str(labels[key]) != str(value) for key, value in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    return any(term_matches(term, labels, meta.get("name", "")) for term in required.get("nodeSelectorTerms") or [])


def node_taints(node: dict) -> list[dict]:
    """The node's taints as the scheduler sees them: with the lifecycle controller's when it is not Ready."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                  if c.get("type") == "Ready"), "False")
    if ready != "True":
        taints.insert(0, {"key": NOT_READY_TAINTS.get(ready, NOT_READY_TAINTS["False"]), "effect": "NoSchedule"})
    return taints


def insufficient(asked: dict[str, Fraction], free: dict[str, Fraction]) -> list[str]:
    """NodeResourcesFit's reasons, by resource name; `free` without "pods": the node's pod count is not limited."""
    short = sorted(name for name, value in asked.items()
                   if value > 0 and (name != "pods" or "pods" in free) and value > free.get(name, Fraction(0)))
    return ["Too many pods" if name == "pods" else f"Insufficient {name}" for name in short]


def filter_node(pod: dict, node: dict, free: dict[str, Fraction]) -> list[str]:
    """Why kube-scheduler's filters reject the node for the pod: the first filter that fails (every short resource
    from NodeResourcesFit), or [] when it fits. `free`: allocatable less what the node's pods request."""
    spec = pod.get("spec") or {}
    tolerations = spec.get("tolerations") or []
    name = (node.get("metadata") or {}).get("name")
    if (node.get("spec") or {}).get("unschedulable") and not any(tolerates(t, UNSCHEDULABLE_TAINT) for t in tolerations):
        return ["node(s) were unschedulable"]
    if spec.get("nodeName") and spec["nodeName"] != name:
        return ["node(s) didn't match the requested node name"]
    if (taint := untolerated_taint(tolerations, node_taints(node))) is not None:
        return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"]
    if not node_affinity_matches(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    return insufficient({**pod_requests(pod), "pods": Fraction(1)}, free)


def node_free(node: dict, bound: list[dict]) -> dict[str, Fraction]:
    """The node's allocatable less what its pods that still run request (and one pod slot each)."""
    free = resource_map((node.get("status") or {}).get("allocatable"))
    for pod in bound:
        take(free, pod)
    return free


def take(free: dict[str, Fraction], pod: dict) -> None:
    """The pod bound to the node: its requests and one pod slot leave what is free."""
    for name, value in {**pod_requests(pod), "pods": Fraction(1)}.items():
        if name != "pods" or name in free:
            free[name] = free.get(name, Fraction(0)) - value
