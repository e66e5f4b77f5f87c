"""Erase certificates: NIST SP 800-88 Rev. 2 Appendix G fields, signed by the console with Ed25519; anyone verifies
one with the published public key; `verify-certificate` says valid for the file as downloaded and tampered for
any changed byte; keys rotate without orphaning old certificates; a console without a signing key signs nothing;
the console recounts what the agent reports instead of trusting its verdict; who may download which
certificate."""
import hashlib
import json
import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from conftest import ROOT
from core import keys
from events.models import Event
from hosts.gate import certificates, cleaning
from hosts.gate.census import census_take
from hosts.models import BareMetalHost, EraseCertificate
from pools.models import Tenant, TenantMembership

from .factories import GATE, erased, verified

pytestmark = pytest.mark.django_db

@pytest.fixture
def host(db):
    return BareMetalHost.objects.create(name="gpu-01", bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/1",
                                        boot_mac="52:54:00:00:00:01", labels={"role": "gpu", "rack": "r1"},
                                        inventory={"system": {"serial": "LAB-gpu-01"}, "disks": [DISK]})


DISK = {"name": "nvme0n1", "serial": "S7GPU011", "model": "SAMSUNG MZWLO3T8HCLS", "size_bytes": 3840755982336,
        "type": "nvme"}


def issue_all(host, *, erase=None, verify=None, flow_id="f-1", bmc_drives=None) -> list[EraseCertificate]:
    return cleaning.issue_certificates(host=host, flow_id=flow_id, gate=GATE,
                                       previous={"tenant": "alpha", "claim": "alpha-gpu-7k2x"},
                                       erase=erase or erased(), verify=verify or verified(),
                                       census=census_take(host=host, bmc_drives=bmc_drives), boot_id="boot-1")


def issue(host, **kwargs) -> EraseCertificate:
    return issue_all(host, **kwargs)[0]


def test_a_certificate_carries_the_appendix_g_fields_and_the_tenancy(host):
    doc = issue(host).document
    assert doc["media"] == {"manufacturer": "SAMSUNG", "model": "SAMSUNG MZWLO3T8HCLS", "serial": "S7GPU011",
                            "media_type": "NVMe SSD", "size_bytes": 3840755982336,
                            "source": "bare-metal host gpu-01, disk nvme0n1",
                            "identified_by": "the console's census (inventory of record)"}
    s = doc["sanitization"]
    assert (s["method_type"], s["method"], s["tool"], s["tool_version"]) == ("Purge", "secure", "nvme-cli",
                                                                             "nvme version 2.8")
    assert s["method_details"].startswith("NVMe Format NVM") and s["started_at"] and s["ended_at"]
    assert doc["verification"]["result"] == "pass" and "O_DIRECT" in doc["verification"]["method"]
    assert "zeros not expected" in doc["verification"]["method"]  # NVMe: content indeterminate after the erase
    assert doc["sanitized_by"]["name"].startswith("vmetal-agent") and doc["validated_by"]["name"] == "vMetal Console"
    assert doc["classification"] and doc["post_sanitization_classification"] and doc["destination"]
    assert (doc["host"]["name"], doc["host"]["system_serial"], doc["host"]["location"]) == ("gpu-01", "LAB-gpu-01",
                                                                                            "rack=r1")
    assert (doc["previous_tenant"], doc["claim"], doc["result"]) == ("alpha", "alpha-gpu-7k2x", "pass")


def test_the_downloaded_file_verifies_and_every_changed_byte_is_tampered(host, tmp_path, capsys):
    text = certificates.render_certificate(issue(host))
    path = tmp_path / "cert.json"
    path.write_text(text)
    call_command("verify-certificate", str(path))
    out = capsys.readouterr().out
    assert out.startswith("valid: certificate ") and "serial S7GPU011" in out and "previous tenant alpha" in out
    assert "for host gpu-01, disk " in out and out.count("gpu-01") == 1  # the host named once

    raw = text.encode()
    for i in range(len(raw)):  # every single byte, changed
        changed = bytearray(raw)
        changed[i] = changed[i] ^ 0x01 if changed[i] not in (0x22, 0x5C) else changed[i] ^ 0x02
        valid, reasons, _ = certificates.verify_text(changed.decode("utf-8", "replace"))
        assert not valid and reasons, f"a change at byte {i} ({chr(raw[i])!r}) went unnoticed"

    doc = json.loads(text)
    doc["certificate"]["previous_tenant"] = "beta"
    path.write_text(certificates.render(doc["certificate"], doc["signature"]["value"], doc["signature"]["key_id"]))
    with pytest.raises(SystemExit) as exit_status:
        call_command("verify-certificate", str(path))
    assert exit_status.value.code == 1
    assert capsys.readouterr().out == ("tampered: the signature does not match the content: the certificate was "
                                       "changed after signing\n")
    path.write_text(json.dumps(json.loads(text), indent=4))  # same content, other bytes
    assert certificates.verify_text(path.read_text())[1] == [
        "the file differs from the signed rendering: bytes were changed outside the signed content"]


