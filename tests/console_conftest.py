"""Fixtures of the console's tests: named users (an admin, an auditor, a member of `one`, a member of
`two`), a site with both tenants, the console served by a real ASGI server (daphne) and Chromium.
Load with `pytest_plugins = ["tests.console_conftest"]`."""
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from channels.db import database_sync_to_async as sync_to_async  # closes the connections it opens
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, User
from django.db import connection

from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from pools.models import NodePool, Tenant, TenantMembership

from .api_conftest import watch_child_log
from .lab_conftest import FAST

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PASSWORD = "console-test-password-7f3a"

TWO_YAML = """privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      static:
        - name: cpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: cpu-server
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
"""


@pytest.fixture
def console_site(demo_site, apply, seed_block):
    """The demo site; tenant `one` with the seed's pools at quantity 0 (gpu, cpu) and a quota of 2 nodes;
    tenant `two` with one cpu pool (quantity 1: a live claim on a host of its own once reconciled)."""
    apply(seed_block.replace("quantity: 1", "quantity: 0"), tenant="one")
    apply(TWO_YAML, tenant="two")
    Tenant.objects.filter(name="one").update(quota_nodes=2)
    return {"one": Tenant.objects.get(name="one"), "two": Tenant.objects.get(name="two")}


def _user(username: str, **flags) -> User:
    return User.objects.create_user(username, f"{username}@example.invalid", PASSWORD, **flags)


@pytest.fixture
def users(console_site):
    admin = _user("root-admin", is_staff=True, is_superuser=True)
    auditor = _user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    alice = _user("alice")  # member of one
    bob = _user("bob")  # member of two
    TenantMembership.objects.create(tenant=console_site["one"], user=alice)
    TenantMembership.objects.create(tenant=console_site["two"], user=bob)
    return {"admin": admin, "auditor": auditor, "alice": alice, "bob": bob}


def pool(tenant: str, name: str) -> NodePool:
    return NodePool.objects.get(tenant__name=tenant, name=name)


def bmc_addresses() -> list[str]:
    return list(BareMetalHost.objects.values_list("bmc_address", flat=True))


# --- the console served over ASGI (websockets), against the test database ---------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


class ConsoleServer:
    """daphne serving vmetal_console.asgi in a child process. pytest-django's live_server is WSGI-only and
    cannot carry websockets. The child sees committed rows only: use it from transactional tests."""

    def __init__(self, env: dict, log: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "vmetal_console.asgi:application"],
            cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"daphne did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def console_env(django_db_blocker) -> dict:
    """The environment of a console child process on the test database."""
    with django_db_blocker.unblock():
        url = database_url()
    return {**os.environ, "DATABASE_URL": url, "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING",
            "DJANGO_SETTINGS_MODULE": "vmetal_console.settings",
            # Pool changes enqueue a reconcile; no worker listens on these queues: the tests drive the claims.
            "CELERY_QUEUE_PREFIX": f"console-test-{os.getpid()}.",
            "CONSOLE_LIVE_TAIL_S": "0.3", "CONSOLE_LIVE_FLUSH_S": "0.05", "AXES_ENABLED": "False",
            # The agent endpoints and the worker judging an agent's silence must agree on it, as one deployment's
            # processes do: the lab's workers run with FAST's silence limit.
            **{name: value for name, value in FAST.items() if name.startswith("AGENT_")}}


@pytest.fixture(scope="session")
def console_server(django_db_setup, django_db_blocker, tmp_path_factory):
    server = ConsoleServer(console_env(django_db_blocker), tmp_path_factory.mktemp("daphne") / "daphne.log")
    watch_child_log(server.log)  # read for secrets at the end of each test (tests/api_conftest.py)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    """Chromium for one test module. Module scope: Playwright's sync API keeps an event loop running in this
    thread while it is open, which asyncio tests of other modules cannot share."""
    # Django's ORM, called by the tests between browser steps, would refuse to run "from an async context".
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: apt-get install chromium")
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def new_page_context(browser, console_server, no_secrets_leak, *, bypass_csp: bool):
    context = browser.new_context(base_url=console_server.url, viewport={"width": 1360, "height": 900},
                                  bypass_csp=bypass_csp)
    no_secrets_leak.watch_browser(context)  # every page and websocket frame the browser gets, checked
    page = context.new_page()
    page.set_default_timeout(15000)
    return context, page


@pytest.fixture
def browser_page(browser, console_server, no_secrets_leak):
    """A page of its own context. It bypasses the pages' Content-Security-Policy: Playwright polls a string
    predicate (wait_for_function) through eval, which the policy forbids. tests/test_console_csp_browser.py
    uses a page under the policy (csp_page)."""
    context, page = new_page_context(browser, console_server, no_secrets_leak, bypass_csp=True)
    yield page
    context.close()


@pytest.fixture
def csp_page(browser, console_server, no_secrets_leak):
    """A page under the console's Content-Security-Policy, as a user's browser has it."""
    context, page = new_page_context(browser, console_server, no_secrets_leak, bypass_csp=False)
    yield page
    context.close()


def log_in(page, username: str, password: str = PASSWORD) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state()


def wait_live(page) -> None:
    """The page's websocket is open and has re-synced once (its status says so)."""
    page.wait_for_selector("#live-status.on")


DESKTOP = {"width": 1360, "height": 900}
PHONE = {"width": 390, "height": 844}


def screenshot(page, name: str) -> Path:
    """The page as docs/screenshots shows it: NAME at 1360 px wide, and NAME-390.png as a phone sees it."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    viewport = page.viewport_size
    page.set_viewport_size(DESKTOP)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(SCREENSHOTS / name.replace(".png", "-390.png")), full_page=True)
    page.set_viewport_size(viewport)
    return path


# --- the live views, spoken to as a browser does (a websocket with the session cookie), and drives run beside
# Playwright's event loop ---

def stages(generator) -> Iterator[str]:
    """Run the drive in a thread of its own: Playwright's event loop runs in this one, and the services'
    on-commit publishing (async_to_sync into the channel layer) may not run inside an event loop."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    with ThreadPoolExecutor(max_workers=1) as thread:
        try:
            while True:
                try:
                    yield thread.submit(next, generator).result(timeout=60)
                except StopIteration:
                    return
        finally:
            thread.submit(connections.close_all).result()


def with_thread(fn, **kwargs):
    def gen():
        fn(**kwargs)
        yield "done"

    return list(stages(gen()))


def session_cookie(client, user) -> bytes:
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def connect(path: str, cookie: bytes | None):
    from vmetal_console.asgi import application

    headers = [(b"origin", b"http://127.0.0.1")]
    if cookie:
        headers.append((b"cookie", cookie))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def resync(communicator, since: int, ids=()) -> str:
    """What the page gets when it (re)connects: the changed parts, then the cursor, last."""
    await communicator.send_to(text_data=json.dumps({"type": "resync", "since": since, "ids": list(ids)}))
    return await receive_until(communicator, 'id="live-cursor"')


async def receive_until(communicator, pattern: str, timeout: float = 20.0) -> str:
    """Messages until what arrived matches (a change may take a few messages, or come after another). The
    deadline is generous: a loaded CI machine's worker may take seconds to send what is due."""
    deadline = asyncio.get_running_loop().time() + timeout
    received = ""
    while True:
        received += await communicator.receive_from(timeout=max(0.05, deadline - asyncio.get_running_loop().time()))
        if re.search(pattern, received):
            return received


@sync_to_async
def latest_event() -> int:
    return Event.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


@sync_to_async
def first_available() -> BareMetalHost:
    return BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
