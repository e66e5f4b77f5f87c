"""The release gate's evidence on the console: a host's erase certificates (printable page and signed JSON) and
health-check runs on its page, scoped so a tenant member never sees another tenant's certificates; the repair
pool's rows with the failing step, the message and links to the health run or certificate that failed."""
from html import unescape

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from claims.models import NodeClaim
from hosts.gate import certificates, cleaning
from hosts.models import BareMetalHost
from hosts.services import host_transition
from pools.models import NodeProvider, Tenant, TenantMembership

pytestmark = pytest.mark.django_db

GATE = {"node_type": "gpu-server", "policy": {"method": "full", "fallback": "", "source": "NodeType gpu-server"}}


def as_user(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return unescape(response.content.decode())


def erased(disk: str, serial: str) -> dict:
    return {"disks": [{"name": disk, "ok": True, "serial": serial, "model": "SAMSUNG MZWLO3T8HCLS", "type": "nvme",
                       "size_bytes": 3840755982336, "requested": "full", "method": "full", "method_type": "Clear",
                       "method_details": "one pass of zeros", "tool": "vmetal-agent (pwrite)", "attempts": [],
                       "started_at": "2026-11-29T10:00:00Z", "ended_at": "2026-11-29T10:09:00Z",
                       "expectation": "zeros"}]}


def verified(disk: str, serial: str, survived: int = 0) -> dict:
    result = {"name": disk, "serial": serial, "expectation": "zeros", "mode": "sampled", "direct_io": True,
              "canaries": {"planted": 64, "checked": 64, "survived": survived}, "bytes_read": 38666240,
              "samples": {"count": 586, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0},
              "passed": not survived, "findings": []}
    return {"disks": [result], "passed": result["passed"]}


def certificate(host, *, flow_id: str, tenant: str, claim: str, disk: str = "nvme0n1", serial: str = "S0",
                survived: int = 0):
    """As the gate's verify_erase step issues it."""
    from hosts.gate.census import census_take

    census = census_take(host=BareMetalHost(), bmc_drives=[{"name": "Disk.Bay.0", "serial": serial,
                                                            "size_bytes": 3840755982336}])
    return cleaning.issue_certificates(host=host, flow_id=flow_id, gate=GATE,
                                       previous={"tenant": tenant, "claim": claim}, erase=erased(disk, serial),
                                       verify=verified(disk, serial, survived), census=census)[0]


def dcgm_run(host, *, flow_id: str, verdict: str = "fail"):
    """As the gate's health_dcgm step records it."""
    reasons = ["GPU Memory (GPU 3): Found 12 faulty memory elements on GPU 3"] if verdict == "fail" else []
    parsed = {"verdict": verdict, "reasons": reasons,
              "gpus": {"3": {"status": verdict, "tests": {"GPU Memory": verdict}, "reasons": reasons}}}
    return cleaning.record_health(host=host, flow_id=flow_id, suite="dcgmi", gate=GATE, parsed=parsed,
                                  raw={"command": "dcgmi diag -r 2 -j", "exit_code": 205 if reasons else 0,
                                       "stdout": "{}"}, thresholds={"dcgm_level": 2})


@pytest.fixture
def people(db):
    one, two = Tenant.objects.create(name="one"), Tenant.objects.create(name="two")
    admin = User.objects.create_user("root-admin", is_staff=True, is_superuser=True)
    auditor = User.objects.create_user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    alice, bob = User.objects.create_user("alice"), User.objects.create_user("bob")
    TenantMembership.objects.create(tenant=one, user=alice)
    TenantMembership.objects.create(tenant=two, user=bob)
    return {"admin": admin, "auditor": auditor, "alice": alice, "bob": bob, "one": one, "two": two}


@pytest.fixture
def served_host(people):
    """gpu-01, now serving tenant one; erased twice before: after tenant two's claim, after tenant one's."""
    host = BareMetalHost.objects.create(name="gpu-01", state="provisioned", boot_mac="52:54:00:00:00:01",
                                        bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/1")
    provider = NodeProvider.objects.create(name="metal3")
    NodeClaim.objects.create(name="one-now", tenant=people["one"], provider=provider, pool_name="gpu", host=host,
                             host_name=host.name, phase="available")
    return host


def test_the_host_page_lists_certificates_with_their_printable_page_and_signed_json_and_the_health_runs(
        people, served_host):
    theirs = certificate(served_host, flow_id="f-two", tenant="two", claim="two-k3x9", serial="S-TWO")
    ours = certificate(served_host, flow_id="f-one", tenant="one", claim="one-p2q8", serial="S-ONE")
    run = dcgm_run(served_host, flow_id="f-one")
    admin = as_user(people["admin"])
    html = page(admin, reverse("host", args=["gpu-01"]))
    for cert, claim in ((theirs, "two-k3x9"), (ours, "one-p2q8")):
        assert f'href="/certificates/{cert.pk}/"' in html and f'href="/certificates/{cert.pk}.json"' in html
        assert claim in html and cert.serial in html
    assert f'<tr id="health-run-{run.pk}">' in html
    row = html.split(f'id="health-run-{run.pk}"', 1)[1].split("</tr>", 1)[0]
    assert ">dcgmi<" in row and ">fail<" in row and "Found 12 faulty memory elements on GPU 3" in row
    # The links work: the JSON is the signed file, as verify-certificate checks it; the page prints it.
    download = admin.get(f"/certificates/{ours.pk}.json")
    assert download.status_code == 200 and download.content.decode() == certificates.render_certificate(ours)
    assert certificates.verify_text(download.content.decode())[0]
    assert "S-ONE" in page(admin, f"/certificates/{ours.pk}/")
    auditor_html = page(as_user(people["auditor"]), reverse("host", args=["gpu-01"]))
    assert f'href="/certificates/{theirs.pk}.json"' in auditor_html and f'id="health-run-{run.pk}"' in auditor_html


def test_a_tenant_member_sees_only_the_evidence_of_their_own_tenant_s_data_on_the_host_page(people, served_host):
    theirs = certificate(served_host, flow_id="f-two", tenant="two", claim="two-k3x9", serial="S-TWO")
    ours = certificate(served_host, flow_id="f-one", tenant="one", claim="one-p2q8", serial="S-ONE")
    our_run = dcgm_run(served_host, flow_id="f-one", verdict="pass")
    their_run = dcgm_run(served_host, flow_id="f-two")
    registration = dcgm_run(served_host, flow_id="f-register")  # no tenant's data was erased: staff only
    alice = as_user(people["alice"])
    html = page(alice, reverse("host", args=["gpu-01"]))
    assert f'href="/certificates/{ours.pk}/"' in html and f'href="/certificates/{ours.pk}.json"' in html
    assert "one-p2q8" in html
    assert f"/certificates/{theirs.pk}" not in html  # no link, no name, no serial of tenant two's erase
    assert "two-k3x9" not in html and "S-TWO" not in html and ">two<" not in html
    # The health runs of the release that erased tenant one's data, as the API gives them (core.scoping).
    assert f'id="health-run-{our_run.pk}"' in html
    assert f'id="health-run-{their_run.pk}"' not in html and f'id="health-run-{registration.pk}"' not in html
    assert "faulty memory" not in html
    staff_html = page(as_user(people["auditor"]), reverse("host", args=["gpu-01"]))
    assert all(f'id="health-run-{run.pk}"' in staff_html for run in (our_run, their_run, registration))
    assert alice.get(f"/certificates/{theirs.pk}.json").status_code == 404
    assert alice.get(f"/certificates/{theirs.pk}/").status_code == 404
    bob = as_user(people["bob"])  # tenant two no longer uses the host: no host page, and not one's proof
    assert bob.get(reverse("host", args=["gpu-01"])).status_code == 404
    assert bob.get(f"/certificates/{ours.pk}.json").status_code == 404
    assert bob.get(f"/certificates/{theirs.pk}.json").status_code == 200  # the proof owed to tenant two


def sent_to_repair(name: str, *, step: str, message: str, evidence: dict) -> tuple[BareMetalHost, dict]:
    """A released host the gate set aside: the transition hosts.flows.host.host_flow_fail makes, with its evidence."""
    host = BareMetalHost.objects.create(name=name, state="deprovisioning", boot_mac=f"52:54:00:00:01:{name[-2:]}",
                                        bmc_address=f"redfish+http://127.0.0.1:1/redfish/v1/Systems/{name}")
    return host, {"step": step, "message": message, "evidence": evidence,
                  "reason": f"deprovision failed at {step}: {message}"}


def test_the_repair_page_shows_each_host_s_failing_step_message_and_links_to_what_failed(people):
    gpu, gpu_fail = sent_to_repair("gpu-03", step="health_dcgm",
                                   message="dcgmi diag -r 2: GPU Memory (GPU 3): Found 12 faulty memory elements on "
                                           "GPU 3", evidence={})
    run = dcgm_run(gpu, flow_id="f-gpu")
    gpu_fail["evidence"] = {"health_run": run.pk, "reasons": run.reasons}
    disk, disk_fail = sent_to_repair("gpu-04", step="verify_erase", message="", evidence={})
    good = certificate(disk, flow_id="f-disk", tenant="two", claim="two-k3x9", disk="nvme0n1", serial="S-GOOD")
    bad = certificate(disk, flow_id="f-disk", tenant="two", claim="two-k3x9", disk="nvme1n1", serial="S-BAD",
                      survived=5)
    disk_fail.update(message="erase verification failed: nvme1n1: 5 of 64 canaries survived the erase",
                     evidence={"certificates": [good.pk, bad.pk], "verify": {"passed": False}})
    disk_fail["reason"] = f"deprovision failed at verify_erase: {disk_fail['message']}"
    for host, fail in ((gpu, gpu_fail), (disk, disk_fail)):
        host_transition(host=host, to_state="repair", actor="system:flow", reason=fail["reason"], step=fail["step"],
                        data={"flow": "deprovision", "flow_id": "f", "step": fail["step"], "message": fail["message"],
                              "evidence": fail["evidence"]})

    html = page(as_user(people["auditor"]), reverse("repair"))
    rows = {name: html.split(f'<tr id="repair-{host.pk}">', 1)[1].split("</tr>", 1)[0]
            for name, host in (("gpu", gpu), ("disk", disk))}
    assert ">health_dcgm<" in rows["gpu"] and gpu_fail["reason"] in rows["gpu"]
    assert f'href="/health-runs/{run.pk}/"' in rows["gpu"] and "dcgmi health run (fail)" in rows["gpu"]
    assert ">verify_erase<" in rows["disk"] and "5 of 64 canaries survived the erase" in rows["disk"]
    assert f'href="/certificates/{bad.pk}/"' in rows["disk"] and f'href="/certificates/{bad.pk}.json"' in rows["disk"]
    assert "erase certificate nvme1n1 (fail)" in rows["disk"]
    assert f"/certificates/{good.pk}" not in rows["disk"]  # a disk that passed is not the evidence
    # Each link leads to the evidence itself.
    assert "Found 12 faulty memory elements on GPU 3" in page(as_user(people["auditor"]), f"/health-runs/{run.pk}/")
    assert "5 of 64 canaries survived the erase" in page(as_user(people["auditor"]), f"/certificates/{bad.pk}/")


def test_a_health_run_has_its_own_page_with_the_tools_words_each_gpu_and_the_raw_output(people, served_host):
    ours = dcgm_run(served_host, flow_id="f-one")
    certificate(served_host, flow_id="f-one", tenant="one", claim="one-p2q8")
    theirs = dcgm_run(served_host, flow_id="f-two")
    certificate(served_host, flow_id="f-two", tenant="two", claim="two-k3x9", serial="S-TWO")
    html = page(as_user(people["auditor"]), reverse("health-run", args=[ours.pk]))
    assert '<span class="badge badge-danger" id="health-run-verdict">fail</span>' in html
    assert "<li>GPU Memory (GPU 3): Found 12 faulty memory elements on GPU 3</li>" in html
    gpu_row = html.split('<tr id="gpu-3">', 1)[1].split("</tr>", 1)[0]
    assert "GPU Memory: fail" in gpu_row and ">fail<" in gpu_row
    assert "dcgmi diag -r 2 -j" in html and "<dt>dcgm_level</dt><dd>2</dd>" in html and "<dd>205</dd>" in html
    assert 'href="/hosts/gpu-01/"' in html
    # From the host page's row to it.
    assert f'href="/health-runs/{ours.pk}/"' in page(as_user(people["auditor"]), reverse("host", args=["gpu-01"]))
    # A member: the runs of their own tenant's release, no other; the host page linked only while it serves them.
    alice = as_user(people["alice"])
    assert "faulty memory" in page(alice, reverse("health-run", args=[ours.pk]))
    assert alice.get(reverse("health-run", args=[theirs.pk])).status_code == 404
    bob = as_user(people["bob"])
    bob_html = page(bob, reverse("health-run", args=[theirs.pk]))
    assert "faulty memory" in bob_html and 'href="/hosts/gpu-01/"' not in bob_html  # gpu-01 serves tenant one now
    assert bob.get(reverse("health-run", args=[ours.pk])).status_code == 404
    assert Client().get(reverse("health-run", args=[ours.pk])).status_code == 302  # to the login page
