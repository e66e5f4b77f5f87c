"""Fixtures of the API tests, loaded with `pytest_plugins = ["tests.api_conftest"]`.

`no_secrets_leak` fails a test when a secret leaves the console: the BMC usernames and passwords stored in the
database (decrypted), tenant kubeconfigs (and the credentials inside them), API token keys (the database has only
their hashes: those made with `issue_token` or returned by the token endpoint), the console's own keys (SECRET_KEY,
the field-encryption keys, the private key that signs erase certificates), agent tokens handed out by
/agent/lookup, bootstrap (join) tokens (those queued for agents in HostCommand.secret_args, and every token this
process made through claims.tenant_api: the whole token and its secret part). It checks

- every response of django.test.Client (and DRF's APIClient, a subclass);
- every websocket frame a test receives through channels' WebsocketCommunicator;
- every text response and websocket frame of a browser context passed to `watch_browser` (the console
  fixtures' Chromium, against daphne);
- every log record of this process, at the end of the test against the secrets of that moment (and all seen
  before), and what child processes (daphne, Celery workers) wrote to the logs registered with
  `watch_child_log` while the test ran.

The only exceptions are responses whose job is to hand a secret to its owner, each exactly that secret:

- POST /api/v1/tokens (201): the new key, shown once;
- POST /tokens/ (201, the console's "Make token"): the new key, shown once;
- POST /agent/lookup (200): the token it returns, when it is the active session's of the host it names;
- POST /agent/heartbeat (200): the secret args of the command it returns, when that command is the calling
  agent's own host's (the host of the session its bearer token opens); never another host's;
- POST /tenants/<name>/join/ (200, the "Join Node…" button; django.test.Client only): the bootstrap token made
  (or, the person's live one, shown again: claims.join_tokens) while serving that very request, when the logged-in user may join nodes to tenant <name>: an admin (staff) or
  a member (TenantMembership) of it. Not an auditor, not on any later page; in a browser (whose user the check
  does not know), a join token the console made for a person of tenant <name> (claims.models.JoinToken).

A browser event handler cannot fail a test (nor read the database safely): what the browser received is checked
when the test ends, against every secret seen during the test and those the database holds then.

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
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection, transaction
from django.test import client as django_client
from rest_framework.test import APIClient

MIN_SECRET_LENGTH = 6  # shorter values ("admin", "root") are ordinary words: a substring check means nothing
KUBECONFIG_SECRET = re.compile(r"(?:token|client-key-data|client-certificate-data|password)\s*:\s*[\"']?([^\s\"']+)")
BOOTSTRAP_TOKEN = re.compile(r"\b[a-z0-9]{6}\.([a-z0-9]{16})\b")  # <id>.<secret>: the id alone is no secret
TOKEN_PATHS = ("/api/v1/tokens", "/api/v1/tokens/")
CONSOLE_TOKEN_PATH = "/tokens/"
CONSOLE_KEY = re.compile(r'id="token-key">([0-9a-f]{64})<')
ISSUED_KEYS: set[str] = set()  # API token keys seen in plain text: the database holds only hashes
JOIN_PATH = re.compile(r"/tenants/([^/]+)/join/")
BOOT_PATH = re.compile(r"/boot/[0-9a-fA-F:-]{17}\.(ipxe|iso)")
BOOT_SECRET = re.compile(r"vmetal\.boot_secret=([A-Za-z0-9_-]+)")
TEXT_TYPES = ("text/", "application/json", "application/javascript", "application/xml")
CHILD_LOGS: list[Path] = []  # log files of child processes (daphne, Celery workers), see watch_child_log


def watch_child_log(path: Path) -> None:
    """Have no_secrets_leak read what a child process writes to `path` while each test runs."""
    CHILD_LOGS.append(Path(path))


class SecretLeak(AssertionError):
    pass


class _Watch:
    def __init__(self):
        self.known: set[str] = set()  # every secret seen so far in this test (for the log check at the end)
        self.agent_tokens: set[str] = set()
        self.bootstrap_tokens: set[str] = set()  # made through claims.tenant_api in this process
        self.made_in_request: set[str] = set()  # ... while serving the current django.test.Client request
        self.pinned: set[str] | None = None
        self.records: list[logging.LogRecord] = []
        self.browser_texts: list[tuple[str, str, int, str]] = []  # what the browser got, checked at the end
        self.leaks: list[str] = []  # what check_browser found
        self.uses_db = False  # whether the database may be read at the end
        self.offsets: dict[Path, int] = {}  # each child log's size when the test began
        self.checked = 0

    # -- what is secret now
    def current(self) -> set[str]:
        from claims.models import JoinToken
        from hosts.models import BareMetalHost, HostCommand, RamdiskBoot
        from pools.models import Tenant

        if self.pinned is not None:
            return self.pinned
        found = set(self.agent_tokens | self.bootstrap_tokens)
        for username, password in BareMetalHost.objects.values_list("bmc_username", "bmc_password"):
            found.update((username or "", password or ""))
        for kubeconfig in Tenant.objects.values_list("kubeconfig", flat=True):
            if kubeconfig:
                found.add(kubeconfig)
                found.update(KUBECONFIG_SECRET.findall(kubeconfig))
        found.update(ISSUED_KEYS)
        found.update(RamdiskBoot.objects.exclude(secret="").values_list("secret", flat=True))  # not delivered yet
        for token_id, secret in JoinToken.objects.values_list("token_id", "secret"):  # people's join tokens
            found.update((f"{token_id}.{secret}", str(secret)))
        found.update(_console_keys())
        for text in HostCommand.objects.exclude(secret_args="").values_list("secret_args", flat=True):
            found.update(_command_secrets(text))
        return {s for s in found if len(s) >= MIN_SECRET_LENGTH}

    def pin(self) -> set[str]:
        """From now on, check against the secrets of this moment instead of what the database holds (a fuzzer
        sets credentials that are ordinary words, which its own error messages may well contain)."""
        self.pinned = self.current()
        return self.pinned

    def bootstrap_token_made(self, token: str, secret: str) -> None:
        self.bootstrap_tokens |= {token, secret}
        self.made_in_request |= {token, secret}

    # -- the exceptions (see the module's docstring)
    def owned(self, method: str, path: str, status: int, body: str, request) -> set[str]:
        """The secrets that this django.test.Client response may carry to the one who asked for it."""
        from hosts.models import AgentSession, HostCommand
        from hosts.protocol.api import _command_pk, hash_token
        from pools.models import TenantMembership

        if method == "GET" and status == 200 and BOOT_PATH.fullmatch(path):
            # The boot path hands the boot's secret to the server's firmware or BMC, and to nobody else.
            secrets = set(BOOT_SECRET.findall(body))
            self.agent_tokens |= secrets
            return secrets
        if method != "POST" or status != 200 or request is None:
            return set()
        if path.rstrip("/") == "/agent/lookup":
            answer = json.loads(body)
            token = answer.get("token") or ""
            self.agent_tokens.add(token)
            own = AgentSession.objects.filter(host_id=answer.get("host_id"), token_hash=hash_token(token),
                                              active=True).exists()
            return {token} if own else set()
        if path.rstrip("/") == "/agent/heartbeat":
            bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
            caller = AgentSession.objects.filter(token_hash=hash_token(bearer)).values_list("host_id", flat=True)
            command = (json.loads(body).get("command") or {}).get("id")
            args = HostCommand.objects.filter(pk=_command_pk(command), host_id__in=list(caller)).values_list(
                "secret_args", flat=True).first()
            return _command_secrets(args or "")
        join = JOIN_PATH.fullmatch(path)
        if join and (getattr(request.user, "is_staff", False) or
                     TenantMembership.objects.filter(tenant__name=join[1], user_id=request.user.pk).exists()):
            return set(self.made_in_request)
        return set()

    def check(self, method: str, path: str, response) -> None:
        """A django.test.Client response."""
        headers = "\n".join(f"{k}: {v}" for k, v in response.items())
        body = _text(response)
        owned = self.owned(method, path, response.status_code, body, getattr(response, "wsgi_request", None))
        self.check_text(method, path, response.status_code, body + "\n" + headers, getattr(response, "data", None),
                        allowed=owned)

    def check_text(self, method: str, path: str, status: int, text: str, data=None, secrets=None,
                   allowed=frozenset()) -> None:
        """Any response, as its status and its text (body and headers). `secrets`: check for these instead of
        what the database holds now; `allowed`: the secrets this response hands to their owner."""
        self.checked += 1
        allowed = set(allowed)
        if method == "POST" and path.rstrip("/") == TOKEN_PATHS[0] and status == 201:
            key = data["token"] if isinstance(data, dict) else json.loads(text.split("\n", 1)[0])["token"]
            ISSUED_KEYS.add(key)
            allowed.add(key)
        if method == "POST" and path == CONSOLE_TOKEN_PATH and status == 201:
            key = CONSOLE_KEY.search(text)[1]
            ISSUED_KEYS.add(key)
            allowed.add(key)
        secrets = self.current() if secrets is None else secrets
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

    def check_child_logs(self, offsets: dict[Path, int]) -> None:
        """What child processes logged since the test began (`offsets`: each log's size then; 0 for a log
        registered meanwhile)."""
        for path in dict.fromkeys(CHILD_LOGS):
            if not path.exists():
                continue
            with path.open("rb") as f:
                f.seek(offsets.get(path, 0))
                text = f.read().decode("utf-8", errors="replace")
            for secret in self.known:
                if secret in text:
                    line = next(line for line in text.splitlines() if secret in line)
                    raise SecretLeak(f"{path.name}, a child process's log, contains a secret ({secret[:3]}…): "
                                     f"{line.replace(secret, '…')[:120]}")

    def finish(self) -> None:
        """The end of the test: what the browser got, then every log line (this process's and the children's
        since the test began) against every secret seen and those the database holds now."""
        if self.uses_db:
            self.known |= self.current()
        self.check_browser()
        self.check_logs()
        self.check_child_logs(self.offsets)

    # -- a browser (Playwright, sync API) and websockets
    def watch_browser(self, context) -> None:
        """Check every text response and websocket frame that pages of this browser context receive."""
        def on_response(response):
            kind = response.headers.get("content-type", "")
            if 300 <= response.status < 400 or not kind.startswith(TEXT_TYPES):
                return
            try:
                body = response.text()
            except Exception:  # the page went on meanwhile and the browser dropped the body: nothing to read
                return
            headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
            self.browser_check(response.request.method, urlsplit(response.url).path, response.status,
                               body + "\n" + headers)

        def on_websocket(socket):
            path = urlsplit(socket.url).path
            socket.on("framereceived", lambda payload: self.browser_check(
                "WS", path, 101, payload if isinstance(payload, str) else payload.decode("utf-8", "replace")))

        context.on("response", on_response)
        context.on("page", lambda page: page.on("websocket", on_websocket))
        for page in context.pages:
            page.on("websocket", on_websocket)

    def browser_check(self, method: str, path: str, status: int, text: str) -> None:
        # No database here: the handler runs in Playwright's event loop, where Django would open a connection
        # of its own and leave it open. What the browser got is checked when the test ends.
        self.browser_texts.append((method, path, status, text))

    def join_tokens_shown(self, method: str, path: str, status: int) -> set[str]:
        """In a browser, whose user the check does not know: the join tokens the console made for people of
        tenant <name> (claims.models.JoinToken), which "Join Node…" (POST /tenants/<name>/join/) shows them."""
        from claims.models import JoinToken

        join = JOIN_PATH.fullmatch(path)
        if method != "POST" or status != 200 or not join or not self.uses_db:
            return set()
        rows = JoinToken.objects.filter(tenant__name=join[1]).values_list("token_id", "secret")
        return {form for token_id, secret in rows for form in (f"{token_id}.{secret}", str(secret))}

    def check_browser(self) -> None:
        self.leaks = []
        for method, path, status, text in self.browser_texts:
            try:
                self.check_text(method, path, status, text, secrets=self.known,
                                allowed=self.join_tokens_shown(method, path, status))
            except SecretLeak as leak:
                self.leaks.append(str(leak))
        self.browser_texts.clear()
        if self.leaks:
            raise SecretLeak(f"the browser received {len(self.leaks)} secret(s): " + "; ".join(self.leaks[:3]))


def _console_keys() -> set[str]:
    """SECRET_KEY, the field-encryption keys and the signing key: as set, and the signing key's material alone (a
    PEM's base64 lines, its raw private bytes in hex)."""
    from hosts.gate import certificates

    pem = settings.CERTIFICATE_SIGNING_KEY
    found = {settings.SECRET_KEY, *settings.FIELD_ENCRYPTION_KEYS, pem}
    found.update(line for line in pem.splitlines() if line.strip() and not line.startswith("-----"))
    try:
        found.add(certificates.signing_key().private_bytes_raw().hex())
    except certificates.SigningUnavailable:
        pass
    return found


