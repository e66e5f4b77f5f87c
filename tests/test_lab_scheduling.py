"""The lab scheduler's own filters (lab/scheduling.py) against kube-scheduler's documented rules, and the reason
they are its own: when the console's predicates (autonodes/fit.py) are wrong on purpose, Auto Nodes' simulation
believes a pod fits an existing node while the lab's tenant API keeps it Pending, so a lab test would catch it."""
from fractions import Fraction

import pytest
import yaml
from kubernetes import client, config

from autonodes import fit
from autonodes.simulation import Node, PodDemand, PoolOption, Problem, TypeOption, simulate
from claims.tenant_api import TenantAPI
from conftest import wait_for
from lab.kube import TenantAPIServer, kubelet_join
from lab.scheduling import (
    filter_node, node_affinity_matches, node_free, parse_quantity, pod_requests, take, tolerates, untolerated_taint,
)

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
GPU_SERVER = {"cpu": "192", "memory": "2097152Mi", "nvidia.com/gpu": "8", "pods": "110"}


def a_pod(*, requests=None, limits=None, name="p", **spec) -> dict:
    container = {"name": "main", "resources": {k: v for k, v in (("requests", requests), ("limits", limits)) if v}}
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"containers": [container], **spec}}


def a_node(name="n1", *, labels=None, taints=None, allocatable=None, ready="True", unschedulable=False) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
            "status": {"allocatable": allocatable or {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def fits(pod, node) -> list[str]:
    return filter_node(pod, node, node_free(node, []))


@pytest.mark.parametrize("text, value", [
    ("1", 1), ("500m", Fraction(1, 2)), ("1.5", Fraction(3, 2)), ("2Gi", 2 * 2**30), ("1Ki", 1024), ("1k", 1000),
    ("1M", 10**6), ("3e2", 300), ("1E", 10**18), ("100n", Fraction(1, 10**7)), (".5", Fraction(1, 2)), (8, 8)])
def test_quantities_are_read_exactly_with_decimal_binary_and_exponent_suffixes(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "1.5.3", "Gi", "1GB", "one", "1e"])
def test_a_malformed_quantity_is_refused(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_a_pods_request_sums_its_containers_takes_a_limit_for_a_missing_request_and_adds_the_overhead():
    pod = a_pod(requests={"cpu": "100m"}, limits={"cpu": "1", "nvidia.com/gpu": "2"})
    pod["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "200m", "memory": "1Gi"}}})
    pod["spec"]["overhead"] = {"cpu": "50m"}
    assert pod_requests(pod) == {"cpu": Fraction(35, 100), "nvidia.com/gpu": 2, "memory": 2**30}


def test_init_containers_count_at_their_peak_and_sidecars_keep_counting_beside_what_follows():
    pod = a_pod(requests={"cpu": "1"})
    pod["spec"]["initContainers"] = [
        {"name": "fetch", "resources": {"requests": {"cpu": "3"}}},  # alone: 3 > the app's 1
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},  # a sidecar
        {"name": "migrate", "resources": {"requests": {"cpu": "3"}}},  # beside the sidecar: 3.5
    ]
    assert pod_requests(pod) == {"cpu": Fraction(7, 2)}
    pod["spec"]["initContainers"] = pod["spec"]["initContainers"][1:2]  # the sidecar alone: app + sidecar
    assert pod_requests(pod) == {"cpu": Fraction(3, 2)}


@pytest.mark.parametrize("toleration, taint, tolerated", [
    ({"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
     {"key": "gpu", "value": "true", "effect": "NoSchedule"}, True),
    ({"key": "gpu", "value": "true"}, {"key": "gpu", "value": "true", "effect": "NoExecute"}, True),  # Equal, any effect
    ({"key": "gpu", "value": "false", "effect": "NoSchedule"}, {"key": "gpu", "value": "true", "effect": "NoSchedule"},
     False),
    ({"key": "gpu", "operator": "Exists"}, {"key": "gpu", "value": "anything", "effect": "NoSchedule"}, True),
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, {"key": "gpu", "effect": "NoSchedule"}, False),
    ({"key": "other", "operator": "Exists"}, {"key": "gpu", "effect": "NoSchedule"}, False),
    ({"operator": "Exists"}, {"key": "any/key", "value": "v", "effect": "NoExecute"}, True),  # tolerates everything
    ({"operator": "Exists", "effect": "NoSchedule"}, {"key": "k", "effect": "NoExecute"}, False),
    ({"key": "gpu", "operator": "Gt", "value": "1"}, {"key": "gpu", "value": "2", "effect": "NoSchedule"}, False),
])
def test_a_toleration_matches_a_taint_by_effect_key_and_operator(toleration, taint, tolerated):
    assert tolerates(toleration, taint) is tolerated


def test_only_noschedule_and_noexecute_taints_keep_a_pod_off():
    soft = {"key": "spot", "value": "true", "effect": "PreferNoSchedule"}
    hard = {"key": "dedicated", "value": "ml", "effect": "NoExecute"}
    assert untolerated_taint([], [soft]) is None
    assert untolerated_taint([], [soft, hard]) == hard
    assert untolerated_taint([{"key": "dedicated", "operator": "Exists"}], [soft, hard]) is None
    assert fits(a_pod(), a_node(taints=[hard])) == ["node(s) had untolerated taint {dedicated: ml}"]


@pytest.mark.parametrize("expression, fits_node", [
    ({"key": "zone", "operator": "In", "values": ["r1", "r2"]}, True),
    ({"key": "zone", "operator": "In", "values": ["r3"]}, False),
    ({"key": "zone", "operator": "NotIn", "values": ["r3"]}, True),
    ({"key": "rack", "operator": "NotIn", "values": ["a"]}, True),  # absent label: NotIn holds
    ({"key": "zone", "operator": "Exists"}, True),
    ({"key": "rack", "operator": "Exists"}, False),
    ({"key": "rack", "operator": "DoesNotExist"}, True),
    ({"key": "gpus", "operator": "Gt", "values": ["4"]}, True),
    ({"key": "gpus", "operator": "Lt", "values": ["8"]}, False),
    ({"key": "zone", "operator": "Gt", "values": ["1"]}, False),  # not an integer
    ({"key": "rack", "operator": "Lt", "values": ["9"]}, False),  # absent
])
def test_required_node_affinity_expressions_follow_their_operators(expression, fits_node):
    node = a_node(labels={"zone": "r1", "gpus": "8"})
    pod = a_pod(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}})
    assert node_affinity_matches(pod, node) is fits_node


