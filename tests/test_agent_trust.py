"""Nobody takes over a server's agent by knowing its MAC: a lookup needs the secret that the console gave the
boot through its boot path, a second lookup never replaces a live session, the agent protocol is not on the
public listener, and a session ends with its boot."""
import io
import json

import pycdlib
import pytest
from django.conf import settings
from django.core.management import call_command

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.choices import EventKind
from events.models import Event
from hosts.boot.ramdisk import VIRTUAL_MEDIA, ramdisk_boot_start
from hosts.models import AgentSession, BareMetalHost, HostCommand, RamdiskBoot
from hosts.services import host_transition

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db


@pytest.fixture
def booting(demo_site):
    """gpu-01 inspecting, with an inspect command queued and a ramdisk boot started (its secret not delivered)."""
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state="inspecting", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"name": "inspect", "id": "flow-1"})
    HostCommand.objects.create(host=host, flow_id="flow-1", step="inspect", name="inspect")
    ramdisk_boot_start(host=host, flow_id="flow-1")
    return BareMetalHost.objects.get(pk=host.pk)


def post(client, path, body, token=None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    response = client.post(path, json.dumps(body), content_type="application/json", **headers)
    return response.status_code, response.json()


def ipxe_secret(agent_client, host) -> str:
    response = agent_client.get(f"/boot/{host.boot_mac.replace(':', '-')}.ipxe")
    assert response.status_code == 200, response.content
    kernel = next(line for line in response.content.decode().splitlines() if line.startswith("kernel "))
    return dict(word.split("=", 1) for word in kernel.split() if word.startswith("vmetal."))["vmetal.boot_secret"]


def security_events(host) -> list[str]:
    return list(Event.objects.filter(kind=EventKind.SECURITY, host=host).values_list("message", flat=True))


def test_a_lookup_with_the_right_macs_and_no_boot_secret_gets_nothing_and_is_recorded(agent_client, booting):
    status, body = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_id": "attacker"})
    assert status == 403 and "token" not in body and "host_id" not in body
    assert not AgentSession.objects.filter(host=booting).exists()
    assert any("without a boot secret" in m for m in security_events(booting)), security_events(booting)


def test_a_lookup_with_a_guessed_secret_gets_nothing(agent_client, booting):
    status, body = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": "A" * 43})
    assert status == 403 and "token" not in body
    assert not AgentSession.objects.filter(host=booting).exists()
    assert any("not this boot's" in m for m in security_events(booting))


def test_the_ipxe_script_carries_the_boot_secret_once_and_a_second_request_races_the_boot(agent_client, booting):
    script = agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.ipxe")
    text = script.content.decode()
    assert script.status_code == 200 and text.startswith("#!ipxe") and "vmetal.console=" in text
    assert "vmetal.boot_secret=" in text
    assert " console=ttyS0,115200n8 quiet vmetal.console=" in text  # AGENT_KERNEL_ARGS: the ramdisk's output on the SOL
    again = agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.ipxe")
    assert again.status_code == 404 and b"boot_secret" not in again.content
    assert [m for m in security_events(booting) if "raced" in m], security_events(booting)
    # delivered: the console no longer holds the secret itself, only its hash
    assert booting.ramdisk_boots.get().secret == ""


def iso_secret(content: bytes) -> str:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(content))
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, iso_path="/VMETAL.CFG;1")
    return dict(w.split("=", 1) for w in out.getvalue().decode().split())["vmetal.boot_secret"]


def test_the_virtual_media_image_is_served_once_at_the_one_time_url_given_to_the_bmc_and_never_by_mac(
        agent_client, booting):
    boot = ramdisk_boot_start(host=booting, flow_id="flow-1", via=VIRTUAL_MEDIA)
    mac = booting.boot_mac.replace(":", "-")
    assert boot.media_url.startswith(settings.AGENT_BOOT_URL) and mac not in boot.media_url
    path = "/" + boot.media_url.split("/", 3)[3]
    # whoever knows the MAC gets nothing: no ISO by MAC, and no iPXE script for a host that boots by virtual media
    assert agent_client.get(f"/boot/{mac}.iso").status_code == 404
    assert agent_client.get(f"/boot/{mac}.ipxe").status_code == 404
    assert agent_client.get("/boot/media/" + "A" * 43 + ".iso").status_code == 404
    response = agent_client.get(path)
    assert response.status_code == 200
    secret = iso_secret(response.content)
    status, body = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})
    assert status == 200 and body["host_id"] == booting.pk
    assert agent_client.get(path).status_code == 404  # once
    # the console keeps the token's hash only
    token = path.rsplit("/", 1)[1].removesuffix(".iso")
    assert token not in str(list(RamdiskBoot.objects.filter(pk=boot.pk).values()))


