"""The tenant API's VIP, checked from the server's side before the image is written (issue 14, point 1 c): the
agent's `check_endpoint` really connects (TCP, then TLS with the tenant's CA); in the lab a wrong VIP or a wrong
CA stops the provision flow at `check_tenant_api` with the reason, the host goes back to the pool cleaned and
unblamed, the claim waits with the message, and fixing the VIP lets it become Available. The tenant page and the
API show both sides' checks, never a credential."""
import base64
import datetime
import socket
import ssl
import threading
import time

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.commands import Context, execute
from agent.hardware import Hardware

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


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


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
