"""The join command never turns certificate checking off: a vCluster join hands curl the tenant API's CA, a kubeadm
join pins the CA's hash, and a tenant with no CA gets plain `curl -fsSL` (never -k) with a note, or no kubeadm join
at all. The command runs as written: real curl against a local TLS server, with the right CA and a wrong one."""
import base64
import datetime
import ipaddress
import re
import ssl
import subprocess
import threading
from html import unescape
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from claims import tenant_api
from claims.tenant_api import TenantAPI, join_command
from events.models import Event
from lab.kube import parse_join_command
from pools.models import Tenant

TOKEN = "abcdef.0123456789abcdef"


def _cert(subject: str, key, issuer_name=None, issuer_key=None, *, ca: bool, ip: str | None = None):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                                        critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _ca(name: str = "kubernetes"):
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _cert(name, key, ca=True)


def kubeconfig(server: str, ca_pem: bytes | None = None) -> str:
    cluster = {"server": server}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                           "clusters": [{"name": "t", "cluster": cluster}],
                           "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
                           "users": [{"name": "u", "user": {"token": "x"}}]})


@pytest.fixture(scope="module")
def tls_tenant(tmp_path_factory):
    """A local HTTPS server, as the tenant API's join endpoint, with a certificate its own CA signed; yields
    (endpoint, the CA's PEM)."""
    ca_key, ca = _ca()
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _cert("tenant-api", key, ca.subject, ca_key, ca=False, ip="127.0.0.1")
    folder = tmp_path_factory.mktemp("tls")
    (folder / "server.pem").write_bytes(_pem(cert) + _pem(ca))
    (folder / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))

    class Join(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = b"echo joined-with-$(echo " + self.path.split("token=")[-1].encode() + b")\n"
            self.send_response(200 if self.path.startswith("/node/join?token=") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Join)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", _pem(ca)
    server.shutdown()


def run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=30)


# --- the command's text ------------------------------------------------------------------------------------

def test_a_vcluster_join_gives_curl_the_tenant_apis_ca_and_never_turns_checking_off():
    _, ca = _ca()
    data = base64.b64encode(_pem(ca)).decode()
    command, note = TenantAPI(kubeconfig("https://10.0.0.5:8443", _pem(ca))).join("vcluster", "10.0.0.5:8443", TOKEN)
    assert command == (f'echo {data} | base64 -d | curl -fsSL --cacert /dev/stdin '
                       f'"https://10.0.0.5:8443/node/join?token={TOKEN}" | sh -')
    assert "against its CA" in note
    assert parse_join_command(command) == ("10.0.0.5:8443", TOKEN)  # the lab's servers still read it
    # No CA in the kubeconfig: the machine's trusted CAs; a plain HTTP API: said so. Never -k.
    command, note = TenantAPI(kubeconfig("https://10.0.0.5:8443")).join("vcluster", "10.0.0.5:8443", TOKEN)
    assert command == f'curl -fsSL "https://10.0.0.5:8443/node/join?token={TOKEN}" | sh -'
    assert "trusted CAs" in note
    command, note = TenantAPI(kubeconfig("http://127.0.0.1:4000")).join("vcluster", "127.0.0.1:4000", TOKEN)
    assert command == f'curl -fsSL "http://127.0.0.1:4000/node/join?token={TOKEN}" | sh -'
    assert "plain HTTP (no TLS)" in note
    for mode in ("vcluster", "kubeadm"):
        for config in (kubeconfig("https://10.0.0.5:8443", _pem(ca)), kubeconfig("https://10.0.0.5:8443")):
            try:
                assert not re.search(r"\s-\w*k\b|--insecure|unsafe-skip", TenantAPI(config).join(mode, "e:1", TOKEN)[0])
            except ValueError:
                pass


