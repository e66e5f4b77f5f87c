"""The scheduling simulation of dynamic pools, rule by rule: packing, cheapest type, weight, extended resources,
selectors and affinity, taints, limits, quota, free hosts, existing capacity, and the reasons people read."""
import time

from autonodes.choices import DecisionReason
from autonodes.fit import Demand
from autonodes.simulation import (
    Node,
    PodDemand,
    PoolOption,
    Problem,
    TypeOption,
    simulate,
)

GI = 2**30
GPU = TypeOption("gpu-server", 1_000_000, {"cpu": 192, "memory": 2048 * GI, "nvidia.com/gpu": 8},
                 {"vcluster.com/node-type": "gpu-server"})
CPU = TypeOption("cpu-server", 5000, {"cpu": 64, "memory": 512 * GI}, {"vcluster.com/node-type": "cpu-server"})
SMALL = TypeOption("cpu-small", 1000, {"cpu": 16, "memory": 64 * GI}, {"vcluster.com/node-type": "cpu-small"})
GPU4 = TypeOption("gpu-half", 500_000, {"cpu": 96, "memory": 1024 * GI, "nvidia.com/gpu": 4},
                  {"vcluster.com/node-type": "gpu-half"})


def pod(name, owner="Job/train-7", **requests) -> PodDemand:
    return pod_with(name, requests, owner=owner)


def pod_with(name, requests, owner="", **spec) -> PodDemand:
    requests = {k.replace("gpu", "nvidia.com/gpu") if k == "gpu" else k: v for k, v in requests.items()}
    return PodDemand(key=f"ml/{name}", owner=owner, demand=Demand(requests=requests, **spec))


def pool(name="burst", types=(GPU, CPU), **kw) -> PoolOption:
    return PoolOption(name=name, types=tuple(types), **kw)


def run(pods, pools, **kw):
    return simulate(Problem(pods=tuple(pods), pools=tuple(pools), **kw))


def launched(outcome):
    return sorted((launch.pool, launch.node_type, tuple(sorted(launch.pods))) for launch in outcome.launches)


def test_first_fit_decreasing_packs_pods_into_as_few_nodes_as_hold_them():
    # 4 + 4 + 2 + 2 + 2 + 1 + 1 = 16 GPUs: two 8-GPU nodes, the big pods placed first.
    sizes = {"a": 2, "b": 4, "c": 1, "d": 2, "e": 4, "f": 2, "g": 1}
    outcome = run([pod(n, gpu=s) for n, s in sizes.items()], [pool()])
    assert len(outcome.launches) == 2
    assert all(launch.node_type == "gpu-server" for launch in outcome.launches)
    assert [sum(sizes[k[3:]] for k in launch.pods) for launch in outcome.launches] == [8, 8]
    assert outcome.launches[0].pods[:2] == ["ml/b", "ml/e"]  # largest first
    assert not outcome.waiting and not outcome.unservable


def test_three_pods_of_eight_gpus_take_three_nodes():
    outcome = run([pod(f"p{i}", gpu=8, cpu=4) for i in range(3)], [pool(limits={"nodes": 4})])
    assert launched(outcome) == [("burst", "gpu-server", ("ml/p0",)), ("burst", "gpu-server", ("ml/p1",)),
                                 ("burst", "gpu-server", ("ml/p2",))]


def test_the_cheapest_type_that_holds_the_pods_is_launched():
    outcome = run([pod("small", cpu=8)], [pool(types=(CPU, SMALL))])
    assert launched(outcome) == [("burst", "cpu-small", ("ml/small",))]
    # Together they outgrow the small type: one cpu-server rather than two cpu-small.
    outcome = run([pod("a", cpu=10), pod("b", cpu=10)], [pool(types=(CPU, SMALL))])
    assert launched(outcome) == [("burst", "cpu-server", ("ml/a", "ml/b"))]


def test_a_cpu_pod_never_gets_a_gpu_type_and_a_gpu_pod_gets_the_cheapest_gpu_type_that_holds_it():
    outcome = run([pod("cpu", cpu=4), pod("gpu4", gpu=4)], [pool(types=(GPU, GPU4, CPU))])
    assert launched(outcome) == [("burst", "cpu-server", ("ml/cpu",)), ("burst", "gpu-half", ("ml/gpu4",))]


def test_a_cpu_pod_on_a_pool_of_gpu_types_only_is_unservable_and_says_why():
    outcome = run([pod("cpu", cpu=4)], [pool(types=(GPU,))])
    assert not outcome.launches
    verdict = outcome.unservable["ml/cpu"]
    assert verdict.reason == DecisionReason.NO_NODE_TYPE and verdict.pool == "burst"
    assert verdict.message == "no NodeType fits pod ml/cpu: gpu-server has nvidia.com/gpu, which it does not ask for"


