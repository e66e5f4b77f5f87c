"""The names the console answers to: production does not start without ALLOWED_HOSTS (nor with `*`), the embedded
mode answers to the loopback names only, and a websocket opened from another website's page (its Origin) is refused
by the running console while the console's own pages connect."""
import json
import os
import subprocess
import sys

import pytest
import websocket
from django.test import Client

from conftest import ROOT


pytest_plugins = ["tests.console_conftest"]
PRODUCTION_DB = "postgres://nobody@127.0.0.1:1/production"  # never reached: settings are read, nothing more
SHOW = "import django; django.setup(); from django.conf import settings as s; print(s.ALLOWED_HOSTS)"


def start(env_changes: dict, code: str = SHOW) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ALLOWED_HOSTS", "DEBUG")}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "DJANGO_SETTINGS_MODULE": "vmetal_console.settings", "LOG_LEVEL": "WARNING",
                               **env_changes})


def test_a_production_console_without_allowed_hosts_does_not_start_and_says_so():
    started = start({"DATABASE_URL": PRODUCTION_DB})
    assert started.returncode != 0
    assert "vMetal Console cannot start" in started.stderr and "Traceback" not in started.stderr
    assert "ALLOWED_HOSTS must name the console's hosts" in started.stderr


def test_a_production_console_refuses_allowed_hosts_star():
    started = start({"DATABASE_URL": PRODUCTION_DB, "ALLOWED_HOSTS": "console.example.com,*"})
    assert started.returncode != 0 and "ALLOWED_HOSTS=* accepts any Host header" in started.stderr
    named = start({"DATABASE_URL": PRODUCTION_DB, "ALLOWED_HOSTS": "console.example.com, console.internal"})
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == "['console.example.com', 'console.internal']"


def test_the_embedded_console_answers_to_the_loopback_names_unless_told_otherwise(tmp_path):
    sqlite = {"DATABASE_URL": f"sqlite:///{tmp_path / 'console.sqlite3'}", "VMETAL_VAR_DIR": str(tmp_path / "var")}
    assert start(sqlite).stdout.strip() == "['127.0.0.1', 'localhost', '[::1]']"
    assert start({**sqlite, "ALLOWED_HOSTS": "lab.local"}).stdout.strip() == "['lab.local']"


@pytest.mark.django_db(transaction=True)
def test_a_page_asked_for_under_another_host_name_is_refused(console_server):
    import requests

    assert requests.get(f"{console_server.url}/login/", timeout=30).status_code == 200
    assert requests.get(f"{console_server.url}/login/", headers={"Host": "evil.example"}, timeout=30).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_a_websocket_from_a_foreign_origin_is_refused_and_the_consoles_own_origin_gets_the_live_view(
        console_server, users):
    client = Client()
    client.force_login(users["alice"])  # a signed-in member of tenant one: what a foreign page would ride on
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    url = console_server.url.replace("http://", "ws://") + "/ws/claims/"
    for origin in ("http://evil.example", f"http://evil.example:{console_server.port}", "null"):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(url, origin=origin, cookie=cookie, timeout=30)
        assert refused.value.status_code == 403, origin

    own = websocket.create_connection(url, origin=console_server.url, cookie=cookie, timeout=30)
    try:
        own.send(json.dumps({"type": "resync", "since": 0, "ids": []}))
        received = ""
        while 'id="live-cursor"' not in received:
            received += own.recv()
    finally:
        own.close()
