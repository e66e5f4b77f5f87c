"""Fixtures of Auto Nodes' end-to-end tests in the lab: `manage.py watch-pods` as bin/run starts it, a dynamic pool
of the lab's gpu-servers as a tenant's vcluster.yaml declares it, and what the tenant's API holds. Load with
`pytest_plugins = ["tests.lab_conftest", "tests.autonodes_lab_conftest"]` (each module keeps its own
worker_settings: the durations its beat runs with)."""
import signal
import subprocess
import sys

import pytest

from conftest import ROOT
from lab.site import IMAGE_NAME


def dynamic_pool(*, name: str = "gpu-auto", nodes: int = 4, policy: str = "WhenEmpty", after: str = "2s") -> str:
    """A dynamic pool over the lab's gpu-servers, up to `nodes`, consolidated `after` (no minimum lifetime: a test
    does not wait the 30 minutes a real GPU server is kept at least)."""
    return f"""\
privateNodes:
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: {IMAGE_NAME}
      dynamic:
        - name: {name}
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          limits:
            nodes: "{nodes}"
          disruption:
            consolidationPolicy: {policy}
            consolidateAfter: {after}
            minNodeLifetime: 0s
"""


@pytest.fixture
def watcher(subprocess_env, tmp_path):
    """`manage.py watch-pods`, as bin/run starts it, sending its decisions to the test worker's queue.
    watcher(**env): started with these settings on top (e.g. a shorter back-off)."""
    from tests.api_conftest import watch_child_log
    from django.conf import settings

    log = tmp_path / "watch-pods.log"
    watch_child_log(log)
    procs = []

    def start(**more: str):
        env = {**subprocess_env, "AUTONODES_WATCH_POLL_S": "0.3", "PYTHONUNBUFFERED": "1",
               "CELERY_QUEUE_PREFIX": settings.CELERY_QUEUE_PREFIX, **more}
        with open(log, "a") as out:
            procs.append(subprocess.Popen([sys.executable, "manage.py", "watch-pods"], cwd=ROOT, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    print("--- watch-pods, last lines ---\n" + "\n".join(log.read_text().splitlines()[-40:]))


def job_pods(site, tenant: str, job: str) -> list[dict]:
    """The Job's live pods (terminating ones included), straight from the lab's store."""
    return [p for p in site.tenants[tenant].objects("pods") if (p["metadata"].get("labels") or {}).get("job-name") == job]


def running(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def node_names(site, tenant: str) -> set[str]:
    return {n["metadata"]["name"] for n in site.tenants[tenant].objects("nodes")}