def test_pools_are_tried_by_weight_highest_first():
    pools = [pool("cheap", types=(CPU,), weight=1), pool("preferred", types=(CPU,), weight=50), pool("plain", types=(CPU,))]
    assert launched(run([pod("a", cpu=4)], pools)) == [("preferred", "cpu-server", ("ml/a",))]
    # The preferred pool at its limit: the next by weight serves.
    pools[1] = pool("preferred", types=(CPU,), weight=50, limits={"nodes": 1}, used={"nodes": 1})
    assert launched(run([pod("a", cpu=4)], pools)) == [("cheap", "cpu-server", ("ml/a",))]


def test_node_selector_and_required_affinity_match_pool_labels_and_type_properties():
    pools = [pool("a100", types=(GPU,), labels={"accelerator": "a100"}), pool("h200", types=(GPU,), labels={"accelerator": "h200"})]
    outcome = run([pod_with("sel", {"nvidia.com/gpu": 8}, node_selector={"accelerator": "h200"})], pools)
    assert launched(outcome) == [("h200", "gpu-server", ("ml/sel",))]
    terms = [{"matchExpressions": [{"key": "vcluster.com/node-type", "operator": "In", "values": ["cpu-small"]}]}]
    outcome = run([pod_with("aff", {"cpu": 2}, node_affinity=terms)], [pool(types=(CPU, SMALL))])
    assert launched(outcome) == [("burst", "cpu-small", ("ml/aff",))]
    terms = [{"matchExpressions": [{"key": "accelerator", "operator": "NotIn", "values": ["a100"]}]}]
    outcome = run([pod_with("not", {"nvidia.com/gpu": 8}, node_affinity=terms)], pools)
    assert launched(outcome) == [("h200", "gpu-server", ("ml/not",))]


def test_no_pool_matching_the_selector_is_unservable_and_names_each_pool():
    pools = [pool("a100", types=(GPU,), labels={"accelerator": "a100"})]
    outcome = run([pod_with("x", {"nvidia.com/gpu": 8}, node_selector={"accelerator": "b200"})], pools)
    verdict = outcome.unservable["ml/x"]
    assert verdict.reason == DecisionReason.NO_POOL and verdict.pool == ""
    assert verdict.message == "no pool matches pod ml/x: pool a100: nodeSelector accelerator=b200 does not match"


def test_a_pod_without_the_toleration_never_lands_on_a_tainted_pool():
    taint = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    pools = [pool("tainted", types=(CPU,), taints=(taint,), weight=100), pool("open", types=(CPU,))]
    assert launched(run([pod("plain", cpu=2)], pools)) == [("open", "cpu-server", ("ml/plain",))]
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert launched(run([pod_with("tol", {"cpu": 2}, tolerations=toleration)], pools)) == [
        ("tainted", "cpu-server", ("ml/tol",))]
    outcome = run([pod("plain", cpu=2)], pools[:1])
    assert outcome.unservable["ml/plain"].message == (
        "no pool matches pod ml/plain: pool tainted: does not tolerate taint nvidia.com/gpu=true:NoSchedule")


def test_a_pod_larger_than_every_type_is_unservable_with_what_it_asks_and_the_largest_type():
    outcome = run([pod("huge", gpu=16)], [pool(types=(GPU, GPU4))])
    assert outcome.unservable["ml/huge"].message == "no NodeType fits pod ml/huge: asks 16 nvidia.com/gpu, largest type has 8"
    outcome = run([pod("mem", memory=4096 * GI)], [pool(types=(CPU,))])
    assert outcome.unservable["ml/mem"].message == "no NodeType fits pod ml/mem: asks 4096Gi memory, largest type has 512Gi"


def test_the_nodes_limit_stops_launches_and_the_rest_wait_with_the_reason():
    outcome = run([pod(f"p{i}", gpu=8) for i in range(6)], [pool(limits={"nodes": 4})])
    assert len(outcome.launches) == 4
    assert sorted(outcome.waiting) == ["ml/p4", "ml/p5"]
    assert {(v.reason, v.message, v.pool) for v in outcome.waiting.values()} == {
        (DecisionReason.LIMIT, "not added: limit nodes 4 reached", "burst")}
    # Nodes the pool already has count.
    outcome = run([pod(f"p{i}", gpu=8) for i in range(3)], [pool(limits={"nodes": 4}, used={"nodes": 3})])
    assert len(outcome.launches) == 1 and len(outcome.waiting) == 2


