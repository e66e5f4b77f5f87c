"""One way to register a host: apply (a Metal3 BareMetalHost), the API and the admin all call
hosts.services.host_create, so every new host has the same first Event (a TRANSITION into its first state)
and is driven once its row is committed. A Metal3 status annotation comes in through the same path."""
import pytest
from django.test import Client
from django.urls import reverse

import hosts.services
from events.models import Event
from hosts.models import BareMetalHost
from hosts.task_names import DRIVE_HOST
from vmetal_console.celery import app as celery_app

from .factories import bmh

pytestmark = pytest.mark.django_db

HARDWARE = {"cpu": {"arch": "x86_64", "count": 64}, "ramMebibytes": 524288, "gpus": 8}


@pytest.fixture
def drives(monkeypatch) -> list[int]:
    """The hosts a drive was enqueued for (the drive task sent by its name on commit); other tasks go out as ever."""
    sent = []
    send_task = celery_app.send_task

    def spy(name, *args, kwargs=None, **options):
        if name == DRIVE_HOST:
            return sent.append(kwargs["host_id"])
        return send_task(name, *args, kwargs=kwargs, **options)

    monkeypatch.setattr(celery_app, "send_task", spy)
    return sent


def first_event(name: str) -> tuple:
    event = Event.objects.filter(object_type="host", object_name=name).order_by("pk").first()
    return (event.kind, event.from_state, event.to_state, event.message, event.data, event.host_id, event.actor)


def test_a_host_registered_by_apply_the_api_or_the_admin_has_the_same_first_event_and_is_driven(
        world, api, apply, drives, django_capture_on_commit_callbacks):
    admin = Client()
    admin.force_login(world.users["admin"])
    with django_capture_on_commit_callbacks(execute=True):
        apply(bmh("gpu-21", "52:54:00:00:21:01"))
    with django_capture_on_commit_callbacks(execute=True):
        made = api("admin", "post", "/api/v1/hosts/", {
            "name": "gpu-22", "bmc_address": "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-22",
            "boot_mac": "52:54:00:00:22:01", "bmc_username": "user-gpu-22", "bmc_password": "pw-gpu-22-7c1d"})
        assert made.status_code == 201 and made.json()["state"] == "registering"
    with django_capture_on_commit_callbacks(execute=True):
        add = reverse("admin:hosts_baremetalhost_add")
        response = admin.post(add, {"name": "gpu-23", "namespace": "metal3", "labels": "{}", "online": "on",
                                    "root_device_hints": "{}", "automated_cleaning_mode": "metadata",
                                    "bmc_address": "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-23",
                                    "boot_mac": "52:54:00:00:23:01", "new_bmc_username": "user-gpu-23",
                                    "new_bmc_password": "pw-gpu-23-7c1d"})
        assert response.status_code == 302, response.context["adminform"].form.errors
    hosts = {h.name: h for h in BareMetalHost.objects.filter(name__in=["gpu-21", "gpu-22", "gpu-23"])}
    for name, actor in (("gpu-21", "cli:"), ("gpu-22", "user:ada-admin"), ("gpu-23", "user:ada-admin")):
        host = hosts[name]
        kind, from_state, to_state, message, data, host_id, by = first_event(name)
        assert (kind, from_state, to_state, message, host_id) == (
            "transition", "", "registering", "created", host.pk), name
        # what it was made with, for the audit trail, its secrets only said to be set
        assert data["before"] == {} and data["after"]["name"] == name, name
        assert data["after"]["bmc_password"] == "(set)" and "pw-gpu-2" not in str(data), name
        assert by.startswith(actor), (name, by)
        assert host.state == "registering" and host.deadline_at is not None, name
    assert sorted(drives) == sorted(h.pk for h in hosts.values())


