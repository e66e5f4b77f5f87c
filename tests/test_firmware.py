"""A NodeType's BIOS settings and firmware minimums in manifests (apply, export, apply again: the same), refused with
the reason where they are wrong or where an ipmi:// host would need them; the firmware update action: the platform
admin's only, on an available host only (never one that serves a tenant), with a clear refusal that changes nothing;
and the host page's wanted / actual and firmware against the minimums."""
import io

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client

from events.models import Event
from hosts.models import BareMetalHost
from pools.firmware import below_minimums, component_name, version_key
from pools.models import NodeType

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD  # noqa: E402

pytestmark = pytest.mark.django_db

pytest_plugins = ["tests.console_conftest"]

FIRMWARE_TYPE = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: gpu-sriov
spec:
  providerRef: metal3
  bareMetalHosts:
    selector:
      matchLabels: {role: gpu, rack: r1}
  firmware:
    settings:
      ProcVirtualization: Enabled
      SriovGlobalEnable: Enabled
      NumaNodesPerSocket: 2
    components:
      - component: bios
        minVersion: "2.4.0"
      - component: gpu
        minVersion: 96.00.AF.00.01
"""

IPMI_HOST = """\
apiVersion: v1
kind: Secret
metadata: {name: old-01-bmc, namespace: metal3}
type: Opaque
stringData: {username: admin, password: secret}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: old-01
  namespace: metal3
  labels: {role: gpu, rack: r1}
spec:
  bmc: {address: "ipmi://10.0.5.1:623", credentialsName: old-01-bmc}
  bootMACAddress: 52:54:00:00:05:01
