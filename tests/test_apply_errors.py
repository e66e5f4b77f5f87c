"""Bad manifests: a clear message naming file, document and line; exit code non-zero; nothing applied."""
import subprocess
import sys

import pytest
from django.core.management.base import CommandError

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant

from .factories import BMH

pytestmark = pytest.mark.django_db

MODELS = [NodeProvider, NodeType, NodeEnvironment, OSImage, Tenant, NodePool, BareMetalHost, NodeClaim, Event]


def snapshot():
    return {m.__name__: sorted(map(str, m.objects.values_list("pk", flat=True))) for m in MODELS} | \
        {"quantities": sorted(NodePool.objects.values_list("name", "quantity"))}


@pytest.fixture
def refused(apply, demo_site, seed_block):
    """Apply a good document plus the bad one; assert the error and that nothing at all changed."""
    apply(seed_block, tenant="one")

    def check(bad: str, *, expect: str, line: int, document: int = 2, tenant: str | None = "one"):
        before = snapshot()
        # The good document comes first and would change something if it were applied.
        good = seed_block.replace("quantity: 1", "quantity: 2") if tenant else \
            "apiVersion: management.loft.sh/v1\nkind: NodeProvider\nmetadata: {name: other}\nspec: {metal3: {}}\n"
        with pytest.raises(CommandError) as info:
            apply(good, bad, tenant=tenant, names=["good.yaml", "bad.yaml"])
        message = str(info.value)
        assert "/bad.yaml: document " in message, message
        assert f"(line {line})" in message, message
        assert f"document {document}" in message, message
        assert expect in message, message
        assert snapshot() == before
        return message

    return check


def test_not_yaml(refused):
    refused("privateNodes:\n  autoNodes: [\n", expect="not valid YAML", line=3, document=1)


def test_unknown_kind(refused):
    refused("---\napiVersion: management.loft.sh/v1\nkind: NodeFlavour\nmetadata: {name: x}\n",
            expect="unknown kind 'NodeFlavour'", line=3, document=1)


def test_unknown_api_version(refused):
    refused("---\napiVersion: metal3.io/v1beta9\nkind: BareMetalHost\nmetadata: {name: x}\n",
            expect="unknown kind 'BareMetalHost' of apiVersion 'metal3.io/v1beta9'", line=3, document=1)


def test_missing_required_field(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: big\n"
            "          nodeTypeSelector: []\n",
            expect="privateNodes.autoNodes[0].static[0].quantity: required field is missing", line=5, document=1)


def test_unknown_selector_operator(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: big\n"
            "          quantity: 1\n          nodeTypeSelector:\n            - property: vcluster.com/node-type\n"
            "              operator: Like\n              values: [gpu-server]\n",
            expect="nodeTypeSelector[0].operator: unknown operator 'Like'", line=9, document=1)  # the operator's line


def test_duplicate_pool_name(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
            "          quantity: 1\n        - name: gpu\n          quantity: 2\n",
            expect="pool name 'gpu' is used twice", line=7, document=1)


def test_negative_quantity(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
            "          quantity: -1\n",
            expect="quantity: must be 0 or more, not -1", line=6, document=1)


def test_two_entries_for_one_provider(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n    - provider: metal3\n",
            expect="provider 'metal3' has two autoNodes entries", line=4, document=1)


def test_bmc_address_with_an_unknown_scheme(refused):
    message = refused(BMH.format(address="http://10.1.1.1/redfish/v1/Systems/1", credentials="new-bmc"),
                      expect="BMC address scheme http:// is not supported", line=14)
    assert "spec.bmc.address" in message


def test_credentials_name_with_no_secret(refused):
    refused(BMH.format(address="redfish://10.1.1.1/redfish/v1/Systems/1", credentials="missing-bmc"),
            expect="Secret metal3/missing-bmc not found", line=15)


def test_an_image_without_a_checksum(refused):
    refused("---\napiVersion: management.loft.sh/v1\nkind: OSImage\nmetadata: {name: x}\nspec:\n  properties:\n"
            "    metal3.vcluster.com/image-url: http://127.0.0.1/x.img\n",
            expect="image-checksum is required", line=6, document=1)


def test_a_bad_mac_address(refused):
    refused(BMH.format(address="redfish://10.1.1.1/redfish/v1/Systems/1", credentials="new-bmc")
            .replace("52:54:00:aa:bb:cc", "52:54:00:zz"), expect="is not a MAC address", line=16)


def test_an_unknown_field_is_a_typo_not_ignored(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
            "          quantitiy: 1\n", expect="quantitiy: unknown field", line=6, document=1)


def test_a_vcluster_yaml_needs_a_tenant(refused):
    refused("privateNodes:\n  enabled: true\n", expect="give --tenant NAME", line=1, document=1, tenant=None)


def test_an_unknown_provider(refused):
    refused("privateNodes:\n  autoNodes:\n    - provider: kubevirt\n",
            expect="NodeProvider 'kubevirt' not found", line=3, document=1)


@pytest.mark.django_db(transaction=True)
def test_the_command_exits_non_zero_and_says_why(tmp_path, demo_site, subprocess_env):
    bad = tmp_path / "pools.yaml"
    bad.write_text("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
                   "          quantity: -3\n")
    proc = subprocess.run([sys.executable, "manage.py", "apply", "-f", str(bad), "--tenant", "one"],
                          capture_output=True, text=True, env=subprocess_env)
    assert proc.returncode != 0
    assert f"{bad}: document 1 (line 6): privateNodes.autoNodes[0].static[0].quantity: must be 0 or more" \
        in proc.stderr