def test_a_host_that_boots_by_pxe_gets_no_iso_at_all(agent_client, booting):
    assert agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.iso").status_code == 404
    assert ipxe_secret(agent_client, booting)  # and its one delivery is still there


def test_a_boot_fetched_twice_is_void_its_session_ends_and_its_agents_work_is_dropped(agent_client, booting):
    secret = ipxe_secret(agent_client, booting)
    token = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})[1]["token"]
    status, answer = post(agent_client, "/agent/heartbeat", {"host_id": booting.pk, "status": "idle"}, token)
    assert status == 200 and answer["command"]["name"] == "inspect"
    # the server's own fetch, after someone else's: the boot is raced
    assert agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.ipxe").status_code == 404
    assert post(agent_client, "/agent/heartbeat", {"host_id": booting.pk, "status": "idle"}, token)[0] == 403
    assert post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})[0] == 403
    assert not HostCommand.objects.filter(host=booting).exists()  # its result is never read
    raced = [e for e in Event.objects.filter(kind=EventKind.SECURITY, host=booting) if "raced" in e.message]
    assert len(raced) == 1, security_events(booting)
    boot = booting.ramdisk_boots.get()
    assert raced[0].data["boot"] == boot.pk and raced[0].data["sessions_ended"] == 1
    assert raced[0].data["addresses"] == ["127.0.0.1", "127.0.0.1"]
    assert boot.raced_at is not None and BareMetalHost.objects.get(pk=booting.pk).raced_boot_id == boot.pk
    # a third fetch changes nothing more
    assert agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.ipxe").status_code == 404
    assert len([m for m in security_events(booting) if "raced" in m]) == 1


def test_a_certificate_signed_from_a_raced_boot_is_revoked_and_verify_certificate_says_so(
        agent_client, booting, tmp_path, capsys):
    from hosts.gate import certificates, cleaning
    from hosts.gate.census import census_take

    ipxe_secret(agent_client, booting)
    gate = {"node_type": "gpu-server", "policy": {"method": "secure", "fallback": "full", "source": "test"}}
    disk = {"name": "nvme0n1", "ok": True, "serial": "S7GPU011", "model": "M", "size_bytes": 1 << 30,
            "method": "secure", "method_type": "Purge", "expectation": "changed"}
    check = {"name": "nvme0n1", "serial": "S7GPU011", "expectation": "changed", "mode": "sampled", "passed": True,
             "canaries": {"planted": 4, "checked": 4, "survived": 0, "survivors": []},
             "samples": {"count": 4, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0}, "findings": []}
    census = census_take(host=BareMetalHost(name=booting.name, inventory={"disks": [disk]}), bmc_drives=None)
    cert = cleaning.issue_certificates(host=booting, flow_id="flow-1", gate=gate, previous={}, erase={"disks": [disk]},
                                       verify={"disks": [check], "passed": True}, census=census, boot_id="b")[0]
    path = tmp_path / "cert.json"
    path.write_text(certificates.render_certificate(cert))
    call_command("verify-certificate", str(path))
    assert capsys.readouterr().out.startswith("valid:")
    assert agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.ipxe").status_code == 404  # raced
    cert.refresh_from_db()
    assert cert.revoked_at is not None and "raced" in cert.revoked_reason
    with pytest.raises(SystemExit):
        call_command("verify-certificate", str(path))
    assert capsys.readouterr().out.startswith("revoked:")


def test_a_second_lookup_during_a_live_session_is_refused_and_the_session_keeps_its_token(agent_client, booting):
    secret = ipxe_secret(agent_client, booting)
    status, first = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})
    assert status == 200
    status, second = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})
    assert status == 403 and "token" not in second
    assert any("already has its session" in m for m in security_events(booting))
    # the running agent was not superseded: its token still gets its command
    status, answer = post(agent_client, "/agent/heartbeat", {"host_id": booting.pk, "status": "idle"}, first["token"])
    assert status == 200 and answer["command"]["name"] == "inspect"
    assert AgentSession.objects.filter(host=booting, active=True).count() == 1


def test_an_older_boots_secret_is_refused_after_a_new_boot(agent_client, booting):
    old = ipxe_secret(agent_client, booting)
    ramdisk_boot_start(host=booting, flow_id="flow-1")  # the flow powered the host into the ramdisk again
    assert post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": old})[0] == 403


