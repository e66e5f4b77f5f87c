"""Messages that need no searching (issue 16.6): a duplicate boot MAC names the host that has it, in apply, the
API and the admin; an unknown selector operator is reported at the operator's own line; `apply` prints each
Secret as kubectl does (created, configured, unchanged), never its data."""
import pytest
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from hosts.models import BareMetalHost
from tests.factories import bmh

pytestmark = pytest.mark.django_db

TAKEN = "boot MAC 52:54:00:00:00:01 is already the boot MAC of host gpu-01"


def test_a_duplicate_boot_mac_in_apply_names_the_host_that_has_it_at_the_mac_line(demo_site, apply):
    hosts = BareMetalHost.objects.count()
    manifest = bmh("gpu-41", "52:54:00:00:00:01")
    with pytest.raises(CommandError) as info:
        apply(manifest)
    message = str(info.value)
    assert f"spec.bootMACAddress: {TAKEN}" in message, message
    mac_line = next(i for i, line in enumerate(manifest.splitlines(), 1) if "bootMACAddress:" in line)
    assert f"document 2 (line {mac_line})" in message, message
    assert "already exists" not in message
    assert BareMetalHost.objects.count() == hosts


def test_a_duplicate_boot_mac_in_the_api_names_the_host_and_changes_nothing(world, api):
    hosts = BareMetalHost.objects.count()
    response = api("admin", "post", "/api/v1/hosts/", {
        "name": "gpu-42", "bmc_address": "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-42",
        "boot_mac": "52:54:00:00:00:01", "bmc_username": "user-gpu-42", "bmc_password": "pw-gpu-42-7c1d"})
    assert response.status_code == 400, response.content
    assert response.json() == {"boot_mac": [TAKEN]}
    assert BareMetalHost.objects.count() == hosts


def test_a_duplicate_boot_mac_in_upper_case_is_the_same_mac(world, api):
    response = api("admin", "post", "/api/v1/hosts/", {
        "name": "gpu-42", "bmc_address": "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-42",
        "boot_mac": "52:54:00:00:00:01".upper(), "bmc_username": "user-gpu-42", "bmc_password": "pw-gpu-42-7c1d"})
    assert response.status_code == 400 and response.json() == {"boot_mac": [TAKEN]}


def test_a_duplicate_boot_mac_in_the_admin_names_the_host(world):
    admin = Client()
    admin.force_login(world.users["admin"])
    hosts = BareMetalHost.objects.count()
    response = admin.post(reverse("admin:hosts_baremetalhost_add"), {
        "name": "gpu-43", "namespace": "metal3", "labels": "{}", "online": "on", "root_device_hints": "{}",
        "automated_cleaning_mode": "metadata", "bmc_address": "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-43",
        "boot_mac": "52:54:00:00:00:01", "new_bmc_username": "user-gpu-43", "new_bmc_password": "pw-gpu-43-7c1d"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["boot_mac"] == [TAKEN]
    assert BareMetalHost.objects.count() == hosts


SELECTOR = """\
privateNodes:
  autoNodes:
    - provider: metal3
      static:
        - name: gpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              operator: Like
              values: [gpu-server]
"""


def test_an_unknown_selector_operator_is_reported_at_the_operator_line_in_the_api(world, api):
    response = world.client("admin").post("/api/v1/apply/?tenant=alpha", SELECTOR, content_type="application/yaml")
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["line"] == 9  # "operator: Like", not "nodeTypeSelector:" (line 7)
    assert body["message"].startswith("privateNodes.autoNodes[0].static[0].nodeTypeSelector[0].operator: "
                                      "unknown operator 'Like'"), body


def test_apply_prints_secrets_created_unchanged_and_configured_without_their_data(demo_site, apply):
    manifest = bmh("gpu-44", "52:54:00:00:44:01")
    assert apply(manifest, dry_run=True) == ["secret/metal3/gpu-44-bmc created (dry run)",
                                             "baremetalhost/gpu-44 created (dry run)"]
    assert apply(manifest) == ["secret/metal3/gpu-44-bmc created", "baremetalhost/gpu-44 created"]
    assert apply(manifest) == ["secret/metal3/gpu-44-bmc unchanged", "baremetalhost/gpu-44 unchanged"]
    rotated = manifest.replace("pw-gpu-44-7c1d", "pw-gpu-44-rotated-91fe")
    lines = apply(rotated, dry_run=True)
    assert lines[0] == "secret/metal3/gpu-44-bmc configured (password changed) (dry run)"
    assert BareMetalHost.objects.get(name="gpu-44").bmc_password == "pw-gpu-44-7c1d"
    lines = apply(rotated)
    assert lines[0] == "secret/metal3/gpu-44-bmc configured (password changed)"
    assert not any("pw-gpu-44" in line or "user-gpu-44" in line for line in lines), lines
    assert BareMetalHost.objects.get(name="gpu-44").bmc_password == "pw-gpu-44-rotated-91fe"