def required(*terms) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_terms_are_ored_expressions_anded_an_empty_term_matches_nothing_and_fields_name_the_node():
    node = a_node("gpu-7", labels={"zone": "r1", "tier": "a"})
    zone = {"key": "zone", "operator": "In", "values": ["r1"]}
    wrong_tier = {"key": "tier", "operator": "In", "values": ["b"]}
    assert not node_affinity_matches(a_pod(affinity=required({"matchExpressions": [zone, wrong_tier]})), node)
    assert node_affinity_matches(a_pod(affinity=required({"matchExpressions": [wrong_tier]},
                                                         {"matchExpressions": [zone]})), node)
    assert not node_affinity_matches(a_pod(affinity=required({})), node)
    by_name = {"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}
    assert node_affinity_matches(a_pod(affinity=required({"matchFields": [by_name]})), node)
    assert not node_affinity_matches(a_pod(affinity=required({"matchFields": [{**by_name, "values": ["gpu-8"]}]})),
                                     node)
    assert fits(a_pod(affinity=required({})), node) == ["node(s) didn't match Pod's node affinity/selector"]


def test_a_node_selector_needs_every_pair_and_goes_with_the_affinity():
    node = a_node(labels={"zone": "r1", "tier": "a"})
    assert node_affinity_matches(a_pod(nodeSelector={"zone": "r1", "tier": "a"}), node)
    assert not node_affinity_matches(a_pod(nodeSelector={"zone": "r1", "tier": "b"}), node)
    assert not node_affinity_matches(a_pod(nodeSelector={"rack": ""}), node)  # absent is not empty
    assert not node_affinity_matches(a_pod(nodeSelector={"zone": "r1"}, affinity=required(
        {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]})), node)


def test_requests_fit_allocatable_less_the_bound_pods_and_every_short_resource_is_named():
    node = a_node(allocatable={"cpu": "4", "memory": "8Gi", "pods": "2"})
    assert fits(a_pod(requests={"cpu": "4", "memory": "8Gi"}), node) == []
    assert fits(a_pod(requests={"cpu": "4001m", "memory": "9Gi", "nvidia.com/gpu": "1"}), node) == [
        "Insufficient cpu", "Insufficient memory", "Insufficient nvidia.com/gpu"]  # a resource it lacks counts 0
    assert fits(a_pod(requests={"nvidia.com/gpu": "0"}), node) == []  # a zero request is not checked
    free = node_free(node, [a_pod(requests={"cpu": "100m"}), a_pod(requests={"cpu": "200m"})])
    assert free["cpu"] == Fraction(37, 10)  # exact: no rounding lets 0.1 + 0.2 + 3.7 pass over 4
    assert filter_node(a_pod(requests={"cpu": "3700m"}), node, free) == ["Too many pods"]
    unlimited = a_node(allocatable={"cpu": "1"})
    free = node_free(unlimited, [a_pod()] * 500)
    take(free, a_pod())
    assert filter_node(a_pod(requests={"cpu": "1"}), unlimited, free) == []  # no pods count posted: no limit


