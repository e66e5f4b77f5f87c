"""The tenant API's VIP, checked from the server's side before the image is written (issue 14, point 1 c): the
agent's `check_endpoint` really connects (TCP, then TLS with the tenant's CA); in the lab a wrong VIP or a wrong
CA stops the provision flow at `check_tenant_api` with the reason, the host goes back to the pool unblamed (and
unerased: nothing was written, tests/test_untouched_release.py), the claim waits with the message, and fixing the
VIP lets it become Available. The tenant page and the API show both sides' checks, never a credential."""
import base64
import datetime
import socket
import ssl
import threading
import time

import pytest

pytest_plugins = ["tests.lab_conftest"]
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.commands.base import Context
from agent.commands.registry import execute
from agent.hardware import Hardware

from .lab_conftest import closed_port, lab_tenant_api

# --- a real TLS endpoint: a CA per tenant, a server certificate for 127.0.0.1 -------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def ca_data(cert) -> str:
    """As a kubeconfig holds it: certificate-authority-data, base64 PEM."""
    return base64.b64encode(_pem(cert)).decode()


class TLSServer:
    """Accepts TLS handshakes on 127.0.0.1 with a certificate that `ca` signed for `san` (or, `silent`, accepts
    TCP and never answers the handshake)."""

    def __init__(self, tmp_path, ca, *, san: str = "127.0.0.1", silent: bool = False):
        import ipaddress

        ca_cert, ca_key = ca
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        alt = (x509.IPAddress(ipaddress.ip_address(san)) if san[0].isdigit() else x509.DNSName(san))
        cert = (x509.CertificateBuilder().subject_name(_name("tenant-api")).issuer_name(ca_cert.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        (tmp_path / "server.pem").write_bytes(_pem(cert) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(tmp_path / "server.pem")
        self.silent = silent
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.handshakes = 0
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.silent:
                threading.Thread(target=lambda c=conn: (time.sleep(5), c.close()), daemon=True).start()
                continue
            try:
                with self.context.wrap_socket(conn, server_side=True) as tls:
                    self.handshakes += 1
                    tls.sendall(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
            except (ssl.SSLError, OSError):
                conn.close()

    def close(self):
        self._stop = True
        self.sock.close()


def check(**args) -> tuple[bool, dict, str | None]:
    outcome = execute("check_endpoint", args, Context(hardware=Hardware()))
    return outcome.ok, outcome.result, outcome.error


# --- the agent's command: what it finds, from where it runs -------------------------------------------------

@pytest.fixture
def tenant_cas():
    return {"one": _ca("tenant one CA"), "two": _ca("tenant two CA")}


def test_the_agent_completes_a_tls_handshake_verified_with_the_tenants_ca(tmp_path, tenant_cas):
    server = TLSServer(tmp_path, tenant_cas["one"])
    try:
        ok, result, error = check(host="127.0.0.1", port=server.port, ca_data=ca_data(tenant_cas["one"][0]))
        assert ok, error
        assert result["endpoint"] == f"127.0.0.1:{server.port}" and result["tls"] is True
        deadline = time.monotonic() + 5  # the server's thread counts the handshake after the client is done
        while server.handshakes < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.handshakes == 1
    finally:
        server.close()


def test_another_tenants_ca_fails_the_check_with_the_tls_reason(tmp_path, tenant_cas):
    server = TLSServer(tmp_path, tenant_cas["one"])
    try:
        ok, result, error = check(host="127.0.0.1", port=server.port, ca_data=ca_data(tenant_cas["two"][0]))
        assert not ok
        assert error == "TLS certificate not signed by the tenant's CA"
        assert result["kind"] == "tls-verify" and "unable to get local issuer" in result["detail"]
    finally:
        server.close()


def test_a_certificate_for_another_name_fails_the_check(tmp_path, tenant_cas):
    server = TLSServer(tmp_path, tenant_cas["one"], san="api.one.example")
    try:
        ok, result, error = check(host="127.0.0.1", port=server.port, ca_data=ca_data(tenant_cas["one"][0]))
        assert not ok and error == "TLS certificate does not name 127.0.0.1" and result["kind"] == "tls-name"
    finally:
        server.close()


def test_a_closed_port_is_refused_and_a_silent_server_times_out_within_the_timeout(tmp_path, tenant_cas):
    port = closed_port()
    ok, result, error = check(host="127.0.0.1", port=port, ca_data=ca_data(tenant_cas["one"][0]))
    assert (ok, error, result["kind"]) == (False, "connection refused", "refused")

    server = TLSServer(tmp_path, tenant_cas["one"], silent=True)
    try:
        started = time.monotonic()
        ok, result, error = check(host="127.0.0.1", port=server.port, ca_data=ca_data(tenant_cas["one"][0]),
                                  timeout_s=0.5)
        assert time.monotonic() - started < 2
        assert (ok, error) == (False, "TLS handshake timed out after 0.5s")
    finally:
        server.close()


def test_a_name_that_does_not_resolve_and_bad_arguments_are_said_so():
    ok, result, error = check(host="tenant-api.does-not-exist.invalid", port=443)
    assert not ok and error == "DNS: tenant-api.does-not-exist.invalid does not resolve" and result["kind"] == "dns"
    ok, _, error = check(host="127.0.0.1", port="https")
    assert not ok and error == "check_endpoint: port and timeout_s must be numbers"
    ok, _, error = check(host="127.0.0.1", port=443, ca_data="not base64!")
    assert not ok and error == "the CA is not base64 PEM"


def test_a_plain_http_api_is_checked_for_tcp_only():
    with socket.create_server(("127.0.0.1", 0)) as listening:
        ok, result, error = check(host="127.0.0.1", port=listening.getsockname()[1], tls=False)
    assert ok, error
    assert result["tls"] is False


# --- in the lab: the provision flow stops at check_tenant_api, the host is not blamed, fixing the VIP works ---

def _checks(message_start: str):
    from events.models import Event

    return Event.objects.filter(kind="step", step="check_tenant_api", message__startswith=message_start)


@pytest.mark.django_db(transaction=True)
def test_a_wrong_vip_stops_the_claim_at_the_check_and_fixing_it_lets_the_claim_become_available(
        lab_factory, celery_worker_process, apply, tmp_path, tenant_cas, client, django_user_model):
    from claims.choices import ClaimPhase
    from claims.models import NodeClaim
    from conftest import wait_for
    from events.models import Event
    from hosts.models import BareMetalHost
    from hosts.selectors import host_recent_failures
    from pools.models import Tenant
    from tests.lab_conftest import gpu_pool, lab_report, wait_hosts

    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"], agent_mode="thread")
    wait_hosts("available", 1)
    port = closed_port()
    lab_tenant_api(site, "one", endpoint=f"127.0.0.1:{port}")  # the VIP: nothing listens there
    started = time.monotonic()
    apply(gpu_pool(1), tenant="one")

    failed = wait_for(lambda: _checks("failed: ").first(), timeout=60)
    assert time.monotonic() - started < 30, lab_report()
    expected = f"tenant API 127.0.0.1:{port} not reachable from the server network (connection refused)"
    assert failed.message == f"failed: {expected}"
    wait_hosts("available", 1, timeout=120)  # through the failure path, back in the pool
    claim = NodeClaim.objects.get()
    assert (claim.phase, claim.reason, claim.host_id, claim.failed_hosts) == (
        ClaimPhase.PENDING, "TenantAPIUnreachable", None, []), lab_report()
    assert claim.message.startswith(f"{expected}, checked from gpu-01; waiting for the tenant's API endpoint or CA")
    host = BareMetalHost.objects.get()
    # Nothing was written, the host is not blamed: no image step, no error or repair, no failure counted.
    assert not Event.objects.filter(step__in=["write_image", "write_seed"]).exists(), lab_report()
    assert not Event.objects.filter(object_type="host", to_state__in=["error", "repair"]).exists()
    moved = Event.objects.get(kind="transition", host=host, step="check_tenant_api")
    assert (moved.to_state, moved.data["fault"]) == ("deprovisioning", "claim")
    assert host_recent_failures(host=host) == []
    # The claim waits: the next allocations (every 5 s here) do not send the host round again.
    time.sleep(7)
    assert NodeClaim.objects.get().phase == ClaimPhase.PENDING and _checks("failed: ").count() == 1, lab_report()
    assert BareMetalHost.objects.get().state == "available"

    # The tenant page and the API show both sides; neither shows a credential.
    admin = django_user_model.objects.create_user("root-admin", is_staff=True, is_superuser=True)
    client.force_login(admin)
    page = client.get("/tenants/one/").content.decode()
    assert 'data-api-server="failed"' in page and expected in page
    console = client.get("/tenants/one/api-check/").content.decode()
    assert 'data-api-console="no"' in console and "connection refused" in console
    tenant = Tenant.objects.get(name="one")
    answer = client.get(f"/api/v1/tenants/{tenant.pk}/").json()
    assert answer["api_check"]["server"]["ok"] is False and answer["api_check"]["server"]["message"] == expected
    assert answer["api_check"]["console"] == {"ok": False, "endpoint": f"127.0.0.1:{port}", "tls": False,
                                              "reason": "connection refused", "at": answer["api_check"]["console"]["at"]}
    assert site.tenants["one"].token not in page + console + str(answer)

    # Another tenant's CA on a TLS VIP: the same stop, with the TLS reason.
    server = TLSServer(tmp_path, tenant_cas["one"])
    try:
        lab_tenant_api(site, "one", endpoint=f"127.0.0.1:{server.port}", server=f"https://127.0.0.1:{server.port}",
                        ca=ca_data(tenant_cas["two"][0]))
        wait_for(lambda: _checks("failed: ").count() == 2, timeout=60)
        tls_failure = _checks("failed: ").order_by("-id").first()
        assert tls_failure.message == (f"failed: tenant API 127.0.0.1:{server.port} not reachable from the server "
                                       f"network (TLS certificate not signed by the tenant's CA)")
        wait_hosts("available", 1, timeout=120)
    finally:
        server.close()

    # The VIP fixed through the API: the claim is allocated again and goes all the way.
    fixed = client.patch(f"/api/v1/tenants/{tenant.pk}/", {"api_endpoint": site.tenants["one"].endpoint,
                                                            "kubeconfig": site.tenants["one"].kubeconfig()},
                         content_type="application/json")
    assert fixed.status_code == 200, fixed.content
    wait_for(lambda: NodeClaim.objects.get().phase == ClaimPhase.AVAILABLE, timeout=180)
    assert _checks("done").count() == 1 and Event.objects.filter(step="write_image", message="done").exists()
    assert not Event.objects.filter(object_type="host", to_state__in=["error", "repair"]).exists()
    page = client.get("/tenants/one/").content.decode()
    assert 'data-api-server="ok"' in page
    assert 'data-api-console="yes"' in client.get("/tenants/one/api-check/").content.decode()