# --- the release gate: spec.cleaning, spec.healthCheck, a host's cleaning-policy annotation ---------------------

GATED = """\
---
apiVersion: management.loft.sh/v1
kind: NodeType
metadata: {{name: gpu-secure}}
spec:
  providerRef: metal3
  cleaning:
    policy: {policy}
    fallback: {fallback}
    eraseConcurrency: {concurrency}
    eraseVerifyShare: {share}
  healthCheck:
    dcgmLevel: {dcgm}
    ncclMinBusbwGBps: {busbw}
"""
GOOD_GATE = {"policy": "secure", "fallback": "full", "concurrency": 4, "share": 0.01, "dcgm": 2, "busbw": 400}


@pytest.mark.parametrize("bad, expect, line", [
    ({"policy": "fast"}, "spec.cleaning.policy: 'fast' is not one of metadata, full, secure", 8),
    ({"fallback": "secure"}, "spec.cleaning.fallback: a fallback must differ from the method", 9),
    ({"concurrency": 0}, "spec.cleaning.eraseConcurrency: at least 1 disk at a time", 10),
    ({"concurrency": 2.5}, "spec.cleaning.eraseConcurrency: must be an integer, not a number", 10),
    ({"share": 5}, "spec.cleaning.eraseVerifyShare: between 0 (excluded) and 1", 11),
    ({"share": 0}, "spec.cleaning.eraseVerifyShare: between 0 (excluded) and 1", 11),
    ({"share": ".nan"}, "spec.cleaning.eraseVerifyShare: must be a finite number", 11),
    ({"share": "'1%'"}, "spec.cleaning.eraseVerifyShare: must be a number, not a string", 11),
    ({"dcgm": 7}, "spec.healthCheck.dcgmLevel: dcgmi diag levels are 1 to 4", 13),
    ({"dcgm": -1}, "spec.healthCheck.dcgmLevel: Ensure this value is greater than or equal to 0", 13),
    ({"busbw": -400}, "spec.healthCheck.ncclMinBusbwGBps: a bus bandwidth in GB/s above 0", 14),
    ({"busbw": ".inf"}, "spec.healthCheck.ncclMinBusbwGBps: must be a finite number", 14),
    ({"busbw": "true"}, "spec.healthCheck.ncclMinBusbwGBps: must be a number, not a boolean", 14),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_a_bad_cleaning_or_health_value_is_refused_at_its_line(refused, bad, expect, line):
    refused(GATED.format(**{**GOOD_GATE, **bad}), expect=expect, line=line, document=1)
    assert not NodeType.objects.filter(name="gpu-secure").exists()


def test_an_unknown_cleaning_field_is_a_typo_not_ignored(refused):
    refused(GATED.format(**GOOD_GATE).replace("eraseVerifyShare", "verifySamplePercent"),
            expect="spec.cleaning.verifySamplePercent: unknown field; expected one of disks, eraseConcurrency, "
                   "eraseVerifyFull, eraseVerifyShare, fallback, policy", line=11, document=1)


def test_a_bad_cleaning_method_in_a_providers_node_type_list(refused):
    refused("apiVersion: management.loft.sh/v1\nkind: NodeProvider\nmetadata: {name: rack2}\nspec:\n  metal3:\n"
            "    nodeTypes:\n      - name: rack2-gpu\n        cleaning:\n          policy: wipe\n",
            expect="spec.metal3.nodeTypes[0].cleaning.policy: 'wipe' is not one of", line=9, document=1)


def test_a_bad_cleaning_policy_annotation_on_a_host(refused):
    bmh = BMH.format(address="redfish://10.1.1.1/redfish/v1/Systems/1", credentials="new-bmc").replace(
        "  namespace: metal3\nspec:", "  namespace: metal3\n  annotations:\n    vmetal.dev/cleaning-policy: shred\nspec:")
    refused(bmh, expect="metadata.annotations.vmetal.dev/cleaning-policy: 'shred' is not one of metadata, full, "
                        "secure", line=13)


def test_a_value_of_the_wrong_shape_is_an_error_at_its_line_not_a_crash(refused):
    """NodePool.clean() checks shapes before meaning: `effect: [x]` is not a TypeError (a traceback)."""
    refused("privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: gpu\n"
            "          quantity: 1\n          taints:\n            - {key: a, effect: [NoSchedule]}\n",
            expect="privateNodes.autoNodes[0].static[0].taints: [0]: key, value and effect are strings", line=7,
            document=1)
    refused("apiVersion: management.loft.sh/v1\nkind: NodeType\nmetadata: {name: odd}\nspec:\n  providerRef: metal3\n"
            "  bareMetalHosts:\n    selector:\n      matchExpressions:\n        - {key: a, operator: In, values: 5}\n",
            expect="spec.bareMetalHosts.selector: matchExpressions[0].values: must be a list of strings", line=7,
            document=1)


def test_an_error_inside_a_virtual_cluster_instances_values_block_names_its_own_line(refused):
    message = refused("""\
apiVersion: management.loft.sh/v1
kind: VirtualClusterInstance
metadata:
  name: one
spec:
  template:
    helmRelease:
      values: |
        privateNodes:
          autoNodes:
            - provider: metal3
              static:
                - name: gpu
                  quantity: -2
""", expect="quantity: must be 0 or more, not -2", line=14, document=1)
    assert "spec.template.helmRelease.values.privateNodes.autoNodes" in message