def test_another_console_s_key_is_not_this_one_s(host, settings):
    text = certificates.render_certificate(issue(host))
    settings.CERTIFICATE_SIGNING_KEY = keys.new_signing_key()
    valid, reasons, _ = certificates.verify_text(text)
    assert not valid and reasons[0].startswith("signed with key ")


def test_a_third_party_verifies_a_certificate_with_the_published_public_key_alone(host, client):
    """What an auditor does, with `cryptography` and none of the console's code or secrets."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    text = certificates.render_certificate(issue(host))
    published = client.get("/certificates/signing-keys.pem")  # no login
    assert published.status_code == 200 and "PRIVATE" not in published.content.decode()
    public_key = load_pem_public_key(published.content)
    doc = json.loads(text)
    signature = doc["signature"]
    assert signature["alg"] == "Ed25519"
    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert signature["key_id"] == hashlib.sha256(raw).hexdigest()[:16]

    def signed_bytes(certificate: dict) -> bytes:
        return json.dumps(certificate, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    public_key.verify(bytes.fromhex(signature["value"]), signed_bytes(doc["certificate"]))  # raises if not valid
    tampered = json.loads(text.replace("S7GPU011", "S7GPU012"))  # one byte: the disk's serial
    with pytest.raises(InvalidSignature):
        public_key.verify(bytes.fromhex(signature["value"]), signed_bytes(tampered["certificate"]))


def test_verify_certificate_with_a_public_key_needs_no_database_and_none_of_the_console_s_secrets(host, client,
                                                                                                tmp_path):
    (tmp_path / "cert.json").write_text(certificates.render_certificate(issue(host)))
    (tmp_path / "keys.pem").write_bytes(client.get("/certificates/signing-keys.pem").content)
    # Another machine: a database that does not answer, keys of its own (its signing key is not the one that signed).
    env = {**os.environ, **keys.throwaway_keys({}), "DATABASE_URL": "postgres://nobody@127.0.0.1:1/nowhere",
           "LOG_LEVEL": "WARNING"}

    def verify(*args):
        return subprocess.run([sys.executable, "manage.py", "verify-certificate", str(tmp_path / "cert.json"), *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    checked = verify("--public-key", str(tmp_path / "keys.pem"))
    assert checked.returncode == 0 and checked.stdout.startswith("valid: certificate "), checked.stderr
    unknown = verify()  # that machine's own key did not sign it
    assert unknown.returncode == 1 and "is not among the keys checked" in unknown.stdout


def test_after_a_key_rotation_old_certificates_verify_through_the_retired_public_key(host, settings, client,
                                                                                    capsys):
    before = certificates.render_certificate(issue(host, flow_id="f-before"))
    call_command("certificate-key", "public")
    old_public = capsys.readouterr().out
    call_command("certificate-key", "generate")
    settings.CERTIFICATE_SIGNING_KEY = capsys.readouterr().out
    assert settings.CERTIFICATE_SIGNING_KEY.startswith("-----BEGIN PRIVATE KEY-----")
    assert not certificates.verify_text(before)[0]  # the new key alone does not know the old one
    settings.CERTIFICATE_VERIFY_KEYS = old_public
    after = certificates.render_certificate(issue(host, flow_id="f-after"))
    assert certificates.verify_text(before)[0] and certificates.verify_text(after)[0]
    assert json.loads(before)["signature"]["key_id"] != json.loads(after)["signature"]["key_id"]
    published = client.get("/certificates/signing-keys.pem").content.decode()
    assert published.count("BEGIN PUBLIC KEY") == 2
    assert f"key {json.loads(after)['signature']['key_id']} (Ed25519, current)" in published
    assert f"key {json.loads(before)['signature']['key_id']} (Ed25519, retired)" in published


def test_without_a_signing_key_the_release_gate_fails_with_the_reason_and_signs_nothing(host, settings,
                                                                                         monkeypatch):
    from hosts.choices import HostState
    from hosts.engine.drive import drive
    from hosts.flows import steps
    from hosts.lifecycle import FLOWS
    from hosts.services import host_transition

    host_transition(host=host, to_state=HostState.INSPECTING, actor="test", reason="test")
    host.refresh_from_db()
    names = [s.name for s in FLOWS["inspect"].steps]
    host.flow = {"name": "inspect", "id": "f-unsigned", "state_since": host.state_changed_at.isoformat(),
                 "done": {name: {} for name in names[:names.index("verify_erase")]},
                 "data": {"gate": {**cleaning.gate_for(host), "previous": {"tenant": "", "claim": ""}},
                          "erase": erased()}}
    host.save(update_fields=["flow"])
    monkeypatch.setattr(steps, "agent_command", lambda run, name, *args, **kwargs: verified())
    settings.CERTIFICATE_SIGNING_KEY = ""
    drive(host.pk)
    host.refresh_from_db()
    assert host.state == HostState.REPAIR
    assert Event.objects.filter(host=host, to_state=HostState.REPAIR).get().message == (
        "inspect failed at verify_erase: erase certificates cannot be signed: no signing key is configured (set "
        "CERTIFICATE_SIGNING_KEY, or CERTIFICATE_SIGNING_KEY_FILE, to an Ed25519 private key in PEM form)")
    assert not EraseCertificate.objects.exists()


def test_the_console_recounts_instead_of_trusting_the_agent_s_verdict(host):
    lying = verified(passed=True, canaries={"planted": 64, "checked": 64, "survived": 3, "survivors": []})
    cert = issue(host, verify=lying, flow_id="f-2")
    assert cert.result == "fail"
    assert cert.document["verification"]["findings"][0] == "3 of 64 canaries survived the erase"
    nothing_read = verified(canaries={"planted": 64, "checked": 0, "survived": 0})
    assert issue(host, verify=nothing_read, flow_id="f-3").result == "fail"
    buffered = verified(direct_io=False)
    assert issue(host, verify=buffered, flow_id="f-4").document["verification"]["findings"] == [
        "the read-back did not use O_DIRECT"]
    agent_says_no = verified(passed=False)
    assert issue(host, verify=agent_says_no, flow_id="f-5").result == "fail"


def test_a_fallback_and_a_failed_erase_are_on_the_certificate(host):
    fell_back = erased(method="full", method_type="Clear", fallback_from="secure", expectation="zeros",
                       fallback_reason="nvme: every NVMe secure erase command failed")
    doc = issue(host, erase=fell_back, verify=verified(expectation="zeros"), flow_id="f-6").document
    assert doc["sanitization"]["fallback"] == {"from": "secure",
                                               "reason": "nvme: every NVMe secure erase command failed"}
    assert doc["sanitization"]["requested_policy"] == "secure" and doc["sanitization"]["method_type"] == "Clear"
    failed = cleaning.issue_certificates(host=host, flow_id="f-7", gate=GATE, previous={"tenant": "alpha"},
                                         erase=erased(ok=False, error="writing zeros failed: Input/output error"),
                                         verify=None, census=census_take(host=host, bmc_drives=None))[0]
    assert failed.result == "fail" and failed.document["verification"]["findings"] == [
        "erase failed: writing zeros failed: Input/output error", "not verified"]
    assert certificates.verify_text(certificates.render_certificate(failed))[0]  # evidence is signed too


def test_certificates_are_downloadable_by_staff_and_by_the_previous_tenant_only(host, client, admin_client):
    cert = issue(host)
    response = admin_client.get(f"/certificates/{cert.pk}.json")
    assert response.status_code == 200 and response.content.decode() == certificates.render_certificate(cert)
    assert response["Content-Disposition"].startswith('attachment; filename="erase-certificate-gpu-01-nvme0n1-')
    page = admin_client.get(f"/certificates/{cert.pk}/").content.decode()
    assert "Certificate of sanitization" in page and "S7GPU011" in page and '<span class="pass">valid</span>' in page

    alpha, beta = Tenant.objects.create(name="alpha"), Tenant.objects.create(name="beta")
    member_a = User.objects.create_user("ann", password="pw")
    member_b = User.objects.create_user("bob", password="pw")
    TenantMembership.objects.create(tenant=alpha, user=member_a)
    TenantMembership.objects.create(tenant=beta, user=member_b)
    client.force_login(member_a)
    assert client.get(f"/certificates/{cert.pk}.json").status_code == 200
    client.force_login(member_b)
    assert client.get(f"/certificates/{cert.pk}.json").status_code == 404
    client.logout()
    assert client.get(f"/certificates/{cert.pk}.json").status_code == 302  # to the login page