def test_the_public_listener_answers_404_for_the_agent_and_the_boot_path(client, agent_client, booting):
    mac = booting.boot_mac.replace(":", "-")
    for path in ("/agent/lookup", "/agent/heartbeat", "/agent/result"):
        assert client.post(path, "{}", content_type="application/json").status_code == 404, path
    assert client.get(f"/boot/{mac}.ipxe").status_code == 404
    assert client.get(f"/boot/{mac}.iso").status_code == 404
    assert client.get("/boot/media/" + "A" * 43 + ".iso").status_code == 404
    # and asking there did not use up the boot's one delivery
    assert ipxe_secret(agent_client, booting)


def test_a_session_ends_when_its_host_leaves_the_ramdisk(agent_client, booting):
    secret = ipxe_secret(agent_client, booting)
    token = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})[1]["token"]
    host_transition(host=booting, to_state="error", actor="test", reason="test")
    assert not AgentSession.objects.filter(host=booting, active=True).exists()
    assert post(agent_client, "/agent/heartbeat", {"host_id": booting.pk, "status": "idle"}, token)[0] == 403


def test_tenant_members_get_no_mac_addresses_of_their_nodes(world):
    host = world.host_a
    BareMetalHost.objects.filter(pk=host.pk).update(
        inventory={"nics": [{"name": "eth0", "mac": host.boot_mac, "speed_gbps": 100}]})
    for path in ("/api/v1/hosts/", f"/api/v1/hosts/{host.pk}/"):
        response = world.client("member_a").get(path)
        assert response.status_code == 200, path
        text = response.content.decode().lower()
        assert host.boot_mac.lower() not in text and "boot_mac" not in text, path
        assert "eth0" in text  # the NIC itself is there
    admin = world.client("admin").get(f"/api/v1/hosts/{host.pk}/").content.decode().lower()
    assert host.boot_mac.lower() in admin


@pytest.mark.django_db(transaction=True)
def test_a_caller_who_knows_the_mac_cannot_take_over_a_provisioning_agent(
        lab_factory, celery_worker_process, agent_client, apply):
    """The attack of the review: a loop of lookups with a node's MAC while it is provisioned and then released.
    Every lookup is refused, the real agent finishes both flows, and the host is erased by the real agent."""
    import threading
    import urllib.error
    import urllib.request

    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1, timeout=120)
    host = BareMetalHost.objects.get()
    stop, answers = threading.Event(), []

    def attack():
        body = json.dumps({"macs": [host.boot_mac], "boot_id": "rogue"}).encode()
        while not stop.is_set():
            request = urllib.request.Request(f"{site.console_url}/agent/lookup", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    answers.append((resp.status, resp.read()))
            except urllib.error.HTTPError as exc:
                answers.append((exc.code, b""))
            except OSError:
                pass
            stop.wait(0.2)

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    try:
        apply(gpu_pool(1), tenant="one")
        claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=120)
        assert not AgentSession.objects.filter(active=True).exists(), "a provisioned host keeps no agent session"
        apply(gpu_pool(0), tenant="one")
        wait_for(lambda: not NodeClaim.objects.filter(pk=claim.pk).exclude(phase=ClaimPhase.RELEASED).exists()
                 and BareMetalHost.objects.get().state == "available", timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    finally:
        stop.set()
        attacker.join(10)
    assert answers and all(status == 403 for status, _ in answers), answers[:5]
    assert security_events(host)
    # the release was erased by the real agent: a passing certificate for the release's flow
    assert host.erase_certificates.filter(result="pass").exists()
    assert not AgentSession.objects.filter(active=True).exists()


def test_a_warm_hosts_boot_fetched_again_is_void_and_the_host_is_inspected_and_cleaned_anew(agent_client, booting):
    from django.utils import timezone

    from hosts.engine.drive import drive

    secret = ipxe_secret(agent_client, booting)
    token = post(agent_client, "/agent/lookup", {"macs": [booting.boot_mac], "boot_secret": secret})[1]["token"]
    # kept warm (hosts/flows/warm.py: keep_warm, then the gate's end): its agent idles on in the ramdisk
    BareMetalHost.objects.filter(pk=booting.pk).update(warm_since=timezone.now())
    host_transition(host=BareMetalHost.objects.get(pk=booting.pk), to_state="available", actor="test",
                    reason="gate passed")
    assert agent_client.get(f"/boot/{booting.boot_mac.replace(':', '-')}.ipxe").status_code == 404
    drive(booting.pk)  # the drive the race asked for (a worker's)
    host = BareMetalHost.objects.get(pk=booting.pk)
    assert host.state == "inspecting" and host.warm_since is None
    assert post(agent_client, "/agent/heartbeat", {"host_id": host.pk, "status": "idle"}, token)[0] == 403
    assert len([m for m in security_events(host) if "raced" in m]) == 1
