"""The console's tenant API client against real lab tenant APIs: join tokens, Ready, labels and taints, drain."""
import base64
import datetime
import re
import shutil
import subprocess
import threading
import time

import pytest
import yaml
from kubernetes import client, config

from claims.tenant_api import TenantAPI, TenantAPIError, join_command
from lab.kube import KubeletJoinError, TenantAPIServer, kubelet_join, parse_join_command


@pytest.fixture
def tenant():
    with TenantAPIServer("acme") as server:
        yield server


@pytest.fixture
def other_tenant():
    with TenantAPIServer("globex") as server:
        yield server


@pytest.fixture
def console(tenant):
    return TenantAPI(tenant.kubeconfig(), timeout=5)


@pytest.fixture
def kubectl(tenant):
    """The tenant's own kubectl, to look at and prepare objects independently of the code under test."""
    api = config.new_client_from_config_dict(yaml.safe_load(tenant.kubeconfig()), persist_config=False)
    yield client.CoreV1Api(api)
    api.close()


def decoded(secret) -> dict:
    return {k: base64.b64decode(v).decode() for k, v in secret.data.items()}


def joined(tenant, console, name="gpu-node-1", labels=None, ready=True) -> dict:
    token = console.create_bootstrap_token()
    return kubelet_join(tenant.endpoint, token.token, name, labels or {}, ready=ready)


def ready_status(node) -> str:
    return next(c.status for c in node.status.conditions if c.type == "Ready")


# -- bootstrap tokens and join commands


def test_bootstrap_token_is_a_kube_system_secret_of_the_bootstrap_shape(console, kubectl):
    before = datetime.datetime.now(datetime.UTC)
    token = console.create_bootstrap_token(ttl_s=1800, description="vmetal join claim-7")

    assert re.fullmatch(r"[a-z0-9]{6}", token.id) and re.fullmatch(r"[a-z0-9]{16}", token.secret)
    assert token.token == f"{token.id}.{token.secret}"
    assert token.secret not in repr(token) and token.secret not in str(token)
    secret = kubectl.read_namespaced_secret(f"bootstrap-token-{token.id}", "kube-system")
    assert secret.type == "bootstrap.kubernetes.io/token"
    data = decoded(secret)
    assert data == {
        "token-id": token.id,
        "token-secret": token.secret,
        "expiration": token.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "usage-bootstrap-authentication": "true",
        "usage-bootstrap-signing": "true",
        "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
        "description": "vmetal join claim-7",
    }
    expires = datetime.datetime.fromisoformat(data["expiration"].replace("Z", "+00:00"))
    assert datetime.timedelta(seconds=1798) <= expires - before <= datetime.timedelta(seconds=1802)


def test_deleting_a_bootstrap_token_removes_its_secret_and_is_idempotent(console, kubectl):
    token = console.create_bootstrap_token()

    assert console.delete_bootstrap_token(token.id) is True
    assert console.delete_bootstrap_token(token.token) is False
    assert not [s for s in kubectl.list_namespaced_secret("kube-system").items if s.metadata.name.endswith(token.id)]


def test_join_commands_for_vcluster_and_kubeadm():
    token = "abcdef.0123456789abcdef"
    digest = "a" * 64

    assert join_command("vcluster", "https://10.0.0.5:8443", token) == (
        'curl -fsSL "https://10.0.0.5:8443/node/join?token=abcdef.0123456789abcdef" | sh -')
    assert join_command("kubeadm", "10.0.0.5:6443", token, f"sha256:{digest}") == (
        f"kubeadm join 10.0.0.5:6443 --token {token} --discovery-token-ca-cert-hash sha256:{digest}")
    with pytest.raises(ValueError, match="pins the tenant API's CA"):  # tests/test_join_command.py
        join_command("kubeadm", "10.0.0.5:6443", token)
    assert TenantAPI.join_command is join_command
    assert parse_join_command(join_command("vcluster", "127.0.0.1:4000", token)) == ("127.0.0.1:4000", token)
    assert parse_join_command(join_command("kubeadm", "127.0.0.1:4000", token, digest)) == ("127.0.0.1:4000", token)


