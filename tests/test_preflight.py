"""Preflight as people and the console run it: the host page's action and a change of a host's BMC credentials
both have a real Celery worker preflight the host (against the lab's Redfish emulator and the live agent
listener); the periodic task takes the hosts not checked lately; the capacity card and API count red hosts;
`manage.py preflight` refuses what does not exist and changes nothing."""
import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost
from hosts.tasks import preflight_due
from lab.redfish import RedfishLab

USER, BMC_PASSWORD = "admin", "lab-bmc-password-5e21"


@pytest.fixture
def ramdisk(agent_server, settings, worker_settings, tmp_path):
    """The ramdisk the hosts boot, served by the agent listener (this process's and the worker's settings)."""
    images = tmp_path / "images"
    images.mkdir()
    (images / "agent-vmlinuz").write_bytes(b"kernel")
    (images / "agent-initrd").write_bytes(b"initrd")
    values = {"IMAGE_DIR": str(images), "AGENT_KERNEL_URL": f"{agent_server.url}/images/agent-vmlinuz",
              "AGENT_INITRD_URL": f"{agent_server.url}/images/agent-initrd", "PREFLIGHT_RAMDISK_CHECK": "1"}
    worker_settings.update(values)
    settings.IMAGE_DIR = images
    settings.AGENT_KERNEL_URL, settings.AGENT_INITRD_URL = values["AGENT_KERNEL_URL"], values["AGENT_INITRD_URL"]
    settings.PREFLIGHT_RAMDISK_CHECK = True


@pytest.fixture
def lab(demo_site, ramdisk):
    """The demo's hosts, their BMCs the lab's emulator (each on its own port)."""
    hosts = list(BareMetalHost.objects.order_by("name"))
    with RedfishLab([{"name": h.name, "mac": h.boot_mac} for h in hosts], USER, BMC_PASSWORD,
                    power_delay=(0.1, 0.2)) as redfish:
        for h in hosts:
            BareMetalHost.objects.filter(pk=h.pk).update(bmc_address=redfish.system_address(h.name),
                                                         bmc_username=USER, bmc_password=BMC_PASSWORD)
        yield redfish


@pytest.fixture
def admin(db) -> Client:
    from django.contrib.auth.models import User

    client = Client()
    client.force_login(User.objects.create_user("pf-root", "r@example.invalid", "x", is_staff=True,
                                                is_superuser=True))
    return client


def checked(name: str):
    return BareMetalHost.objects.filter(name=name, preflight_checked_at__isnull=False).first()


@pytest.mark.django_db(transaction=True)
def test_the_host_pages_action_has_a_worker_preflight_the_host_and_the_page_shows_it(lab, admin,
                                                                                   celery_worker_process):
    page = admin.get(reverse("host", args=["gpu-01"])).content.decode()
    assert "Run preflight…" in page and "Not checked yet." in page
    response = admin.post(reverse("host-action", args=["gpu-01", "preflight"]), follow=True)
    assert "Run preflight: asked for gpu-01" in response.content.decode()
    host = wait_for(lambda: checked("gpu-01"), timeout=30)
    assert (host.preflight_ok, host.preflight_reason) == (True, ""), host.preflight
    assert host.preflight["boot"]["via"] == "network boot (iPXE)"
    page = admin.get(reverse("host", args=["gpu-01"])).content.decode()
    assert "Preflight green" in page and "One-time boot override" in page
    event = Event.objects.get(host=host, step="preflight")
    assert (event.actor, event.message) == ("user:pf-root", "preflight green")
    assert checked("gpu-02") is None  # only the host asked for