def test_a_resource_limit_counts_the_capacity_of_each_node_type():
    limits = {"nvidia.com/gpu": 32}
    outcome = run([pod(f"p{i}", gpu=8) for i in range(5)], [pool(limits=limits, used={"nvidia.com/gpu": 16})])
    assert len(outcome.launches) == 2
    assert {v.message for v in outcome.waiting.values()} == {"not added: limit nvidia.com/gpu 32 reached"}
    # A cpu limit keeps the big type out and lets the small one in.
    outcome = run([pod("a", cpu=8)], [pool(types=(CPU, SMALL), limits={"cpu": 20})])
    assert launched(outcome) == [("burst", "cpu-small", ("ml/a",))]
    outcome = run([pod("a", cpu=10), pod("b", cpu=10)], [pool(types=(CPU, SMALL), limits={"cpu": 20})])
    assert len(outcome.launches) == 1 and outcome.waiting["ml/b"].message == "not added: limit cpu 20 reached"
    outcome = run([pod("m", memory=100 * GI)], [pool(types=(CPU,), limits={"memory": 256 * GI})])
    assert outcome.waiting["ml/m"].message == "not added: limit memory 256Gi reached"


def test_the_tenant_quota_stops_launches_across_pools():
    pools = [pool("a", types=(CPU,), weight=10), pool("b", types=(CPU,))]
    outcome = run([pod(f"p{i}", cpu=60) for i in range(3)], pools, quota_nodes_left=2)
    assert len(outcome.launches) == 2
    [verdict] = outcome.waiting.values()
    assert verdict.reason == DecisionReason.QUOTA and verdict.message == "not added: the tenant's node quota is reached"


def test_no_free_host_of_the_type_makes_the_pod_wait_or_takes_another_type():
    scarce = TypeOption("gpu-server", GPU.cost, GPU.allocatable, GPU.properties, free_hosts=1)
    outcome = run([pod("a", gpu=8), pod("b", gpu=8)], [pool(types=(scarce,))])
    assert len(outcome.launches) == 1
    assert outcome.waiting["ml/b"].reason == DecisionReason.NO_CAPACITY
    assert outcome.waiting["ml/b"].message == "not added: no free host of type gpu-server"
    cheap_none = TypeOption("cpu-small", SMALL.cost, SMALL.allocatable, SMALL.properties, free_hosts=0)
    assert launched(run([pod("a", cpu=2)], [pool(types=(cheap_none, CPU))])) == [("burst", "cpu-server", ("ml/a",))]


def test_daemonset_overhead_is_counted_on_every_node():
    outcome = run([pod("full", cpu=64)], [pool(types=(CPU,))], overhead={"cpu": 0.25})
    assert outcome.unservable["ml/full"].message == "no NodeType fits pod ml/full: asks 64 cpu, largest type has 63750m"
    outcome = run([pod("a", cpu=32), pod("b", cpu=31.75)], [pool(types=(CPU,))], overhead={"cpu": 0.25})
    assert len(outcome.launches) == 1


def test_pods_that_fit_on_existing_capacity_launch_nothing():
    node = Node(name="two-abcde", pool="burst", labels={"vcluster.com/node-type": "gpu-server"}, taints=(),
                free={"cpu": 180, "memory": 1024 * GI, "nvidia.com/gpu": 8})
    outcome = run([pod("a", gpu=4), pod("b", gpu=4), pod("c", gpu=4)], [pool()], nodes=(node,))
    assert outcome.placed == {"ml/a": "two-abcde", "ml/b": "two-abcde"}
    assert launched(outcome) == [("burst", "gpu-server", ("ml/c",))]
    # Capacity that does not match (a selector, a taint) does not count.
    tainted = Node(name="t", pool="other", labels={}, taints=({"key": "k", "effect": "NoSchedule"},), free={"cpu": 64})
    outcome = run([pod("d", cpu=1)], [pool(types=(CPU,))], nodes=(tainted,))
    assert not outcome.placed and len(outcome.launches) == 1
    # Nor does a GPU node for a pod that asks no GPU.
    outcome = run([pod("e", cpu=1)], [pool(types=(CPU,))], nodes=(node,))
    assert not outcome.placed and launched(outcome) == [("burst", "cpu-server", ("ml/e",))]


def test_a_tenant_without_dynamic_pools_gets_a_reason():
    outcome = run([pod("a", cpu=1)], [])
    assert outcome.unservable["ml/a"].message == "no pool matches pod ml/a: the tenant has no dynamic pool"