def test_cordoned_named_and_not_ready_nodes_are_filtered_first_in_kube_schedulers_order():
    cordoned = a_node(unschedulable=True, taints=[GPU_TAINT])
    assert fits(a_pod(), cordoned) == ["node(s) were unschedulable"]
    tolerant = [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]
    assert fits(a_pod(tolerations=tolerant), cordoned) == ["node(s) had untolerated taint {nvidia.com/gpu: true}"]
    assert fits(a_pod(nodeName="n2"), a_node("n1")) == ["node(s) didn't match the requested node name"]
    assert fits(a_pod(nodeName="n1"), a_node("n1")) == []
    assert fits(a_pod(), a_node(ready="False")) == ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"]
    assert fits(a_pod(), a_node(ready="Unknown")) == [
        "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]
    assert fits(a_pod(tolerations=[{"operator": "Exists"}]), a_node(ready="Unknown")) == []


def _tolerated_by_key_only(taint, toleration):
    """A wrong rule, on purpose: a toleration of the taint's key tolerates it whatever the values say."""
    return not toleration.get("key") or toleration["key"] == taint.get("key")


@pytest.fixture
def tenant():
    with TenantAPIServer("acme", termination_s=0.1) as server:
        yield server


def test_a_wrong_predicate_in_the_console_leaves_the_lab_pod_pending_where_auto_nodes_expects_it_to_run(
        tenant, monkeypatch):
    """The console's Auto Nodes simulation, fed the lab's own pod and node, decides where the pod goes; with
    the console's toleration rule broken it places the pod on the tainted node and launches nothing, while the
    lab's scheduler keeps the pod Unschedulable, as kube-scheduler would: the flow's wait for a Running pod fails."""
    console = TenantAPI(tenant.kubeconfig(), timeout=5)
    kubelet_join(tenant.endpoint, console.create_bootstrap_token().token, "gpu-a", capacity=GPU_SERVER,
                 sample_pods=False)
    console.set_node_labels_and_taints("gpu-a", {"vcluster.com/node-type": "gpu-server"}, [GPU_TAINT])
    api = config.new_client_from_config_dict(yaml.safe_load(tenant.kubeconfig()), persist_config=False)
    wrong_value = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "false", "effect": "NoSchedule"}]
    pod = a_pod(name="train-0", requests={"nvidia.com/gpu": "8"}, limits={"nvidia.com/gpu": "8"},
                tolerations=wrong_value)
    pod["spec"]["containers"][0]["image"] = "registry.k8s.io/pause:3.10"

    def auto_nodes_decides():
        """One simulation pass over the lab's Pending pod, its node and a dynamic gpu-server pool."""
        (seen,) = tenant.objects("pods", "default")
        (node,) = tenant.objects("nodes")
        existing = Node(name="gpu-a", pool="train", labels=node["metadata"]["labels"],
                        taints=tuple(node["spec"]["taints"]), free=fit.quantities(node["status"]["allocatable"]))
        gpu_server = TypeOption("gpu-server", 1.0, fit.quantities(GPU_SERVER), {"vcluster.com/node-type": "gpu-server"})
        return simulate(Problem(pods=(PodDemand(key="default/train-0", demand=fit.Demand.of_pod(seen)),),
                                pools=(PoolOption(name="train", types=(gpu_server,)),), nodes=(existing,)))

    def verdict():
        (seen,) = tenant.objects("pods", "default")
        return next((c for c in seen.get("status", {}).get("conditions") or [] if c["type"] == "PodScheduled"), None)

    try:
        monkeypatch.setattr(fit, "_tolerated", _tolerated_by_key_only)
        client.CoreV1Api(api).create_namespaced_pod("default", pod)
        wrong = auto_nodes_decides()
        scheduled = wait_for(verdict, timeout=10)
        monkeypatch.undo()
        right = auto_nodes_decides()
    finally:
        api.close()

    assert wrong.placed == {"default/train-0": "gpu-a"} and not wrong.launches  # "it fits there": nothing launched
    (seen,) = tenant.objects("pods", "default")
    assert not seen["spec"].get("nodeName") and seen["status"]["phase"] == "Pending"
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == (
        "False", "Unschedulable", "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: true}.")
    # With the console's rule right, the two agree: the tainted node does not take it, a new server is launched.
    assert not right.placed and [launch.pods for launch in right.launches] == [["default/train-0"]]