def _command_secrets(secret_args: str) -> set[str]:
    """A command's secret args: each string, and the bootstrap tokens inside them (a join line in user_data)."""
    found = set()
    for text in _strings(json.loads(secret_args)) if secret_args else []:
        found.add(text)
        for match in BOOTSTRAP_TOKEN.finditer(text):
            found |= {match[0], match[1]}
    return found


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
def no_secrets_leak(request, monkeypatch):
    """Fails the test when a response, a websocket frame, a log line or a child's log carries a secret (see
    the module's docstring)."""
    from channels.testing import WebsocketCommunicator
    from channels.db import database_sync_to_async

    from claims.tenant_api import BootstrapToken

    # The end-of-test check reads the database: have it set up before this fixture, so torn down after it.
    uses_db = bool(request.node.get_closest_marker("django_db")) or "_django_db_helper" in request.fixturenames
    if uses_db:
        request.getfixturevalue("_django_db_helper")
    watch = _Watch()
    original = django_client.Client.request

    def client_request(self, **request):
        watch.made_in_request = set()
        response = original(self, **request)
        watch.check(request.get("REQUEST_METHOD", "GET"), request.get("PATH_INFO", ""), response)
        return response

    receive_output = WebsocketCommunicator.receive_output

    async def websocket_receive(self, timeout=1):
        message = await receive_output(self, timeout)
        if message.get("type") == "websocket.send":
            text = message.get("text") or (message.get("bytes") or b"").decode("utf-8", errors="replace")
            await database_sync_to_async(watch.check_text)("WS", self.scope["path"], 101, text)
        return message

    token = BootstrapToken.token

    def bootstrap_token(self):
        watch.bootstrap_token_made(token.fget(self), self.secret)
        return token.fget(self)

    monkeypatch.setattr(django_client.Client, "request", client_request)
    monkeypatch.setattr(WebsocketCommunicator, "receive_output", websocket_receive)
    monkeypatch.setattr(BootstrapToken, "token", property(bootstrap_token))
    watch.uses_db = uses_db
    watch.offsets = {path: path.stat().st_size for path in CHILD_LOGS if path.exists()}
    recorder = _Recorder(watch)
    logging.getLogger().addHandler(recorder)
    try:
        yield watch
    finally:
        logging.getLogger().removeHandler(recorder)
    watch.finish()
    ISSUED_KEYS.clear()


