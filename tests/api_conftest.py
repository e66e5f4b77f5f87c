"""Fixtures of the API tests, loaded with `pytest_plugins = ["tests.api_conftest"]`.

`no_secrets_leak` checks every response that django.test.Client (and DRF's APIClient, a subclass) returns,
and every log record, for secrets: the BMC usernames and passwords stored in the database (decrypted),
tenant kubeconfigs (and the credentials inside them), API token keys (the database has only their hashes:
those made with `issue_token` or returned by the token endpoint), agent tokens handed out by
/agent/lookup, bootstrap tokens queued for agents and the key that signs erase certificates. The only
exceptions are the places whose job is to hand a secret to its owner: the token endpoint's creation response
(the new key, shown once), /agent/lookup (the agent's own token) and /agent/heartbeat (a command's join token,
for the agent).

It is autouse for tests/test_api*.py. For the whole suite, in the root conftest.py:

    pytest_plugins = ["tests.api_conftest"]

    @pytest.fixture(autouse=True)
    def _secrets_never_leave(no_secrets_leak):
        pass
"""
import html
import io
import json
import logging
import re
import secrets as random_secrets

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import transaction
from django.test import client as django_client
from rest_framework.test import APIClient

MIN_SECRET_LENGTH = 6  # shorter values ("admin", "root") are ordinary words: a substring check means nothing
KUBECONFIG_SECRET = re.compile(r"(?:token|client-key-data|client-certificate-data|password)\s*:\s*[\"']?([^\s\"']+)")
TOKEN_PATHS = ("/api/v1/tokens", "/api/v1/tokens/")
ISSUED_KEYS: set[str] = set()  # API token keys seen in plain text: the database holds only hashes


class SecretLeak(AssertionError):
    pass


class _Watch:
    def __init__(self):
        self.known: set[str] = set()  # every secret seen so far in this test (for the log check at the end)
        self.agent_tokens: set[str] = set()
        self.records: list[logging.LogRecord] = []
        self.checked = 0

    # -- what is secret now
    def current(self, path: str) -> set[str]:
        from hosts import certificates
        from hosts.models import BareMetalHost, HostCommand
        from pools.models import Tenant

        found = set()
        for username, password in BareMetalHost.objects.values_list("bmc_username", "bmc_password"):
            found.update((username or "", password or ""))
        for kubeconfig in Tenant.objects.values_list("kubeconfig", flat=True):
            if kubeconfig:
                found.add(kubeconfig)
                found.update(KUBECONFIG_SECRET.findall(kubeconfig))
        found.update(ISSUED_KEYS)
        found.update((settings.CERTIFICATE_SIGNING_KEY, certificates.signing_key().hex()))
        if not path.startswith("/agent/"):
            found.update(self.agent_tokens)
            for text in HostCommand.objects.exclude(secret_args="").values_list("secret_args", flat=True):
                found.update(_strings(json.loads(text)))
        return {s for s in found if len(s) >= MIN_SECRET_LENGTH}

    def check(self, method: str, path: str, response) -> None:
        """A django.test.Client response."""
        headers = "\n".join(f"{k}: {v}" for k, v in response.items())
        self.check_text(method, path, response.status_code, _text(response) + "\n" + headers,
                        getattr(response, "data", None))

    def check_text(self, method: str, path: str, status: int, text: str, data=None, secrets=None) -> None:
        """Any response, as its status and its text (body and headers). `secrets`: check for these instead of
        what the database holds now (a fuzzer sets credentials that are ordinary words)."""
        self.checked += 1
        allowed = set()
        if method == "POST" and path.rstrip("/") == TOKEN_PATHS[0] and status == 201:
            allowed.add(data["token"] if isinstance(data, dict) else json.loads(text.split("\n", 1)[0])["token"])
            ISSUED_KEYS.update(allowed)
        if path.startswith("/agent/lookup") and status == 200:
            match = re.search(r'"token":\s*"([^"]+)"', text)
            if match:
                self.agent_tokens.add(match.group(1))
                allowed.add(match.group(1))
        secrets = self.current(path) if secrets is None else secrets
        self.known |= secrets
        for secret in secrets - allowed:
            for form in _forms(secret):
                if form in text:
                    raise SecretLeak(f"{method} {path} → {status}: the response contains a secret "
                                     f"({secret[:3]}…, {len(secret)} characters)")
        self.check_logs()

    def check_logs(self) -> None:
        for record in self.records:
            text = _record_text(record)
            for secret in self.known:
                if secret in text:
                    raise SecretLeak(f"a log line of {record.name} contains a secret ({secret[:3]}…): "
                                     f"{record.levelname} {record.getMessage()[:80]}")


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _forms(secret: str) -> set[str]:
    """The secret as it would appear in a page or a JSON document."""
    return {secret, html.escape(secret), json.dumps(secret)[1:-1]}


