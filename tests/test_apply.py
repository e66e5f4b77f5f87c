"""`manage.py apply`: the seed as written, the current list form, idempotence, atomicity, dry runs."""
import pytest
from django.core.management import call_command

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodePool, NodeType, OSImage, Tenant

from .factories import BMH, GATED_PROVIDER, GATED_TYPE, LIST_FORM, gate

pytestmark = pytest.mark.django_db


def test_the_seed_block_applied_for_tenant_one_makes_its_two_static_pools(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    one = Tenant.objects.get(name="one")
    assert one.namespace == "p-default"
    gpu, cpu = NodePool.objects.get(tenant=one, name="gpu"), NodePool.objects.get(tenant=one, name="cpu")
    assert (gpu.kind, gpu.quantity, gpu.node_labels) == ("static", 1, {"workload": "gpu"})
    assert gpu.node_type_selector == [{"property": "vcluster.com/node-type", "value": "gpu-server"}]
    assert (cpu.quantity, cpu.node_labels) == (1, {"workload": "cpu"})
    assert gpu.properties == {"vcluster.com/os-image": "ubuntu2404-20260926"}
    assert cpu.properties == {"vcluster.com/os-image": "ubuntu2404-20260926"}


def test_after_a_reconcile_the_seed_has_two_pending_claims_without_hosts(apply, seed_block):
    apply(open("demo/site.yaml").read())
    apply(seed_block, tenant="one")
    call_command("reconcile")
    claims = NodeClaim.objects.filter(tenant__name="one")
    assert sorted(c.pool_name for c in claims) == ["cpu", "gpu"]
    assert {c.phase for c in claims} == {ClaimPhase.PENDING}
    gpu = claims.get(pool_name="gpu")
    assert gpu.message == "no free host of type gpu-server: 0 of 0 available"
    assert gpu.name.startswith("one-") and len(gpu.name) == len("one-vc4vs")


def test_with_matching_available_hosts_each_claim_gets_a_host_of_its_type(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    call_command("reconcile")
    for claim in NodeClaim.objects.select_related("host", "node_type"):
        assert claim.phase == ClaimPhase.PROVISIONING
        assert claim.node_type.name == f"{claim.pool_name}-server"
        assert claim.host.labels["role"] == claim.pool_name
        assert claim.host.state == "provisioning"
        assert claim.properties["vcluster.com/os-image"] == "ubuntu2404-20260926"


def test_quantity_one_to_two_makes_exactly_one_more_claim_and_zero_releases_them(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    call_command("reconcile")
    apply(seed_block.replace("quantity: 1\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                             "              value: gpu-server",
                             "quantity: 2\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                             "              value: gpu-server"), tenant="one")
    call_command("reconcile")
    assert NodeClaim.objects.filter(pool_name="gpu").count() == 2
    assert NodeClaim.objects.filter(pool_name="cpu").count() == 1
    apply(seed_block.replace("quantity: 1", "quantity: 0"), tenant="one")
    call_command("reconcile")
    live = NodeClaim.objects.exclude(phase__in=[ClaimPhase.RELEASING, ClaimPhase.RELEASED])
    assert live.count() == 0
    # Claims that held hosts release them for cleaning; the hosts are no longer the tenant's.
    assert set(BareMetalHost.objects.filter(labels__role="gpu").values_list("state", flat=True)) >= {"deprovisioning"}


def test_shrinking_releases_unprovisioned_claims_first(apply, seed_block):
    apply(open("demo/site.yaml").read())
    apply(seed_block, tenant="one")
    call_command("reconcile")
    # one gpu host appears and the gpu claim takes it; then the pool grows by one claim that stays pending
    apply(open("demo/hosts.yaml").read().split("---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: gpu-02-bmc")[0])
    call_command("reconcile")
    held = NodeClaim.objects.get(pool_name="gpu")
    assert held.host_id is not None
    apply(seed_block.replace("quantity: 1\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                             "              value: gpu-server",
                             "quantity: 2\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
                             "              value: gpu-server"), tenant="one")
    call_command("reconcile")
    pending = NodeClaim.objects.get(pool_name="gpu", host__isnull=True, phase=ClaimPhase.PENDING)
    apply(seed_block, tenant="one")
    call_command("reconcile")
    pending.refresh_from_db()
    held.refresh_from_db()
    assert pending.phase == ClaimPhase.RELEASED
    assert held.phase == ClaimPhase.PROVISIONING


def test_applying_the_same_manifests_again_changes_nothing_and_writes_no_event(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    call_command("reconcile")
    before = Event.objects.count()
    lines = apply(open("demo/site.yaml").read(), open("demo/hosts.yaml").read())
    lines += apply(seed_block, tenant="one")
    call_command("reconcile")
    assert all(line.endswith("unchanged") or "not referenced" in line for line in lines), lines
    assert Event.objects.count() == before


def test_a_dry_run_shows_the_change_and_changes_nothing(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    lines = apply(seed_block.replace("quantity: 1", "quantity: 3"), tenant="one", dry_run=True)
    assert "nodepool/one/gpu configured (quantity: 1 → 3) (dry run)" in lines
    assert set(NodePool.objects.values_list("quantity", flat=True)) == {1}


def test_the_current_list_form_with_operators_taints_limits_and_disruption(apply, demo_site):
    apply(LIST_FORM, tenant="two")
    static = NodePool.objects.get(tenant__name="two", name="gpu-rack1")
    assert static.taints == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert static.node_type_selector[1] == {"property": "topology.kubernetes.io/zone", "operator": "DoesNotExist"}
    assert static.termination_grace_period == "30s"
    burst = NodePool.objects.get(tenant__name="two", name="burst")
    assert (burst.kind, burst.quantity, burst.weight, burst.expire_after) == ("dynamic", None, 10, "720h")
    assert burst.limits == {"nodes": "4", "nvidia.com/gpu": "32"}
    assert burst.disruption["consolidationPolicy"] == "WhenEmpty"
    call_command("reconcile")
    assert NodeClaim.objects.filter(pool_name="gpu-rack1", node_type__name="gpu-server").count() == 2
    assert not NodeClaim.objects.filter(pool_name="burst").exists()  # dynamic pools claim on demand


def test_a_virtual_cluster_instance_carries_the_vcluster_yaml_in_its_helm_values(apply, demo_site):
    apply("""\
apiVersion: management.loft.sh/v1
kind: VirtualClusterInstance
metadata:
  name: three
  namespace: p-ml
  annotations:
    vmetal.dev/quota-nodes: "3"
    vmetal.dev/api-endpoint: 10.0.0.200:443
spec:
  displayName: ML team
  template:
    helmRelease:
      values: |
        controlPlane:
          distro:
            k8s:
              enabled: true
        privateNodes:
          enabled: true
          autoNodes:
            - provider: metal3
              static:
                - name: cpu
                  quantity: 2
                  nodeTypeSelector:
                    - property: vcluster.com/node-type
                      value: cpu-server
""")
    three = Tenant.objects.get(name="three")
    assert (three.namespace, three.quota_nodes, three.api_endpoint, three.display_name) == \
        ("p-ml", 3, "10.0.0.200:443", "ML team")
    assert three.pools.get().quantity == 2


def test_pools_no_longer_declared_are_deleted_and_their_claims_released(apply, demo_site, seed_block):
    apply(seed_block, tenant="one")
    call_command("reconcile")
    only_gpu = seed_block.split("        - name: cpu")[0] + "      properties:\n        vcluster.com/os-image: ubuntu2404-20260926\n"
    lines = apply(only_gpu, tenant="one")
    assert "nodepool/one/cpu deleted" in lines
    assert list(NodePool.objects.values_list("name", flat=True)) == ["gpu"]
    assert NodeClaim.objects.get(pool_name="cpu").phase == ClaimPhase.RELEASING


def test_quota_beyond_the_tenants_limit_is_refused_and_nothing_changes(apply, demo_site, seed_block):
    apply("""\
apiVersion: management.loft.sh/v1
kind: VirtualClusterInstance
metadata:
  name: one
  namespace: p-default
  annotations:
    vmetal.dev/quota-nodes: "2"
spec: {}
""")
    apply(seed_block, tenant="one")
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="tenant one may have at most 2 node"):
        apply(seed_block.replace("quantity: 1", "quantity: 2", 1), tenant="one")
    assert sorted(NodePool.objects.values_list("quantity", flat=True)) == [1, 1]


def test_node_types_standalone_and_capacity_derived_from_hosts(apply, demo_site):
    apply("""\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: gpu-rack1
spec:
  providerRef: metal3
  cost: 5
  properties:
    vcluster.com/node-type: gpu-server
  bareMetalHosts:
    selector:
      matchLabels: {role: gpu, rack: r1}
""")
    from claims.selectors import fleet_status

    capacity = {t["name"]: t["capacity"] for t in fleet_status()["node_types"]}
    assert capacity["gpu-server"] == {"total": 4, "available": 4, "held_back": 0, "provisioned": 0,
                                      "preparing": 0, "repair": 0, "error": 0, "maintenance": 0, "held": 0, "retired": 0}
    assert capacity["gpu-rack1"] == {"total": 2, "available": 2, "held_back": 0, "provisioned": 0,
                                     "preparing": 0, "repair": 0, "error": 0, "maintenance": 0, "held": 0, "retired": 0}
    assert NodeType.objects.get(name="gpu-rack1").declared_in_provider is False


def test_an_image_checksum_type_is_detected_from_its_length(apply):
    apply(open("demo/site.yaml").read().split("---")[0])
    apply("""\
apiVersion: management.loft.sh/v1
kind: OSImage
metadata:
  name: tiny
spec:
  properties:
    metal3.vcluster.com/image-url: http://127.0.0.1/tiny.img
    metal3.vcluster.com/image-checksum: d41d8cd98f00b204e9800998ecf8427e
""")
    assert OSImage.objects.get(name="tiny").checksum_type == "md5"


def test_an_image_without_a_checksum_type_applied_twice_changes_nothing_the_second_time(apply):
    apply(open("demo/site.yaml").read().split("---")[0])
    image = """\
apiVersion: management.loft.sh/v1
kind: OSImage
metadata: {name: tiny}
spec:
  properties:
    metal3.vcluster.com/image-url: http://127.0.0.1/tiny.img
    metal3.vcluster.com/image-checksum: d41d8cd98f00b204e9800998ecf8427e
"""
    apply(image)
    assert apply(image) == ["osimage/tiny unchanged"]


# --- the release gate: a NodeType's spec.cleaning and spec.healthCheck, a host's own cleaning method ----------

def test_a_node_types_cleaning_and_health_check_come_from_its_manifest(apply, demo_site):
    apply(GATED_TYPE, GATED_PROVIDER)
    assert gate("gpu-secure") == ("secure", "full", 8, 0.05, True, 3, 400.0)
    assert gate("rack2-gpu") == ("metadata", "", 4, 0.01, False, 0, 350.5)  # declared in its provider
    # Left out: the model's defaults, as for any field the manifest does not give.
    assert gate("gpu-server") == ("full", "", 4, 0.01, False, 2, None)


def test_the_release_gate_applied_twice_changes_nothing_and_a_change_is_shown(apply, demo_site):
    apply(GATED_TYPE, GATED_PROVIDER)
    events = Event.objects.count()
    assert all(line.endswith("unchanged") for line in apply(GATED_TYPE, GATED_PROVIDER))
    assert Event.objects.count() == events
    lines = apply(GATED_TYPE.replace("ncclMinBusbwGBps: 400", "ncclMinBusbwGBps: 380").replace("dcgmLevel: 3", ""))
    assert "nodetype/gpu-secure configured (health_dcgm_level: 3 → 2, health_nccl_min_busbw_gbps: 400.0 → 380)" \
        in lines, lines
    assert gate("gpu-secure")[5:] == (2, 380.0)


def test_a_host_overrides_its_node_types_cleaning_method_with_an_annotation(apply, demo_site):
    hosts = open("demo/hosts.yaml").read()
    override = hosts.replace("  labels:\n    role: gpu\n    rack: r1\n  annotations:\n",
                             "  labels:\n    role: gpu\n    rack: r1\n  annotations:\n"
                             "    vmetal.dev/cleaning-policy: secure\n", 1)
    assert override != hosts
    assert "baremetalhost/gpu-01 configured (cleaning_policy:  → secure)" in apply(override)
    assert BareMetalHost.objects.get(name="gpu-01").cleaning_policy == "secure"
    assert BareMetalHost.objects.filter(cleaning_policy="").count() == 7
    assert "baremetalhost/gpu-01 unchanged" in apply(override)
    apply(hosts)  # without the annotation: the NodeType's method again
    assert BareMetalHost.objects.get(name="gpu-01").cleaning_policy == ""


NODE_TYPES_BY_GPUS = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata: {{name: {name}}}
spec:
  providerRef: metal3
  cost: {cost}
  properties: {properties}
  bareMetalHosts:
    selector:
      matchLabels: {{role: gpu}}
"""


@pytest.mark.parametrize("requirement, chosen", [
    ({"property": "gpus", "operator": "Gt", "values": ["4"]}, "gpu-eight"),
    ({"property": "gpus", "operator": "Lt", "values": ["8"]}, "gpu-four"),
    ({"property": "infiniband", "operator": "Exists"}, "gpu-eight"),
    ({"property": "infiniband", "operator": "DoesNotExist"}, "gpu-four"),
])
def test_exists_gt_and_lt_choose_the_node_type_by_its_properties(apply, demo_site, requirement, chosen):
    import json

    apply(NODE_TYPES_BY_GPUS.format(name="gpu-four", cost=1, properties='{gpus: "4"}'),
          NODE_TYPES_BY_GPUS.format(name="gpu-eight", cost=2, properties='{gpus: "8", infiniband: "ndr"}'))
    apply("privateNodes:\n  autoNodes:\n    - provider: metal3\n"
          "      properties: {vcluster.com/os-image: ubuntu2404-20260926}\n      static:\n        - name: p\n"
          f"          quantity: 1\n          nodeTypeSelector: [{json.dumps(requirement)}]\n", tenant="one")
    call_command("reconcile")
    assert NodeClaim.objects.get(pool_name="p").node_type.name == chosen


@pytest.mark.parametrize("address, scheme", [
    ("redfish://10.1.1.9/redfish/v1/Systems/1", "redfish"),
    ("redfish+http://10.1.1.9:8000/redfish/v1/Systems/1", "redfish+http"),
    ("redfish-virtualmedia://10.1.1.9/redfish/v1/Systems/1", "redfish-virtualmedia"),
    ("redfish-virtualmedia+http://10.1.1.9/redfish/v1/Systems/1", "redfish-virtualmedia+http"),
])
def test_every_redfish_scheme_metal3_writes_is_accepted(apply, address, scheme):
    from hosts.bmc.client import parse_address
    apply(BMH.format(address=address, credentials="new-bmc"))
    host = BareMetalHost.objects.get(name="new-host")
    assert host.bmc_address == address and parse_address(host.bmc_address)[0] == scheme
    assert host.bmc_password == "secret"
