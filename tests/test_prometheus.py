"""Debian's Prometheus scrapes a running console (daphne) with an auditor's token from a credentials file, as
docs/operations.md configures it, and what its HTTP API answers matches the database; the probes answer over HTTP."""
import io
import os
import shutil
import socket
import subprocess

import pytest
import requests
from django.core.management import call_command
from django.db.models import Count

from claims.models import NodeClaim
from conftest import ROOT, wait_for
from hosts.models import BareMetalHost

from .api_conftest import ISSUED_KEYS

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)
PROMETHEUS = shutil.which("prometheus")

CONFIG = """global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: vmetal-console
    metrics_path: /metrics
    authorization:
      type: Token
      credentials_file: {credentials}
    static_configs:
      - targets: ["127.0.0.1:{port}"]
rule_files: ["{rules}"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(base: str, expr: str) -> dict[tuple, float]:
    answer = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("job", "instance"))): float(r["value"][1])
            for r in answer["data"]["result"]}


def test_prometheus_scrapes_the_console_and_its_answers_match_the_database(console_server, console_site, spawn,
                                                                          tmp_path):
    if PROMETHEUS is None:
        missing = pytest.fail if os.environ.get("CI") else pytest.skip  # CI installs it: there it must run
        missing("prometheus is not installed (Debian: apt-get install prometheus; .ci/run installs it)")
    call_command("reconcile", stdout=io.StringIO())  # tenant two's claim
    key = io.StringIO()
    call_command("token", "create", "prometheus", "--service-user", "auditor", stdout=key)
    ISSUED_KEYS.add(key.getvalue().strip())
    credentials = tmp_path / "token"
    credentials.write_text(key.getvalue().strip())
    credentials.chmod(0o600)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(CONFIG.format(credentials=credentials, port=console_server.port,
                                    rules=ROOT / "deploy" / "prometheus" / "alerts.yml"))
    spawn([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
          cwd=tmp_path, stdout=open(tmp_path / "prometheus.log", "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def target_up():
        try:
            targets = requests.get(f"{base}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        except (requests.ConnectionError, ValueError, KeyError):
            return None
        return targets and targets[0]["health"] == "up" and targets[0]
    target = wait_for(target_up, timeout=60, interval=0.5)
    assert target["lastError"] == ""

    hosts = wait_for(lambda: query(base, "sum(vmetal_hosts)"), timeout=30)
    assert hosts == {(): BareMetalHost.objects.count()}
    assert query(base, "sum by (state) (vmetal_hosts)") == {
        (("state", row["state"]),): row["n"] for row in BareMetalHost.objects.values("state").annotate(n=Count("pk"))}
    claims = {(("phase", row["phase"]), ("pool", row["pool_name"]), ("tenant", row["tenant__name"])): row["n"]
              for row in NodeClaim.objects.values("phase", "tenant__name", "pool_name").annotate(n=Count("pk"))}
    assert claims and query(base, "vmetal_nodeclaims") == {
        tuple(sorted((("__name__", "vmetal_nodeclaims"), *k))): v for k, v in claims.items()}
    assert query(base, "vmetal_broker_up") == {(("__name__", "vmetal_broker_up"),): 1}

    # A host changes state: the next scrape says so.
    host = BareMetalHost.objects.filter(state="available").first()
    BareMetalHost.objects.filter(pk=host.pk).update(state="maintenance")
    wait_for(lambda: query(base, 'sum(vmetal_hosts{state="maintenance"})') == {(): 1}, timeout=30)

    # The rules are loaded and evaluated against the console's series.
    groups = requests.get(f"{base}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert {r["name"] for r in groups[0]["rules"]} >= {"VmetalHostPastDeadline", "VmetalBootRaced"}
    assert all(r["health"] != "err" for r in groups[0]["rules"])

    # The probes over HTTP, under the address a kubelet would use.
    ready = requests.get(f"{console_server.url}/readyz", headers={"Host": "10.244.0.9:8000"}, timeout=10)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert requests.get(f"{console_server.url}/metrics", timeout=10).status_code == 401