@pytest.mark.django_db(transaction=True)
def test_changing_a_hosts_bmc_credentials_has_it_preflighted_again_on_commit(lab, admin, celery_worker_process):
    host = BareMetalHost.objects.get(name="gpu-02")
    response = admin.patch(f"/api/v1/hosts/{host.pk}/", {"bmc_password": "a-wrong-password"},
                           content_type="application/json")
    assert response.status_code == 200, response.content
    host = wait_for(lambda: checked("gpu-02"), timeout=30)
    assert host.preflight_ok is False
    assert host.preflight_reason == "BMC: BMC rejected credentials (401)"
    api = admin.get(f"/api/v1/hosts/{host.pk}/").json()
    assert (api["preflight_ok"], api["preflight_reason"]) == (False, "BMC: BMC rejected credentials (401)")
    assert api["preflight_checks"]["bmc"] == {"ok": False, "reason": "BMC rejected credentials (401)"}
    assert "a-wrong-password" not in str(api)
    # A save that changes none of the BMC's fields asks for nothing.
    BareMetalHost.objects.filter(pk=host.pk).update(preflight_checked_at=None)
    host.refresh_from_db()
    host.labels = {**host.labels, "note": "relabelled"}
    host.save()
    BareMetalHost.objects.filter(name="gpu-03").update(bmc_address="redfish+http://127.0.0.1:9/redfish/v1/Systems/x")
    gpu03 = BareMetalHost.objects.get(name="gpu-03")
    gpu03.bmc_password = "another-wrong-one"
    gpu03.save()  # this one does: the worker's answer for gpu-03 comes after any for gpu-02 would
    wait_for(lambda: checked("gpu-03"), timeout=30)
    assert checked("gpu-02") is None


@pytest.mark.django_db(transaction=True)
def test_the_periodic_preflight_takes_hosts_not_checked_lately_and_the_capacity_counts_the_red_ones(
        lab, admin, settings):
    settings.PREFLIGHT_BATCH = 5
    BareMetalHost.objects.filter(name="cpu-01").update(bmc_password="wrong")
    assert preflight_due() == 5  # the batch, never-checked hosts first
    assert BareMetalHost.objects.filter(preflight_checked_at__isnull=True).count() == 3
    assert preflight_due() == 3
    assert preflight_due() == 0  # all checked within PREFLIGHT_EVERY_S
    assert set(BareMetalHost.objects.filter(preflight_ok=False).values_list("name", flat=True)) == {"cpu-01"}
    capacity = admin.get("/api/v1/capacity/").json()
    assert capacity["total"]["preflight_red"] == 1
    free = BareMetalHost.objects.filter(state__in=["available", "checking"]).count()
    assert capacity["total"]["held_back"] == 1 and capacity["total"]["available"] == free - 1
    settings.PREFLIGHT_EVERY_S = 0
    assert preflight_due() == 5


@pytest.mark.django_db
def test_the_command_refuses_an_unknown_host_or_environment_and_changes_nothing(demo_site):
    with pytest.raises(CommandError, match="no host nope"):
        call_command("preflight", "--host", "gpu-01", "--host", "nope")
    with pytest.raises(CommandError, match="no NodeEnvironment 'x/y'"):
        call_command("preflight", "--environment", "x/y")
    assert not BareMetalHost.objects.filter(preflight_checked_at__isnull=False).exists()
    assert not Event.objects.filter(step="preflight").exists()


@pytest.mark.django_db(transaction=True)
def test_an_answer_about_credentials_changed_while_they_were_checked_is_not_recorded(lab, monkeypatch):
    import hosts.preflight as preflight

    real = preflight.check_bmc

    def check_while_an_admin_fixes_the_secret(**kwargs):
        answer = real(**kwargs)
        host = BareMetalHost.objects.get(name="gpu-01")
        host.bmc_password = "changed-meanwhile"
        host.save()
        return answer

    monkeypatch.setattr(preflight, "check_bmc", check_while_an_admin_fixes_the_secret)
    [result] = preflight.hosts_preflight(hosts=[BareMetalHost.objects.get(name="gpu-01")], actor="test")
    assert (result["ok"], result["reason"]) == (None, "changed while checked: not recorded")
    assert checked("gpu-01") is None and not Event.objects.filter(step="preflight").exists()
