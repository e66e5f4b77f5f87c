"""Preflight against the lab: the demo's gpu hosts get real Redfish BMCs (sushy-tools; one serving HTTPS with a
self-signed certificate), the agent listener runs and the ramdisk is served, and `manage.py preflight` (what the
host page's action and the beat run too) turns each host green or red with the reason. A red host is not
allocated; fixed and checked again, it is."""
import pytest
from django.core.management import call_command
from django.test import Client

from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD, pool

pytest_plugins = ["tests.console_conftest"]

USER, BMC_PASSWORD = "admin", "lab-bmc-password-77aa"
WRONG_PASSWORD = "not-the-bmc-password"


@pytest.fixture
def site(console_site, agent_server, settings, tmp_path, redfish_labs):
    """gpu-01: a good BMC over HTTP; gpu-02: HTTPS with a self-signed certificate; gpu-03: its system lacks
    the host's boot MAC; gpu-04: the host has a wrong BMC password. The cpu hosts keep their dead addresses."""
    settings.IMAGE_DIR = tmp_path / "images"
    settings.IMAGE_DIR.mkdir()
    (settings.IMAGE_DIR / "agent-vmlinuz").write_bytes(b"kernel")
    (settings.IMAGE_DIR / "agent-initrd").write_bytes(b"initrd")
    settings.AGENT_KERNEL_URL = f"{agent_server.url}/images/agent-vmlinuz"
    settings.AGENT_INITRD_URL = f"{agent_server.url}/images/agent-initrd"
    settings.PREFLIGHT_RAMDISK_CHECK = True
    hosts = {h.name: h for h in BareMetalHost.objects.filter(labels__role="gpu")}
    systems = [{"name": "gpu-01", "mac": hosts["gpu-01"].boot_mac},
               {"name": "gpu-02", "mac": hosts["gpu-02"].boot_mac, "tls": True},
               {"name": "gpu-03", "mac": "52:54:00:99:99:03"},
               {"name": "gpu-04", "mac": hosts["gpu-04"].boot_mac}]
    with redfish_labs(systems, USER, BMC_PASSWORD, power_delay=(0.1, 0.2)) as lab:
        for name, host in hosts.items():
            scheme = "redfish+https" if name == "gpu-02" else "redfish+http"
            BareMetalHost.objects.filter(pk=host.pk).update(
                bmc_address=lab.system_address(name, scheme=scheme), bmc_username=USER,
                bmc_password=WRONG_PASSWORD if name == "gpu-04" else BMC_PASSWORD)
        yield lab


def preflight(*args) -> int:
    try:
        call_command("preflight", *args)
    except SystemExit as exc:
        return exc.code
    return 0


def host(name: str) -> BareMetalHost:
    return BareMetalHost.objects.get(name=name)