@pytest.mark.parametrize("args", [
    ("vcluster", "10.0.0.5; rm -rf /", "abcdef.0123456789abcdef"),
    ("vcluster", "10.0.0.5", "abcdef.0123456789abcdef$(id)"),
    ("kubeadm", "10.0.0.5", "abcdef.0123456789abcdef", "sha256:nothex"),
    ("ssh", "10.0.0.5", "abcdef.0123456789abcdef"),
])
def test_join_command_refuses_anything_that_is_not_an_endpoint_a_token_or_a_hash(args):
    with pytest.raises(ValueError):
        join_command(*args)


def test_ca_cert_hash_is_the_sha256_of_the_ca_public_key_as_kubeadm_computes_it(tmp_path, console):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    kubeconfig = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": "https://10.0.0.5:6443",
                                               "certificate-authority-data": base64.b64encode(pem).decode()}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "x"}}]})

    digest = TenantAPI(kubeconfig).ca_cert_hash()

    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    if shutil.which("openssl"):  # the recipe in kubeadm's documentation
        (tmp_path / "ca.crt").write_bytes(pem)
        expected = subprocess.run(
            "openssl x509 -pubkey -in ca.crt | openssl pkey -pubin -outform der | openssl dgst -sha256 -hex",
            shell=True, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()[-1]
        assert digest == expected
    assert console.ca_cert_hash() is None  # the lab's API is plain HTTP: no CA to pin


# -- joining and Ready


def test_a_kubelet_joining_with_the_token_makes_a_ready_node_that_the_watch_sees(tenant, console):
    token = console.create_bootstrap_token()
    errors = []

    def boot():
        try:
            kubelet_join(tenant.endpoint, token.token, "gpu-node-1", {"vcluster.com/node-type": "gpu-server"})
        except Exception as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    joiner = threading.Timer(0.5, boot)
    started = time.monotonic()
    joiner.start()
    node = console.wait_node_ready("gpu-node-1", deadline_s=20)
    elapsed = time.monotonic() - started
    joiner.join()

    assert not errors
    assert node["metadata"]["name"] == "gpu-node-1"
    assert node["metadata"]["labels"]["vcluster.com/node-type"] == "gpu-server"
    assert {"type": "Ready", "status": "True"}.items() <= node["status"]["conditions"][0].items()
    assert 0.5 <= elapsed < 5  # woken by the watch, not by a 20 s timeout and a re-list
    watches = tenant.call(lambda emu: [r.params for r in emu._requests if r.action == "WATCH"])
    assert {"fieldSelector": "metadata.name=gpu-node-1"}.items() <= watches[0].items()


def test_wait_node_ready_returns_at_once_for_a_node_that_is_already_ready(tenant, console):
    joined(tenant, console)
    started = time.monotonic()

    assert console.wait_node_ready("gpu-node-1", deadline_s=10)["metadata"]["name"] == "gpu-node-1"
    assert time.monotonic() - started < 1
    assert console.node_exists("gpu-node-1") and not console.node_exists("gpu-node-2")


def test_wait_node_ready_gives_up_at_its_deadline_with_a_clear_error(tenant, console):
    joined(tenant, console, "not-ready-node", ready=False)  # registered, but NotReady
    started = time.monotonic()

    with pytest.raises(TenantAPIError, match=r"^node ghost-node not Ready within 1.5s$"):
        console.wait_node_ready("ghost-node", deadline_s=1.5)
    assert 1.5 <= time.monotonic() - started < 3
    with pytest.raises(TenantAPIError, match="node not-ready-node not Ready within 1s"):
        console.wait_node_ready("not-ready-node", deadline_s=1)


def test_kubelet_stop_marks_the_node_not_ready(tenant, console, kubectl):
    joined(tenant, console)

    tenant.kubelet_stop("gpu-node-1")

    assert ready_status(kubectl.read_node("gpu-node-1")) == "Unknown"  # kubectl shows NotReady


@pytest.mark.parametrize("spoil, why", [
    (lambda token: f"{token.id}.{'x' * 16}", "token-id or token-secret does not match"),
    (lambda token: f"zzzzzz.{token.secret}", "no Secret kube-system/bootstrap-token-zzzzzz"),
    (lambda token: "not-a-token", "malformed bootstrap token"),
])
def test_a_wrong_bootstrap_token_is_refused_and_no_node_appears(tenant, console, kubectl, spoil, why):
    token = console.create_bootstrap_token()

    with pytest.raises(KubeletJoinError, match=why):
        kubelet_join(tenant.endpoint, spoil(token), "intruder", {})
    assert kubectl.list_node().items == []


def test_an_expired_or_deleted_or_non_authentication_token_is_refused(tenant, console, kubectl):
    token = console.create_bootstrap_token()
    name = f"bootstrap-token-{token.id}"
    past = base64.b64encode(b"2020-01-01T00:00:00Z").decode()
    kubectl.patch_namespaced_secret(name, "kube-system", {"data": {"expiration": past}})
    with pytest.raises(KubeletJoinError, match=r"tenant API refused the bootstrap token .*expired at 2020-01-01"):
        kubelet_join(tenant.endpoint, token.token, "late-node", {})

    other = console.create_bootstrap_token()
    no = base64.b64encode(b"false").decode()
    kubectl.patch_namespaced_secret(f"bootstrap-token-{other.id}", "kube-system",
                                  {"data": {"usage-bootstrap-authentication": no}})
    with pytest.raises(KubeletJoinError, match="not marked usage-bootstrap-authentication"):
        kubelet_join(tenant.endpoint, other.token, "late-node", {})

    third = console.create_bootstrap_token()
    console.delete_bootstrap_token(third.id)
    with pytest.raises(KubeletJoinError, match="no Secret"):
        kubelet_join(tenant.endpoint, third.token, "late-node", {})
    assert kubectl.list_node().items == []


def test_a_bootstrap_token_is_not_an_admin_credential(tenant, console):
    token = console.create_bootstrap_token()
    kubeconfig = tenant.kubeconfig().replace(tenant.token, token.token)

    with pytest.raises(TenantAPIError, match=r"tenant API forbade .* \(403\)"):
        TenantAPI(kubeconfig).create_bootstrap_token()


# -- labels, taints, cordon, drain, delete


def test_labels_and_taints_are_set_and_later_replaced_without_touching_anyone_elses(tenant, console, kubectl):
    joined(tenant, console)
    kubectl.patch_node("gpu-node-1", {"metadata": {"labels": {"team": "ml"}},
                                    "spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}},
                     _content_type="application/merge-patch+json")

    console.set_node_labels_and_taints("gpu-node-1", {"pool": "gpu-a", "vcluster.com/node-type": "gpu-server"},
                                       [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    node = kubectl.read_node("gpu-node-1")
    assert {"pool": "gpu-a", "vcluster.com/node-type": "gpu-server", "team": "ml"}.items() <= node.metadata.labels.items()
    assert sorted((t.key, t.value, t.effect) for t in node.spec.taints) == [
        ("maintenance", None, "NoSchedule"), ("nvidia.com/gpu", "present", "NoSchedule")]

    console.set_node_labels_and_taints("gpu-node-1", {"pool": "gpu-b"}, [{"key": "dedicated", "effect": "NoExecute"}])
    node = kubectl.read_node("gpu-node-1")
    assert node.metadata.labels["pool"] == "gpu-b" and node.metadata.labels["team"] == "ml"
    assert "vcluster.com/node-type" not in node.metadata.labels
    assert sorted((t.key, t.effect) for t in node.spec.taints) == [("dedicated", "NoExecute"),
                                                                    ("maintenance", "NoSchedule")]


def test_cordon_and_drain_passes_evict_the_workload_pods_then_delete_node_removes_the_node(tenant, console, kubectl):
    joined(tenant, console)
    tenant.refuse_evictions(2)  # a PodDisruptionBudget says no twice, then yes

    console.cordon("gpu-node-1")
    first = console.drain("gpu-node-1", grace_period_s=5)
    assert sorted(first["refused"]) == ["default/notebook-gpu-node-1", "default/trainer-gpu-node-1"]
    assert "disruption budget" in first["refused"]["default/trainer-gpu-node-1"]
    evicted, passes = set(first["evicting"]), 1
    while (found := console.drain("gpu-node-1", grace_period_s=5))["left"]:  # the caller passes again later
        evicted |= set(found["evicting"])
        passes += 1
        assert passes < 50, found
        time.sleep(0.1)

    assert kubectl.read_node("gpu-node-1").spec.unschedulable is True
    assert sorted(evicted) == ["default/notebook-gpu-node-1", "default/trainer-gpu-node-1"]
    left = kubectl.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-1").items
    assert [(p.metadata.namespace, p.metadata.name) for p in left] == [("kube-system", "kube-proxy-gpu-node-1")]

    assert console.delete_node("gpu-node-1") is True
    assert not console.node_exists("gpu-node-1")
    assert console.delete_node("gpu-node-1") is False
    assert kubectl.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-1").items == []


def test_a_drain_pass_that_a_disruption_budget_refuses_returns_at_once_with_the_refusal(tenant, console, kubectl):
    joined(tenant, console)
    tenant.refuse_evictions(10_000)
    started = time.monotonic()

    found = console.drain("gpu-node-1")

    assert time.monotonic() - started < 2
    assert found["left"] == ["default/notebook-gpu-node-1", "default/trainer-gpu-node-1"] and found["evicting"] == []
    assert all("violate the pod's disruption budget" in why for why in found["refused"].values())
    assert len(kubectl.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-1").items) == 3


def test_list_unschedulable_pods_finds_only_pods_the_scheduler_could_not_place(console, kubectl):
    def pending(name, reason, phase="Pending", status="False"):
        gates = [{"name": "example.com/quota"}] if reason == "SchedulingGated" else None  # the lab's scheduler waits
        kubectl.create_namespaced_pod("default", {
            "metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}],
                                                 "schedulingGates": gates},
            "status": {"phase": phase, "conditions": [{"type": "PodScheduled", "status": status, "reason": reason}]}})

    pending("needs-a-gpu", "Unschedulable")
    pending("gated", "SchedulingGated")
    pending("running", None, phase="Running", status="True")

    assert [p["metadata"]["name"] for p in console.list_unschedulable_pods()] == ["needs-a-gpu"]


# -- isolation and failures


def test_two_tenants_are_isolated(tenant, other_tenant, console):
    other = TenantAPI(other_tenant.kubeconfig(), timeout=5)
    joined(tenant, console, "acme-node")

    assert console.node_exists("acme-node")
    assert not other.node_exists("acme-node")
    with pytest.raises(KubeletJoinError, match="refused the bootstrap token"):
        kubelet_join(other_tenant.endpoint, console.create_bootstrap_token().token, "acme-node-2", {})
    with pytest.raises(TenantAPIError, match=r"rejected credentials \(401\)"):
        TenantAPI(tenant.kubeconfig().replace(tenant.token, other_tenant.token)).node_exists("acme-node")


def test_a_stopped_tenant_api_is_reported_unreachable():
    server = TenantAPIServer("gone").start()
    console = TenantAPI(server.kubeconfig(), timeout=2)
    server.stop()

    with pytest.raises(TenantAPIError, match=rf"^tenant API unreachable: http://{server.endpoint}"):
        console.create_bootstrap_token()
    with pytest.raises(TenantAPIError, match="tenant API unreachable"):
        console.wait_node_ready("gpu-node-1", deadline_s=5)


def test_a_broken_kubeconfig_is_refused_without_echoing_it():
    with pytest.raises(TenantAPIError, match="not valid YAML") as excinfo:
        TenantAPI("token: s3cr3t: [")
    assert "s3cr3t" not in str(excinfo.value)
    with pytest.raises(TenantAPIError, match="no clusters"):
        TenantAPI("users: []")


# -- the lab API behaves like an API server where the console relies on it


def test_the_lab_api_keeps_the_api_server_behaviour_the_console_relies_on(tenant, kubectl):
    assert [n.metadata.name for n in kubectl.list_namespace().items] == [
        "default", "kube-system", "kube-public", "kube-node-lease"]
    secret = kubectl.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    assert secret.data == {"k": "dg=="} and secret.metadata.uid and secret.metadata.resource_version
    stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
    with pytest.raises(client.ApiException) as excinfo:
        kubectl.patch_namespaced_secret("s", "default", stale, _content_type="application/merge-patch+json")
    assert excinfo.value.status == 409
    with client.ApiClient(client.Configuration(host=tenant.url)) as anonymous:
        with pytest.raises(client.ApiException) as excinfo:
            client.CoreV1Api(anonymous).list_node()
    assert excinfo.value.status == 401