def issue_token(user) -> str:
    """A new API token for `user` (through the service, as the API makes them); its key, known to the check."""
    from access.services import token_create

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
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      static:
        - name: gpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
"""
BRAVO_POOLS = ALPHA_POOLS.replace("gpu-server", "cpu-server").replace("name: gpu", "name: cpu")
KUBECONFIG = ("apiVersion: v1\nkind: Config\nusers:\n- name: {name}\n  user:\n    token: kc-{name}-{secret}\n")
# member_a and member_b administer their tenants (alpha, bravo); viewer_a reads alpha only.
ROLES = ("admin", "operator", "auditor", "member_a", "viewer_a", "member_b", "anonymous")
USERNAMES = {"admin": "ada-admin", "operator": "otto-operator", "auditor": "audrey-auditor",
             "member_a": "alice-alpha", "viewer_a": "vera-viewer", "member_b": "bob-bravo"}


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
        self.users["operator"].groups.add(Group.objects.get_or_create(name="operators")[0])
        TenantMembership.objects.create(tenant=self.alpha, user=self.users["member_a"])
        TenantMembership.objects.create(tenant=self.alpha, user=self.users["viewer_a"], role="viewer")
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
    """One disk's erase certificate and a dcgmi health run of one gate run, as hosts.gate.cleaning records them."""
    from hosts.gate import cleaning
    from hosts.gate.census import census_take
    from hosts.models import BareMetalHost

    gate = {"node_type": "gpu-server", "policy": {"method": "full", "fallback": "", "source": "NodeType gpu-server"}}
    disk = {"name": "nvme0n1", "ok": True, "serial": f"S-{flow_id}", "model": "SAMSUNG MZWLO3T8HCLS", "type": "nvme",
            "method": "full", "method_type": "Clear", "expectation": "zeros"}
    read_back = {"name": "nvme0n1", "expectation": "zeros", "mode": "sampled", "direct_io": True, "passed": True,
                 "canaries": {"planted": 64, "checked": 64, "survived": 0},
                 "samples": {"count": 586, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0}}
    cert = cleaning.issue_certificates(host=host, flow_id=flow_id, gate=gate,
                                       previous={"tenant": tenant, "claim": f"{tenant}-old" if tenant else ""},
                                       erase={"disks": [disk]}, verify={"disks": [read_back], "passed": True},
                                       census=census_take(host=BareMetalHost(), bmc_drives=[
                                           {"name": "Disk.Bay.0", "serial": disk["serial"]}]))[0]
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


def waiting_for_a_lock() -> bool:
    """Some other connection to this database waits for a lock (the second request, on the pool's row)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0] > 0