def admin_client() -> Client:
    from django.contrib.auth.models import User

    user = User.objects.create_user("pf-admin", "pf@example.invalid", PASSWORD, is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(user)
    return client


def test_a_good_bmc_and_boot_path_are_green_with_the_bmcs_quirks_recorded(site, capsys):
    assert preflight("--host", "gpu-01") == 0
    gpu01 = host("gpu-01")
    assert (gpu01.preflight_ok, gpu01.preflight_reason, gpu01.bmc_ok) == (True, "", True)
    assert gpu01.preflight["bmc"]["tls"] == "none (plain HTTP)"
    quirks = gpu01.preflight["bmc"]["quirks"]
    assert quirks["virtual_media"] is True and quirks["boot_once"] is True and quirks["pxe_boot"] is True
    assert quirks["boot_mode"] in ("UEFI", "Legacy")
    assert gpu01.preflight["boot"] == {"ok": True, "reason": "", "dhcp_checked": gpu01.preflight["boot"]["dhcp_checked"],
                                       "via": "network boot (iPXE)"}
    assert "gpu-01: green (TLS none (plain HTTP))" in capsys.readouterr().out


def test_a_self_signed_certificate_is_red_until_verification_is_disabled_then_green_and_marked(site, apply):
    assert preflight("--host", "gpu-02") == 1
    gpu02 = host("gpu-02")
    assert gpu02.preflight_ok is False
    assert "certificate verification failed" in gpu02.preflight_reason
    assert "disable certificate verification for this host" in gpu02.preflight_reason

    # The host's manifest says, as Metal3's does, that this BMC's certificate is not verified.
    BareMetalHost.objects.filter(pk=gpu02.pk).update(bmc_disable_certificate_verification=True)
    assert preflight("--host", "gpu-02") == 0
    gpu02 = host("gpu-02")
    assert (gpu02.preflight_ok, gpu02.preflight["bmc"]["tls"], gpu02.preflight["unverified_tls"]) == \
        (True, "not verified", True)
    event = Event.objects.filter(host=gpu02, step="preflight").latest("pk")
    assert event.message == "preflight green: TLS certificate not verified (disableCertificateVerification)"

    client = admin_client()
    page = client.get("/hosts/gpu-02/").content.decode()
    assert 'id="preflight"' in page and "Preflight green" in page
    assert "TLS certificate not verified" in page
    api = client.get(f"/api/v1/hosts/{gpu02.pk}/").json()
    assert api["preflight_ok"] is True and api["preflight_tls"] == "not verified"


def test_a_host_whose_mac_the_system_does_not_have_is_red(site):
    assert preflight("--host", "gpu-03") == 1
    gpu03 = host("gpu-03")
    assert gpu03.preflight_ok is False
    assert gpu03.preflight_reason.startswith(f"BMC: boot MAC {gpu03.boot_mac} not found on system")
    assert gpu03.bmc_ok is True  # the BMC answers: it is the host's record that is wrong


def test_a_wrong_password_is_red_401_and_a_dead_boot_route_is_red_too(site, settings):
    settings.AGENT_BOOT_URL = "http://127.0.0.1:9/"  # nothing listens there
    assert preflight("--host", "gpu-04") == 1
    gpu04 = host("gpu-04")
    assert gpu04.preflight_ok is False and gpu04.bmc_ok is False
    assert gpu04.preflight_reason.startswith("BMC: BMC rejected credentials (401); boot path: boot route "
                                             "http://127.0.0.1:9/boot/02-00-00-00-00-00.ipxe not reachable")
    assert WRONG_PASSWORD not in str(gpu04.preflight) and BMC_PASSWORD not in str(gpu04.preflight)


def test_a_red_host_is_not_allocated_and_is_once_fixed_and_checked_again(site):
    # Only gpu-04 (wrong password) is free to serve tenant one's gpu pool.
    BareMetalHost.objects.filter(name__in=["gpu-01", "gpu-02", "gpu-03"]).update(state=HostState.MAINTENANCE)
    assert preflight("--host", "gpu-04") == 1
    gpu_pool = pool("one", "gpu")
    gpu_pool.quantity = 1
    gpu_pool.save(update_fields=["quantity"])
    call_command("reconcile")
    claim = NodeClaim.objects.get(pool=gpu_pool)
    assert (claim.phase, claim.host_id) == ("Pending", None)
    assert "preflight red, not allocated: gpu-04 (BMC: BMC rejected credentials (401))" in claim.message
    assert host("gpu-04").state == HostState.AVAILABLE

    gpu04 = host("gpu-04")
    gpu04.bmc_password = BMC_PASSWORD  # the Secret fixed
    gpu04.save()
    assert preflight("--host", "gpu-04") == 0
    call_command("reconcile")
    claim.refresh_from_db()
    assert claim.host_name == "gpu-04" and host("gpu-04").state == HostState.PROVISIONING


def test_an_environments_hosts_are_checked_together_and_summarised_on_the_environment_and_tenant_pages(site):
    from pools.models import NodeEnvironment

    environment = NodeEnvironment.objects.get()
    assert preflight("--environment", f"{environment.namespace}/{environment.name}") == 1
    assert set(BareMetalHost.objects.filter(preflight_ok=True).values_list("name", flat=True)) == {"gpu-01"}
    assert BareMetalHost.objects.filter(preflight_ok=False).count() == 7  # the cpu hosts' BMCs are not there
    client = admin_client()
    page = client.get("/environments/").content.decode()
    assert "Preflight: 1 green, <b class=\"cap-red\">7 red</b>" in page
    assert "gpu-03: BMC: boot MAC" in page

    gpu_pool = pool("one", "gpu")
    gpu_pool.quantity = 1
    gpu_pool.save(update_fields=["quantity"])
    call_command("reconcile")
    assert NodeClaim.objects.get(pool=gpu_pool).host_name == "gpu-01"  # the one green gpu host
    page = client.get("/tenants/one/").content.decode()
    assert "the 1 host serving it: 1 green, 0 red" in page

    BareMetalHost.objects.filter(name="gpu-01").update(bmc_password=WRONG_PASSWORD)
    assert preflight("--host", "gpu-01") == 1
    page = client.get("/tenants/one/").content.decode()
    assert "the 1 host serving it: 0 green, <b class=\"cap-red\">1 red</b>" in page
    assert "gpu-01: BMC: BMC rejected credentials (401)" in page
