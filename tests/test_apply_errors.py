"""Bad manifests: a clear message naming file, document and line; exit code non-zero; nothing applied."""
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost
from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant

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


BMH = """\
---
apiVersion: v1
kind: Secret
metadata: {{name: new-bmc, namespace: metal3}}
data: {{username: YWRtaW4=, password: c2VjcmV0}}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: new-host
  namespace: metal3
spec:
  bmc:
    address: {address}
    credentialsName: {credentials}
  bootMACAddress: 52:54:00:aa:bb:cc
"""


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
            expect="unknown operator 'Like'", line=7, document=1)


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
                      expect="unknown scheme 'http'", line=14)
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