def test_an_imported_metal3_status_comes_in_through_host_create(apply, monkeypatch, drives,
                                                                 django_capture_on_commit_callbacks):
    calls = []
    real = hosts.services.host_create

    def spy(**kwargs):
        calls.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr("manifests.apply.host_create", spy)
    status = {"provisioning": {"state": "available"}, "hardware": HARDWARE}
    with django_capture_on_commit_callbacks(execute=True):
        assert apply(bmh("gpu-31", "52:54:00:00:31:01", status)) == [
            "secret/metal3/gpu-31-bmc created", "baremetalhost/gpu-31 created"]
    [call] = calls
    assert call["status"] == status and call["values"]["name"] == "gpu-31"
    host = BareMetalHost.objects.get(name="gpu-31")
    assert (host.state, host.inventory, host.deadline_at) == ("available", HARDWARE, None)
    assert first_event("gpu-31")[:4] == ("transition", "", "available", "created: imported from Metal3 status as "
                                         "available")
    assert first_event("gpu-31")[4]["imported"] == {"state": "available"}
    assert drives == [host.pk]


@pytest.mark.parametrize("status, message", [
    ({"provisioning": {"state": "provisioned"}}, "only hosts that are available (or registering) can be imported, "
                                                 "not 'provisioned'"),
    ({"hardware": HARDWARE}, "must be Metal3 status JSON with provisioning.state"),
])
def test_an_imported_status_a_new_host_cannot_take_is_refused_and_nothing_is_applied(apply, status, message):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="annotations") as refused:
        apply(bmh("gpu-41", "52:54:00:00:41:01", status))
    assert message in str(refused.value)
    assert not BareMetalHost.objects.filter(name="gpu-41").exists()
    assert not Event.objects.filter(object_name="gpu-41").exists()


# --- BMC addresses the console cannot drive: refused alike by apply, the API and the admin --------------------

SCHEMES = ("redfish://, redfish+https://, redfish+http://, redfish-virtualmedia://, redfish-virtualmedia+https://, "
           "redfish-virtualmedia+http://, idrac-redfish://, idrac-redfish+https://, idrac-redfish+http://, "
           "idrac-virtualmedia://, idrac-virtualmedia+https://, idrac-virtualmedia+http://, ilo5-redfish://, "
           "ilo5-redfish+https://, ilo5-redfish+http://, ilo5-virtualmedia://, ilo5-virtualmedia+https://, "
           "ilo5-virtualmedia+http://, ipmi://")


def no_scheme(address: str) -> str:
    return f"BMC address {address!r} has no scheme: write ipmi://{address} for an IPMI BMC, or use one of {SCHEMES}"


@pytest.mark.parametrize("address", ["10.1.1.9", "bmc-21.example:623"])
def test_an_address_without_a_scheme_is_refused_by_apply_the_api_and_the_admin_and_nothing_is_registered(
        world, api, apply, drives, address):
    from django.core.management import CommandError

    manifest = bmh("gpu-21", "52:54:00:00:21:01").replace(
        "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-21", address)
    line = next(n for n, text in enumerate(manifest.splitlines(), 1) if text.strip().startswith("address:"))
    with pytest.raises(CommandError) as refused:
        apply(manifest, names=["hosts.yaml"])
    message = str(refused.value)
    assert f"/hosts.yaml: document 2 (line {line})" in message and "spec.bmc.address" in message, message
    assert no_scheme(address) in message, message

    made = api("admin", "post", "/api/v1/hosts/", {
        "name": "gpu-22", "bmc_address": address, "boot_mac": "52:54:00:00:22:01",
        "bmc_username": "user-gpu-22", "bmc_password": "pw-gpu-22-7c1d"})
    assert made.status_code == 400 and made.json()["bmc_address"] == [no_scheme(address)], made.json()

    admin = Client()
    admin.force_login(world.users["admin"])
    response = admin.post(reverse("admin:hosts_baremetalhost_add"), {
        "name": "gpu-23", "namespace": "metal3", "labels": "{}", "online": "on", "root_device_hints": "{}",
        "automated_cleaning_mode": "metadata", "bmc_address": address, "boot_mac": "52:54:00:00:23:01",
        "new_bmc_username": "user-gpu-23", "new_bmc_password": "pw-gpu-23-7c1d"})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["bmc_address"] == [no_scheme(address)]

    assert not BareMetalHost.objects.filter(name__in=["gpu-21", "gpu-22", "gpu-23"]).exists()
    assert not Event.objects.filter(object_name__in=["gpu-21", "gpu-22", "gpu-23"]).exists()
    assert drives == []