"""


def export() -> str:
    out = io.StringIO()
    call_command("export", stdout=out)
    return out.getvalue()


def test_a_node_types_bios_settings_and_firmware_minimums_round_trip_through_apply_and_export(apply, demo_site):
    apply(FIRMWARE_TYPE)
    node_type = NodeType.objects.get(name="gpu-sriov")
    assert node_type.firmware == {
        "settings": {"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Enabled", "NumaNodesPerSocket": 2},
        "components": [{"component": "bios", "minVersion": "2.4.0"}, {"component": "gpu", "minVersion": "96.00.AF.00.01"}]}
    first = export()
    assert "  firmware:\n    settings:\n      NumaNodesPerSocket: 2\n      ProcVirtualization: Enabled\n" in first
    assert "    - component: bios\n      minVersion: 2.4.0\n" in first
    NodeType.objects.filter(name="gpu-sriov").update(firmware={})
    assert apply(first) and NodeType.objects.get(name="gpu-sriov").firmware == node_type.firmware
    assert export() == first
    assert "nodetype/gpu-sriov unchanged" in apply(first)


@pytest.mark.parametrize("block, where, words", [
    ("  firmware:\n    components:\n      - {component: cpld, minVersion: '1'}\n",
     "spec.firmware.components.0.component", "'cpld' is not a component; expected one of bios, bmc, nic, gpu"),
    ("  firmware:\n    settings: {ProcVirtualization: true}\n",
     "spec.firmware.settings.ProcVirtualization", "must be a string or a whole number"),
    ("  firmware:\n    components:\n      - {component: bios, minVersion: 2.4}\n",
     "spec.firmware.components.0.minVersion", "must be a non-empty string"),
    ("  firmware:\n    bios: {ProcVirtualization: Enabled}\n", "spec.firmware.bios", "unknown field"),
])
def test_a_wrong_firmware_block_is_refused_at_its_place_and_nothing_changes(apply, demo_site, block, where, words):
    before = export()
    text = FIRMWARE_TYPE.split("  firmware:")[0] + block
    with pytest.raises(CommandError) as info:
        apply(text)
    assert where in str(info.value) and words in str(info.value), str(info.value)
    assert not NodeType.objects.filter(name="gpu-sriov").exists() and export() == before


def test_an_ipmi_host_that_a_node_type_with_firmware_selects_is_refused_at_apply_with_the_reason(apply, demo_site):
    apply(FIRMWARE_TYPE)
    with pytest.raises(CommandError) as info:
        apply(IPMI_HOST)
    assert "metadata.labels" in str(info.value)
    assert ("NodeType gpu-sriov selects this host and declares firmware; BIOS settings and firmware are read and "
            "changed over Redfish (Bios, UpdateService), which an ipmi:// BMC does not have") in str(info.value)
    assert not BareMetalHost.objects.filter(name="old-01").exists()


def test_a_node_type_with_firmware_that_would_select_an_ipmi_host_is_refused_at_apply(apply, demo_site):
    apply(IPMI_HOST)
    with pytest.raises(CommandError) as info:
        apply(FIRMWARE_TYPE)
    assert "spec.firmware" in str(info.value) and "this NodeType selects old-01 with an ipmi:// BMC" in str(info.value)
    assert not NodeType.objects.filter(name="gpu-sriov").exists()
    # Without firmware the same NodeType is fine: only what IPMI cannot do is refused.
    apply(FIRMWARE_TYPE.split("  firmware:")[0])
    assert NodeType.objects.get(name="gpu-sriov").firmware == {}


def test_versions_compare_by_number_and_components_are_named_as_metal3_does():
    assert version_key("2.10.0") > version_key("2.9.9") and version_key("96.00.AF.00.01") > version_key("96.00.AE.00.09")
    assert [component_name(i, n) for i, n in [("BIOS", "BIOS"), ("BMC", "BMC Firmware"), ("NIC.1", "NIC 1 Firmware"),
                                              ("GPU.0", "GPU 0 VBIOS"), ("CPLD", "CPLD")]] == \
        ["bios", "bmc", "nic:NIC.1", "gpu:GPU.0", "other:CPLD"]
    rows = below_minimums({"components": [{"component": "bios", "minVersion": "2.4"},
                                          {"component": "bmc", "minVersion": "1.0"}]},
                          [{"component": "bios", "currentVersion": "2.3.9"}])
    assert rows == [{"component": "bios", "current": "2.3.9", "minimum": "2.4", "ok": False},
                    {"component": "bmc", "current": None, "minimum": "1.0", "ok": False}]


# --- the firmware update action -------------------------------------------------------------------------

LAB_COMPONENTS = [{"component": "bios", "id": "BIOS", "name": "BIOS", "path": "/redfish/v1/UpdateService/"
                   "FirmwareInventory/BIOS", "currentVersion": "2.3.1", "initialVersion": "2.3.1", "updateable": True},
                  {"component": "bmc", "id": "BMC", "name": "BMC Firmware", "path": "/redfish/v1/UpdateService/"
                   "FirmwareInventory/BMC", "currentVersion": "1.10.2", "initialVersion": "1.10.2", "updateable": True}]
IMAGE = "http://firmware.example.invalid/bios-2.4.0.bin"


def _client(username: str, *, admin=False, group: str | None = None) -> Client:
    user = User.objects.create_user(username, f"{username}@example.invalid", PASSWORD, is_staff=admin,
                                    is_superuser=admin)
    if group:
        user.groups.add(Group.objects.get_or_create(name=group)[0])
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def hosts(demo_site):
    BareMetalHost.objects.update(firmware={"components": LAB_COMPONENTS})
    return BareMetalHost.objects


def _unchanged(name: str, state: str, events_before: int) -> None:
    host = BareMetalHost.objects.get(name=name)
    assert host.state == state and Event.objects.filter(host=host).count() == events_before


def test_a_firmware_update_is_refused_on_a_host_that_serves_a_tenant_and_nothing_changes(hosts):
    hosts.filter(name="gpu-01").update(state="provisioned")
    events = Event.objects.filter(host__name="gpu-01").count()
    admin = _client("fw-admin", admin=True)
    form = admin.get("/hosts/gpu-01/firmware-update/").content.decode()
    assert "Not possible now: gpu-01 is provisioned: firmware is updated only on an available host; release its " \
           "claim first" in form and 'name="image_url"' not in form
    answer = admin.post("/hosts/gpu-01/firmware-update/", {"component": "bios", "image_url": IMAGE})
    assert answer.status_code == 409
    assert ("gpu-01 is provisioned: it serves a tenant&#x27;s claim, and firmware is updated only on an available "
            "host; release its claim first") in answer.content.decode()
    _unchanged("gpu-01", "provisioned", events)
    # Nor on a host in repair: the transition table's own words.
    hosts.filter(name="gpu-02").update(state="repair")
    answer = admin.post("/hosts/gpu-02/firmware-update/", {"component": "bios", "image_url": IMAGE})
    assert answer.status_code == 409 and "it waits in the repair pool" in answer.content.decode()


@pytest.mark.parametrize("component, image_url, words", [
    ("bios", "ftp://firmware.example.invalid/bios.bin", "the image URL must be an http:// or https:// URL"),
    ("bios", "http://firmware.example.invalid/bios 2.bin", "without spaces"),
    ("bios", "", "the image URL must be"),
    ("cpld; rm -rf /", IMAGE, "is not one the console updates"),
    ("nic:NIC.9", IMAGE, "gpu-01&#x27;s firmware inventory has no component nic:NIC.9 (it lists bios, bmc)"),
])
def test_a_bad_firmware_update_request_gets_a_clear_error_and_changes_nothing(hosts, component, image_url, words):
    events = Event.objects.filter(host__name="gpu-01").count()
    answer = _client("fw-admin", admin=True).post("/hosts/gpu-01/firmware-update/",
                                                  {"component": component, "image_url": image_url})
    assert answer.status_code == 400 and words in answer.content.decode(), answer.content.decode()[-3000:]
    _unchanged("gpu-01", "available", events)


def test_an_ipmi_host_is_refused_a_firmware_update_with_the_reason(hosts):
    hosts.filter(name="gpu-01").update(bmc_address="ipmi://10.0.5.1:623")
    answer = _client("fw-admin", admin=True).post("/hosts/gpu-01/firmware-update/",
                                                  {"component": "bios", "image_url": IMAGE})
    assert answer.status_code == 400 and "gpu-01 has an ipmi:// BMC, which cannot update firmware" in \
        answer.content.decode()
    assert BareMetalHost.objects.get(name="gpu-01").state == "available"


@pytest.mark.parametrize("who", ["operator", "auditor", "member"])
def test_only_the_platform_admin_may_update_firmware(hosts, who):
    client = _client(f"fw-{who}", group={"operator": "operators", "auditor": "auditors"}.get(who))
    events = Event.objects.filter(host__name="gpu-01").count()
    assert client.get("/hosts/gpu-01/firmware-update/").status_code == 403
    assert client.post("/hosts/gpu-01/firmware-update/", {"component": "bios", "image_url": IMAGE}).status_code == 403
    _unchanged("gpu-01", "available", events)


def test_an_admins_request_moves_an_available_host_to_servicing_with_the_request_recorded(hosts):
    answer = _client("fw-admin", admin=True).post("/hosts/gpu-01/firmware-update/",
                                                  {"component": "bios", "image_url": IMAGE})
    assert answer.status_code == 302 and answer["Location"] == "/hosts/gpu-01/"
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.state == "servicing" and host.deadline_at is not None
    moved = Event.objects.filter(host=host, kind="transition").latest("id")
    assert (moved.from_state, moved.to_state, moved.message) == ("available", "servicing",
                                                                 f"firmware update of bios from {IMAGE}")
    assert moved.data["firmware_update"] == {"component": "bios", "image_url": IMAGE, "asked_by": moved.actor}


def test_the_host_page_shows_wanted_and_actual_settings_and_firmware_against_the_minimums(apply, hosts):
    apply(FIRMWARE_TYPE)
    hosts.filter(name="gpu-01").update(firmware={
        "settings": {"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Disabled", "NumaNodesPerSocket": "2"},
        "pending": {"SriovGlobalEnable": "Enabled"}, "settings_read_at": "2026-12-05T10:00:00+00:00",
        "components": LAB_COMPONENTS, "components_read_at": "2026-12-05T10:00:00+00:00"})
    page = _client("fw-admin", admin=True).get("/hosts/gpu-01/").content.decode()
    assert "BIOS settings wanted by gpu-sriov" in page
    assert '<tr class="field-error"><td>SriovGlobalEnable</td><td>Enabled</td><td>Disabled</td><td>Enabled</td></tr>' \
        in page
    assert '<tr class="ok"><td>NumaNodesPerSocket</td><td>2</td><td>2</td><td></td></tr>' in page
    assert "<td>2.3.1</td><td>2.4.0 below</td>" in page
    assert "<td>gpu</td><td>not listed</td><td>96.00.AF.00.01 below</td>" in page  # a minimum no component answers
    assert 'id="firmware-update-link"' in page
    # Whoever may see the page sees the facts; only the admin gets the action.
    assert 'id="firmware-update-link"' not in _client("fw-op", group="operators").get("/hosts/gpu-01/").content.decode()


def test_the_api_shows_a_hosts_firmware_and_checks_a_node_types_firmware_as_apply_does(hosts):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(User.objects.create_user("fw-api", "fw-api@example.invalid", PASSWORD, is_staff=True,
                                                is_superuser=True))
    host = client.get(f"/api/v1/hosts/{BareMetalHost.objects.get(name='gpu-01').pk}/").json()
    assert host["firmware"]["components"][0]["currentVersion"] == "2.3.1"
    node_type = NodeType.objects.get(name="gpu-server")
    url = f"/api/v1/nodetypes/{node_type.pk}/"
    bad = client.patch(url, {"firmware": {"components": [{"component": "bios", "minVersion": 2}]}}, format="json")
    assert bad.status_code == 400 and "components.0.minVersion: must be a non-empty string" in str(bad.json())
    assert NodeType.objects.get(pk=node_type.pk).firmware == {}
    good = client.patch(url, {"firmware": {"settings": {"ProcVirtualization": "Enabled"}}}, format="json")
    assert good.status_code == 200 and good.json()["firmware"] == {"settings": {"ProcVirtualization": "Enabled"}}


def test_a_firmware_update_wants_a_recent_sign_in(hosts, settings):
    admin = _client("fw-admin", admin=True)
    settings.FRESH_SIGN_IN_S = -1  # every sign-in is too old now
    form = admin.get("/hosts/gpu-01/firmware-update/").content.decode()
    assert 'id="fresh-refusal"' in form and 'name="image_url"' not in form
    answer = admin.post("/hosts/gpu-01/firmware-update/", {"component": "bios", "image_url": IMAGE})
    assert answer.status_code == 403 and "this action needs a sign-in of the last" in answer.content.decode()
    assert BareMetalHost.objects.get(name="gpu-01").state == "available"