def _text(response) -> str:
    if getattr(response, "streaming", False):
        return ""
    return response.content.decode("utf-8", errors="replace")


def _record_text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        text += "\n" + repr(record.exc_info[1])
    return text


class _Recorder(logging.Handler):
    def __init__(self, watch: _Watch):
        super().__init__(level=logging.DEBUG)
        self.watch = watch

    def emit(self, record):
        self.watch.records.append(record)


@pytest.fixture
def no_secrets_leak(monkeypatch):
    """Fails the test when a response or a log line carries a secret (see the module's docstring)."""
    watch = _Watch()
    original = django_client.Client.request

    def request(self, **request):
        response = original(self, **request)
        watch.check(request.get("REQUEST_METHOD", "GET"), request.get("PATH_INFO", ""), response)
        return response

    monkeypatch.setattr(django_client.Client, "request", request)
    recorder = _Recorder(watch)
    logging.getLogger().addHandler(recorder)
    try:
        yield watch
    finally:
        logging.getLogger().removeHandler(recorder)
    watch.check_logs()
    ISSUED_KEYS.clear()


def issue_token(user) -> str:
    """A new API token for `user` (through the service, as the API makes them); its key, known to the check."""
    from pools.api.services import token_create

    _, key = token_create(user=user, actor="system:test")
    ISSUED_KEYS.add(key)
    return key


@pytest.fixture(autouse=True)
def _api_secret_check(request):
    if request.node.module.__name__.rsplit(".", 1)[-1].startswith("test_api"):
        request.getfixturevalue("no_secrets_leak")


# --- a site with two tenants and people in every role ----------------------------------------------

ALPHA_POOLS = """
privateNodes:
  autoNodes:
    - provider: metal3
      static:
        - name: gpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
"""
BRAVO_POOLS = ALPHA_POOLS.replace("gpu-server", "cpu-server").replace("name: gpu", "name: cpu")
KUBECONFIG = ("apiVersion: v1\nkind: Config\nusers:\n- name: {name}\n  user:\n    token: kc-{name}-{secret}\n")
ROLES = ("admin", "member_a", "member_b", "auditor", "anonymous")
USERNAMES = {"admin": "ada-admin", "member_a": "alice-alpha", "member_b": "bob-bravo", "auditor": "audrey-auditor"}


class World:
    """Tenants alpha and bravo, each with a static pool and its claim on a host; shared configuration and
    spare objects nothing depends on; a user with a token in each role."""

    def __init__(self):
        from claims.models import NodeClaim
        from hosts.models import BareMetalHost
        from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant, TenantMembership

        for host in BareMetalHost.objects.all():
            BareMetalHost.objects.filter(pk=host.pk).update(
                bmc_username=f"bmcuser-{host.name}-{random_secrets.token_hex(3)}",
                bmc_password=f"bmcpass-{random_secrets.token_urlsafe(12)}")
        for name in ("alpha", "bravo"):
            Tenant.objects.filter(name=name).update(
                kubeconfig=KUBECONFIG.format(name=name, secret=random_secrets.token_hex(8)))
        self.alpha = Tenant.objects.get(name="alpha")
        self.bravo = Tenant.objects.get(name="bravo")
        self.pool_a = NodePool.objects.get(tenant=self.alpha)
        self.pool_b = NodePool.objects.get(tenant=self.bravo)
        self.claim_a = NodeClaim.objects.get(tenant=self.alpha)
        self.claim_b = NodeClaim.objects.get(tenant=self.bravo)
        assert self.claim_a.host_id and self.claim_b.host_id, "the world's claims have hosts"
        self.host_a = self.claim_a.host
        self.host_b = self.claim_b.host
        self.provider = NodeProvider.objects.get(name="metal3")
        self.spare_provider = NodeProvider.objects.create(name="spare")
        self.spare_type = NodeType.objects.create(name="spare-type", provider=self.provider,
                                                  host_selector={"matchLabels": {"role": "spare"}})
        self.spare_env = NodeEnvironment.objects.create(name="spare-env", namespace="p-default")
        self.bravo_env = NodeEnvironment.objects.create(name="bravo-net", namespace="p-default", tenant=self.bravo)
        self.spare_image = OSImage.objects.create(name="spare-image", url="http://127.0.0.1/spare.raw",
                                                  checksum="ab" * 32, checksum_type="sha256")
        self.users, self.tokens = {}, {}
        for role, username in USERNAMES.items():
            user = User.objects.create_user(username, password=None,  # unusable: they use tokens
                                            is_staff=role == "admin", is_superuser=role == "admin")
            self.users[role] = user
            self.tokens[role] = issue_token(user)
        self.users["auditor"].groups.add(Group.objects.get_or_create(name="auditors")[0])
        TenantMembership.objects.create(tenant=self.alpha, user=self.users["member_a"])
        TenantMembership.objects.create(tenant=self.bravo, user=self.users["member_b"])

    def client(self, role: str) -> APIClient:
        client = APIClient()
        if role != "anonymous":
            client.credentials(HTTP_AUTHORIZATION=f"Token {self.tokens[role]}")
        return client

    def actor(self, role: str) -> str:
        return f"user:{USERNAMES[role]}"


