"""Single sign-on end to end: Chromium signs in to a console process through a real OIDC provider process
(django-oauth-toolkit, tests/oidc_provider, its own RSA key): the code flow with PKCE, the groups mapped to roles
at each sign-in, signing out, password sign-in kept for the break-glass admin, and ID tokens from another
issuer or already expired refused."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.contrib.auth.models import User

from access.models import OidcIdentity
from conftest import wait_for
from events.models import Event
from pools.models import TenantMembership

pytest.register_assert_rewrite("tests.console_conftest")
from .api_conftest import watch_child_log  # noqa: E402
from .console_conftest import PASSWORD, ConsoleServer, console_env  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

PROVIDER_DIR = Path(__file__).resolve().parent / "oidc_provider"
CLIENT_ID, CLIENT_SECRET = "vmetal-console", "client-secret-for-the-test-3f9a"
PEOPLE = {"ada": ("ada-idp-password-1", "platform-admins"),
          "tina": ("tina-idp-password-2", "tenant-one-admins,tenant-nowhere-admins,staff-party"),
          "alice": ("alice-idp-password-3", "tenant-two-viewers")}  # the console has a local alice already


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Provider:
    """The provider's process, its database and key under `folder`; `manage()` runs its commands."""

    def __init__(self, folder: Path):
        self.port = _free_port()
        self.issuer = f"http://127.0.0.1:{self.port}/o"
        self.control = folder / "control.json"
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
        self.env = {**os.environ, "PROVIDER_DB": str(folder / "provider.sqlite3"),
                    "PROVIDER_KEY": str(folder / "key.pem"), "PROVIDER_CONTROL": str(self.control),
                    "DJANGO_SETTINGS_MODULE": "oidc_provider.settings", "PYTHONUNBUFFERED": "1"}
        self.env.pop("DATABASE_URL", None)
        self.faults()
        self.manage("migrate", "-v0")
        self.manage("provider_setup", *[f"--user={name}:{pw}:{groups}" for name, (pw, groups) in PEOPLE.items()])
        self.log = folder / "provider.log"
        self.proc = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}",
                                      "--noreload"], cwd=PROVIDER_DIR, env=self.env, stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._listening, timeout=30)

    def _listening(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the provider did not start:\n{self.log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def manage(self, *args: str) -> None:
        subprocess.run([sys.executable, "manage.py", *args], cwd=PROVIDER_DIR, env=self.env, check=True,
                       capture_output=True, timeout=120)

    def faults(self, **faults) -> None:
        """The next ID tokens: issuer=another `iss`, expired=True."""
        self.control.write_text(json.dumps(faults))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    made = Provider(tmp_path_factory.mktemp("oidc-provider"))
    yield made
    made.stop()


@pytest.fixture(scope="module")
def sso_console(provider, django_db_setup, django_db_blocker, tmp_path_factory):
    """A console that signs in through the provider, its endpoints read from the provider's discovery
    document, password sign-in for superusers only."""
    env = {**console_env(django_db_blocker), "OIDC_ISSUER": provider.issuer, "OIDC_CLIENT_ID": CLIENT_ID,
           "OIDC_CLIENT_SECRET": CLIENT_SECRET, "LOCAL_SIGN_IN": "break-glass"}
    server = ConsoleServer(env, tmp_path_factory.mktemp("sso-console") / "daphne.log")
    watch_child_log(server.log)
    provider.manage("provider_setup", f"--redirect-uri={server.url}/oidc/callback/", f"--client-id={CLIENT_ID}",
                    f"--client-secret={CLIENT_SECRET}")
    yield server
    server.stop()


@pytest.fixture
def new_page(browser, sso_console, provider, no_secrets_leak):
    """new_page() → a page of a browser context of its own (cookies of neither the console nor the provider)."""
    contexts = []

    def make():
        context = browser.new_context(base_url=sso_console.url, viewport={"width": 1360, "height": 900})
        no_secrets_leak.watch_browser(context)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15000)
        return page

    yield make
    for context in contexts:
        context.close()
    provider.faults()


@pytest.fixture
def sso_page(new_page):
    return new_page()


def sso_sign_in(page, name: str | None) -> None:
    """Through the provider's sign-in page (name None: the provider knows this browser already), back at the
    console's page the sign-in leads to."""
    page.goto("/login/")
    console = page.url.split("/login/")[0]
    page.click("#sso")
    if name is not None:
        page.fill("#provider-username", name)
        page.fill("#provider-password", PEOPLE[name][0])
        page.click("#provider-sign-in")
    page.wait_for_url(lambda url: url.startswith(console) and "/oidc/" not in url)


def path_of(page, console) -> str:
    return page.url.removeprefix(console.url)


def test_people_sign_in_through_the_provider_with_the_roles_of_their_groups_and_sign_out(
        new_page, sso_console, provider, users):
    page = new_page()
    sso_sign_in(page, "ada")
    assert path_of(page, sso_console) == "/hosts/"  # a platform admin's home is the fleet board
    ada = User.objects.get(username="ada")
    assert ada.is_superuser and not ada.has_usable_password()
    assert OidcIdentity.objects.get(user=ada).issuer == provider.issuer
    page.click("text=Log out")
    page.wait_for_load_state()
    assert path_of(page, sso_console).startswith("/login/")
    page.goto("/hosts/")
    assert path_of(page, sso_console).startswith("/login/")

    # Another person, in another browser: a tenant admin of one by the group tenant-one-admins; the group of a
    # tenant that does not exist and a group that maps to nothing give nothing.
    page = new_page()
    sso_sign_in(page, "tina")
    assert path_of(page, sso_console) == "/tenants/one/"
    assert page.locator("text=Join Node").count() >= 1
    tina = User.objects.get(username="tina")
    assert [(m.tenant.name, m.role) for m in tina.tenant_memberships.all()] == [("one", "admin")]
    assert not tina.is_staff and not tina.groups.exists()
    page.click("text=Log out")
    page.wait_for_load_state()

    # Her groups change at the provider: the next sign-in re-syncs her roles (the provider still knows her
    # browser: it does not ask for her password again).
    provider.manage("provider_setup", "--user=tina:tina-idp-password-2:tenant-one-viewers")
    sso_sign_in(page, None)
    assert path_of(page, sso_console) == "/tenants/one/"
    assert page.locator("text=Join Node").count() == 0
    assert TenantMembership.objects.get(user=tina).role == "viewer"
    assert Event.objects.filter(object_type="membership", actor="oidc:tina",
                                message__contains="admin → viewer").exists()


def test_a_provider_user_named_as_a_local_one_gets_an_account_of_its_own(sso_page, sso_console, users):
    """Matched on issuer and subject, never on a name: the provider's alice is not the console's alice."""
    sso_sign_in(sso_page, "alice")
    local = User.objects.get(username="alice")
    identity = OidcIdentity.objects.get()
    assert identity.user != local and identity.user.username.startswith("alice+")
    assert [(m.tenant.name, m.role) for m in identity.user.tenant_memberships.all()] == [("two", "viewer")]
    assert [(m.tenant.name, m.role) for m in local.tenant_memberships.all()] == [("one", "admin")]


def test_break_glass_keeps_password_sign_in_for_superusers_only(sso_page, sso_console, users):
    page = sso_page
    page.goto("/login/")
    assert page.locator("#break-glass").is_visible()
    page.fill("#id_username", "alice")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    assert path_of(page, sso_console).startswith("/login/")
    assert "Please enter a correct username and password" in page.content()
    page.fill("#id_username", "root-admin")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    assert path_of(page, sso_console) == "/hosts/"


@pytest.mark.parametrize("fault, reason", [
    ({"issuer": "http://127.0.0.1:9/another-issuer"}, "the ID token is from another issuer"),
    ({"expired": True}, "the ID token has expired"),
])
def test_an_id_token_from_another_issuer_or_expired_is_refused(sso_page, sso_console, provider, users, fault, reason):
    provider.faults(**fault)
    sso_sign_in(sso_page, "ada")
    assert path_of(sso_page, sso_console).startswith("/login/")
    assert reason in sso_page.locator("#sso-refused").inner_text()
    sso_page.goto("/hosts/")
    assert path_of(sso_page, sso_console).startswith("/login/")
    assert not User.objects.filter(username="ada").exists()
    assert Event.objects.filter(kind="security", message__contains=reason).exists()