def test_a_kubeadm_join_pins_the_ca_hash_and_is_refused_without_a_ca():
    _, ca = _ca()
    api = TenantAPI(kubeconfig("https://10.0.0.5:6443", _pem(ca)))
    command, _ = api.join("kubeadm", "10.0.0.5:6443", TOKEN)
    assert command == f"kubeadm join 10.0.0.5:6443 --token {TOKEN} --discovery-token-ca-cert-hash sha256:" \
                      f"{api.ca_cert_hash()}"
    assert api.join_refusal("kubeadm") == ""
    for server in ("https://10.0.0.5:6443", "http://127.0.0.1:4000"):
        api = TenantAPI(kubeconfig(server))
        assert "add its certificate-authority-data, or use join mode vcluster" in api.join_refusal("kubeadm")
        with pytest.raises(ValueError, match="pins the tenant API's CA"):
            api.join("kubeadm", "10.0.0.5:6443", TOKEN)
    with pytest.raises(ValueError, match="pins the tenant API's CA"):
        join_command("kubeadm", "10.0.0.5:6443", TOKEN)
    with pytest.raises(ValueError, match="base64"):
        join_command("vcluster", "10.0.0.5:6443", TOKEN, ca_data="abc; id")


# --- the command, run -------------------------------------------------------------------------------------

def test_the_command_joins_with_the_right_ca_and_fails_with_a_wrong_one(tls_tenant):
    endpoint, ca = tls_tenant
    command, _ = TenantAPI(kubeconfig(f"https://{endpoint}", ca)).join("vcluster", endpoint, TOKEN)
    done = run(command)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"joined-with-{TOKEN}"
    _, stranger = _ca("another-cluster")  # a server that is not the tenant's: its certificate does not chain to the pinned CA
    command, _ = TenantAPI(kubeconfig(f"https://{endpoint}", _pem(stranger))).join("vcluster", endpoint, TOKEN)
    refused = run(command)
    assert refused.returncode != 0 and refused.stdout == ""
    assert "certificate" in refused.stderr.lower()
    # Without the CA, curl checks the machine's trusted CAs, which do not include this one.
    command, _ = TenantAPI(kubeconfig(f"https://{endpoint}")).join("vcluster", endpoint, TOKEN)
    assert run(command).returncode != 0


# --- the console's "Join Node…" -------------------------------------------------------------------------------

@pytest.fixture
def member(db):
    tenant = Tenant.objects.create(name="acme")
    user = User.objects.create_user("alice", "alice@example.invalid", "pw-join-7d21")
    tenant.memberships.create(user=user)
    client = Client()
    client.force_login(user)
    return client, tenant


@pytest.fixture
def tokens(monkeypatch):
    made = []

    def fake_token(self, ttl_s=3600, description=""):
        made.append(description)
        return tenant_api.BootstrapToken(id="abcdef", secret="0123456789abcdef",
                                         expires_at=datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC))

    monkeypatch.setattr(tenant_api.TenantAPI, "create_bootstrap_token", fake_token)
    return made


def test_join_node_shows_the_pinned_command_a_note_and_a_copy_button(member, tokens):
    client, tenant = member
    _, ca = _ca()
    tenant.kubeconfig = kubeconfig("https://10.0.0.5:443", _pem(ca))
    tenant.save(update_fields=["kubeconfig"])
    html = unescape(client.post(reverse("tenant-join", args=["acme"]), HTTP_HX_REQUEST="true").content.decode())
    assert f'--cacert /dev/stdin "https://10.0.0.5:443/node/join?token={TOKEN}" | sh -' in html
    assert "curl -fsSLk" not in html and 'id="join-note"' in html
    assert 'data-copy-target="join-command-text"' in html
    page = client.get(reverse("tenant", args=["acme"]))
    assert "console/copy.js" in page.content.decode()
    from django.contrib.staticfiles import finders

    assert "data-copy-target" in open(finders.find("console/copy.js")).read()
    assert tokens == ["manual join by alice"]


def test_a_kubeadm_join_without_a_ca_is_refused_before_any_token_is_made(member, tokens):
    client, tenant = member
    tenant.kubeconfig = kubeconfig("http://127.0.0.1:4000")
    tenant.join_mode = "kubeadm"
    tenant.save(update_fields=["kubeconfig", "join_mode"])
    response = client.post(reverse("tenant-join", args=["acme"]), HTTP_HX_REQUEST="true")
    html = unescape(response.content.decode())
    assert 'id="join-error"' in html and "add its certificate-authority-data, or use join mode vcluster" in html
    assert 'id="join-command-text"' not in html and tokens == []
    assert not Event.objects.filter(object_type="tenant", kind="action").exists()