@pytest.fixture
def world(demo_site, apply) -> World:
    apply(ALPHA_POOLS, tenant="alpha")
    apply(BRAVO_POOLS, tenant="bravo")
    call_command("reconcile", stdout=io.StringIO())
    return World()


def gate_evidence(host, *, flow_id: str, tenant: str, verdict: str = "pass"):
    """One disk's erase certificate and a dcgmi health run of one gate run, as hosts.cleaning records them."""
    from hosts import cleaning

    gate = {"node_type": "gpu-server", "policy": {"method": "full", "fallback": "", "source": "NodeType gpu-server"}}
    disk = {"name": "nvme0n1", "ok": True, "serial": f"S-{flow_id}", "model": "SAMSUNG MZWLO3T8HCLS", "type": "nvme",
            "method": "full", "method_type": "Clear", "expectation": "zeros"}
    read_back = {"name": "nvme0n1", "expectation": "zeros", "mode": "sampled", "direct_io": True, "passed": True,
                 "canaries": {"planted": 64, "checked": 64, "survived": 0},
                 "samples": {"count": 586, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0}}
    cert = cleaning.issue_certificates(host=host, flow_id=flow_id, gate=gate,
                                       previous={"tenant": tenant, "claim": f"{tenant}-old" if tenant else ""},
                                       erase={"disks": [disk]}, verify={"disks": [read_back], "passed": True})[0]
    reasons = ["GPU Memory (GPU 3): Found 12 faulty memory elements on GPU 3"] if verdict == "fail" else []
    run = cleaning.record_health(host=host, flow_id=flow_id, suite="dcgmi", gate=gate,
                                 parsed={"verdict": verdict, "reasons": reasons, "gpus": {}},
                                 raw={"command": "dcgmi diag -r 2 -j", "exit_code": 0, "stdout": "{}"},
                                 thresholds={"dcgm_level": 2})
    return cert, run


@pytest.fixture
def evidence(world) -> World:
    """The world with the release gate's evidence: host_b, before bravo had it, erased after an alpha claim
    (alpha's proof); host_a erased after a bravo claim (bravo's); and a registration of host_a with no previous
    tenant, whose health run failed (staff only)."""
    world.cert_a, world.run_a = gate_evidence(world.host_b, flow_id="release-alpha", tenant="alpha")
    world.cert_b, world.run_b = gate_evidence(world.host_a, flow_id="release-bravo", tenant="bravo")
    world.cert_none, world.run_none = gate_evidence(world.host_a, flow_id="register", tenant="", verdict="fail")
    return world


@pytest.fixture
def api(world):
    """api(role, method, path, data=None, **headers) → the response (JSON bodies)."""

    def call(role: str, method: str, path: str, data=None, **headers):
        client = world.client(role)
        return getattr(client, method.lower())(path, data, format="json", **headers)

    return call


@pytest.fixture
def rolled_back():
    """A block whose changes are undone at its end (each case of a matrix sees the same world)."""

    class Block:
        def __enter__(self):
            self.atomic = transaction.atomic()
            self.atomic.__enter__()

        def __exit__(self, *exc):
            transaction.set_rollback(True)
            return self.atomic.__exit__(*exc)

    return Block