def test_one_pass_over_a_thousand_pods_of_a_hundred_tenants_with_ten_types_takes_well_under_a_second():
    types = [TypeOption(f"t{i}", 100 * (i + 1), {"cpu": 16 * (i + 1), "memory": 64 * GI * (i + 1),
                                                 **({"nvidia.com/gpu": 8} if i >= 5 else {})},
                        {"vcluster.com/node-type": f"t{i}"}, free_hosts=50) for i in range(10)]
    problems = []
    for tenant in range(100):
        pods = [pod_with(f"p{tenant}-{i}", {"cpu": 1 + i % 7, "memory": (i % 5 + 1) * GI,
                                            **({"nvidia.com/gpu": 1 + i % 8} if i % 3 == 0 else {})})
                for i in range(10)]
        problems.append(Problem(pods=tuple(pods), pools=(pool("a", types=types, weight=10, limits={"nodes": 20}),
                                                         pool("b", types=types, labels={"x": "y"}))))
    started = time.process_time()
    outcomes = [simulate(p) for p in problems]
    elapsed = time.process_time() - started
    assert sum(len(o.launches) for o in outcomes) > 100
    assert all(not o.unservable and not o.waiting for o in outcomes)
    assert elapsed < 1.0, f"{elapsed:.2f} s of CPU"


def test_ephemeral_storage_a_type_does_not_declare_is_not_counted_but_a_declared_one_is():
    asks = {"cpu": 2, "ephemeral-storage": 100 * GI}
    assert launched(run([pod_with("a", asks)], [pool(types=(CPU,))])) == [("burst", "cpu-server", ("ml/a",))]
    small_disk = TypeOption("cpu-disk", 10, {"cpu": 64, "ephemeral-storage": 50 * GI}, {})
    outcome = run([pod_with("a", asks)], [pool(types=(small_disk,))])
    assert outcome.unservable["ml/a"].message == (
        "no NodeType fits pod ml/a: asks 100Gi ephemeral-storage, largest type has 50Gi")


# --- all or nothing: pools of groups, gangs ------------------------------------------------------------------

def test_a_pool_of_groups_asks_for_whole_groups_on_the_smallest_rail_group_with_room():
    from dataclasses import replace

    gpu = replace(GPU, free_hosts=9, free_domains={"rail r1": 5, "rail r2": 3, "rail r3": 1})
    outcome = run([pod(f"p{i}", gpu=8) for i in range(4)], [pool(types=(gpu,), group_size=3)])
    assert not outcome.launches and not outcome.waiting
    assert [(g.node_type, g.domain, [len(n) for n in g.nodes]) for g in outcome.groups] == [
        ("gpu-server", "rail r2", [1, 1, 1]), ("gpu-server", "rail r1", [1, 0, 0])]  # the 2nd group's seats: empty


def test_a_gang_that_does_not_fit_takes_back_what_it_had_planned_even_on_existing_capacity():
    inflight = Node("one-abcde", "burst", {"vcluster.com/node-type": "gpu-server"}, (),
                    {"cpu": 192, "memory": 2048 * GI, "nvidia.com/gpu": 8})
    gang = [PodDemand(key=f"ml/g{i}", demand=Demand(requests={"nvidia.com/gpu": 8}), gang="ml/g") for i in range(3)]
    outcome = run([*gang, pod("alone", gpu=8)], [pool(types=(GPU,), limits={"nodes": 1})], nodes=(inflight,))
    # g0 would fit on the claim in flight and g1 on a new node, g2 nowhere: none of the gang is placed, and the
    # pod decided after it gets the claim in flight that the gang had held for a moment.
    assert outcome.placed == {"ml/alone": "one-abcde"}
    assert sorted(outcome.waiting) == ["ml/g0", "ml/g1", "ml/g2"]
    assert not outcome.launches
    assert {v.reason for v in outcome.waiting.values()} == {DecisionReason.LIMIT}
    assert outcome.waiting["ml/g0"].message == (
        "gang ml/g: its 3 pods are added together or not at all; pod ml/g2 finds no room: "
        "not added: limit nodes 1 reached")


def test_a_gang_with_a_pod_no_pool_can_serve_launches_nothing_and_its_other_pods_say_which():
    gang = [PodDemand(key="ml/g0", demand=Demand(requests={"nvidia.com/gpu": 8}), gang="ml/g"),
            PodDemand(key="ml/g1", demand=Demand(requests={"nvidia.com/gpu": 16}), gang="ml/g")]
    outcome = run(gang, [pool(types=(GPU,))])
    assert not outcome.launches and outcome.unservable["ml/g1"].reason == DecisionReason.NO_NODE_TYPE
    assert outcome.waiting["ml/g0"].message == (
        "gang ml/g: its 2 pods are added together or not at all; pod ml/g1 cannot be served: no NodeType fits pod "
        "ml/g1: asks 16 nvidia.com/gpu, largest type has 8")
