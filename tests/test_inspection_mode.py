"""inspectionMode: a host's or a NodeType's (Metal3's field; fast is out-of-band inspection over Redfish), through
apply and export, refused where it cannot hold (an IPMI host, `disabled`), and which one a host gets; the BMC's
drive census against the agent's inventory as a SKU deviation."""
import io

import pytest
from django.core.management import CommandError, call_command

from hosts.models import BareMetalHost
from hosts.selectors import BMC_DRIVES, host_inspection_mode, host_sku_deviations
from pools.models import NodeType

from .factories import bmh

pytestmark = pytest.mark.django_db

MiB = 1024 * 1024
FAST_TYPE = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: gpu-oob
spec:
  providerRef: metal3
  inspectionMode: fast
  bareMetalHosts:
    selector:
      matchLabels: {role: gpu}
"""


def export() -> str:
    out = io.StringIO()
    call_command("export", stdout=out)
    return out.getvalue()


def with_mode(manifest: str, mode: str) -> str:
    return manifest.replace("  bootMACAddress:", f"  inspectionMode: {mode}\n  bootMACAddress:")


def test_a_host_s_and_a_node_type_s_inspection_mode_apply_export_and_decide_the_host_s(apply, demo_site):
    apply(FAST_TYPE, bmh("gpu-31", "52:54:00:00:31:01"), with_mode(bmh("gpu-32", "52:54:00:00:32:01"), "agent"))
    assert NodeType.objects.get(name="gpu-oob").inspection_mode == "fast"
    one, two = BareMetalHost.objects.get(name="gpu-31"), BareMetalHost.objects.get(name="gpu-32")
    assert (one.inspection_mode, two.inspection_mode) == ("", "agent")
    # gpu-server (the demo's) selects role=gpu too and says nothing: gpu-oob's fast holds.
    assert host_inspection_mode(one) == ("fast", "NodeType gpu-oob")
    assert host_inspection_mode(two) == ("agent", "the host")
    text = export()
    assert "  name: gpu-oob\nspec:\n  providerRef: metal3\n" in text and "  inspectionMode: fast\n" in text
    assert "  automatedCleaningMode: metadata\n  inspectionMode: agent\n" in text
    NodeType.objects.create(name="gpu-thorough", provider=NodeType.objects.get(name="gpu-oob").provider,
                            inspection_mode="agent", host_selector={"matchLabels": {"role": "gpu"}})
    assert host_inspection_mode(one) == ("agent", "the default: its NodeTypes disagree (gpu-oob, gpu-thorough)")


@pytest.mark.parametrize("address, mode, message", [
    ("ipmi://10.1.1.33", "fast", "fast inspection reads the inventory from a Redfish BMC; an ipmi:// BMC lists "
                                 "none: use agent, or a Redfish address"),
    ("redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-33", "disabled",
     "inspection cannot be disabled here: the SKU check and the release gate's census need an inventory"),
    ("redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-33", "quick", "'quick' is not one of agent, fast"),
])
def test_an_inspection_mode_that_cannot_hold_is_refused_at_apply_and_nothing_changes(apply, address, mode, message):
    manifest = with_mode(bmh("gpu-33", "52:54:00:00:33:01"), mode).replace(
        "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-33", address)
    with pytest.raises(CommandError) as refused:
        apply(manifest)
    assert "spec.inspectionMode" in str(refused.value) and message in str(refused.value), str(refused.value)
    assert not BareMetalHost.objects.filter(name="gpu-33").exists()


def _host(**fields) -> BareMetalHost:
    disks = [{"name": "nvme0n1", "serial": "S1", "model": "M", "size_bytes": 96 * MiB, "type": "nvme"},
             {"name": "nvme1n1", "serial": "S2", "model": "M", "size_bytes": 96 * MiB, "type": "nvme"}]
    return BareMetalHost.objects.create(
        name="gpu-34", bmc_address="redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-34",
        boot_mac="52:54:00:00:34:01", inventory={"disks": disks[:1] if fields.pop("omit", False) else disks},
        bmc_inventory={"source": "bmc", "disks": [{**d, "name": f"Disk.Bay.{i}"} for i, d in enumerate(disks)]},
        **fields)


def test_a_drive_the_bmc_lists_that_the_agent_does_not_name_is_a_deviation_and_an_extra_agent_disk_is_not():
    assert host_sku_deviations(_host()) == {}
    BareMetalHost.objects.all().delete()
    assert host_sku_deviations(_host(omit=True))[BMC_DRIVES] == [
        "drive S2 (96 MiB) the BMC lists is not in the agent's inventory"]


def test_a_bmc_that_lists_no_drives_or_an_inventory_from_the_bmc_itself_has_nothing_to_disagree_with():
    host = _host(omit=True)
    host.bmc_inventory = {"none": "an IPMI BMC lists no inventory"}
    assert BMC_DRIVES not in host_sku_deviations(host)
    host.bmc_inventory = {"source": "bmc", "disks": None}
    assert BMC_DRIVES not in host_sku_deviations(host)