def test_an_ipmi_host_applies_with_its_credentials_from_the_secret_and_is_driven(
        apply, drives, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        apply(bmh("cpu-21", "52:54:00:00:21:02").replace(
            "redfish+http://127.0.0.1:8099/redfish/v1/Systems/cpu-21", "ipmi://10.1.1.21:623"))
    host = BareMetalHost.objects.get(name="cpu-21")
    assert (host.bmc_address, host.bmc_username, host.bmc_password) == ("ipmi://10.1.1.21:623", "user-cpu-21",
                                                                        "pw-cpu-21-7c1d")
    assert host.state == "registering" and drives == [host.pk]


@pytest.mark.parametrize("extra, field, message", [
    ("  image: {url: 'http://images.example/live.iso', format: live-iso}\n", "spec.image.format",
     "a live ISO boots from virtual media, which an ipmi:// BMC cannot insert: use a redfish-virtualmedia:// address"),
    ("  bootMode: UEFISecureBoot\n", "spec.bootMode",
     "an ipmi:// BMC cannot turn on UEFI secure boot: give this host a Redfish address"),
])
def test_an_ipmi_host_asking_for_what_only_redfish_does_is_refused_at_apply_with_the_reason(
        apply, drives, extra, field, message):
    from django.core.management import CommandError

    manifest = bmh("cpu-22", "52:54:00:00:22:02").replace(
        "redfish+http://127.0.0.1:8099/redfish/v1/Systems/cpu-22", "ipmi://10.1.1.22")
    with pytest.raises(CommandError) as refused:
        apply(manifest.replace("  bootMACAddress:", extra + "  bootMACAddress:"))
    assert field in str(refused.value) and message in str(refused.value), str(refused.value)
    assert not BareMetalHost.objects.filter(name="cpu-22").exists() and drives == []
    # The same asks of a Redfish host are Metal3 fields the console sets itself: accepted.
    apply(bmh("gpu-22", "52:54:00:00:22:03").replace("  bootMACAddress:", extra + "  bootMACAddress:"))
    assert BareMetalHost.objects.filter(name="gpu-22").exists()


def test_an_address_with_a_scheme_no_bmc_speaks_lists_the_schemes_the_console_drives(world, api):
    made = api("admin", "post", "/api/v1/hosts/", {
        "name": "gpu-24", "bmc_address": "http://10.1.1.9/redfish/v1/Systems/1", "boot_mac": "52:54:00:00:24:01",
        "bmc_username": "user-gpu-24", "bmc_password": "pw-gpu-24-7c1d"})
    assert made.status_code == 400
    assert made.json()["bmc_address"] == [f"BMC address scheme http:// is not supported: use one of {SCHEMES}"]


def test_a_vendor_s_redfish_host_applies_and_a_vendor_protocol_the_console_does_not_speak_is_refused(
        apply, drives, django_capture_on_commit_callbacks):
    from django.core.management import CommandError

    with django_capture_on_commit_callbacks(execute=True):
        apply(bmh("gpu-25", "52:54:00:00:25:01").replace(
            "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-25",
            "idrac-virtualmedia://10.1.1.25/redfish/v1/Systems/System.Embedded.1"))
    host = BareMetalHost.objects.get(name="gpu-25")
    assert host.state == "registering" and drives == [host.pk]

    with pytest.raises(CommandError) as refused:  # Dell's WS-Management: Metal3's idrac://, not Redfish
        apply(bmh("gpu-26", "52:54:00:00:26:01").replace(
            "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-26", "idrac://10.1.1.26"))
    assert f"BMC address scheme idrac:// is not supported: use one of {SCHEMES}" in str(refused.value)
    assert not BareMetalHost.objects.filter(name="gpu-26").exists()
