"""The demo's KubeVirt pool, as a newcomer meets it: `./bin/run`'s start-up commands load the demo, its lab (the
command line bin/run starts, with its KubeVirt cluster of simulated guests) registers the cluster's kubeconfig and
the tenants' APIs, and a Celery worker with its beat makes tenant one's `vm` pool a VM whose node is Ready in the
tenant: the claim Available with its Machine recorded and shown on the claim's page."""
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.tenant_api import TenantAPI
from conftest import ROOT, wait_for
from machines.choices import MachineState
from machines.models import Machine, ProviderSecret
from pools.models import NodeType, Tenant

from .test_restart import start_up

pytestmark = pytest.mark.django_db(transaction=True)

BIN_RUN = ROOT / "bin" / "run"


def lab_command(env: dict) -> list[str]:
    """bin/run's `manage.py lab …` line, its ${VAR:-default} expanded from env as bash would."""
    text = BIN_RUN.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "manage.py lab " in line)

    def expand(match: re.Match) -> str:
        name, colon, default = match.group(1), match.group(2), match.group(3)
        value = env.get(name)
        return default if value is None or (colon and not value) else value

    line = re.sub(r"\$\{(\w+)(:?)-([^}]*)\}", expand, line)
    line = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), line)
    words = shlex.split(line.split(">", 1)[0])
    return words[words.index("manage.py"):]


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path  # the demo's admin password, and the lab's var/lab
    return tmp_path


@pytest.fixture
def worker_settings() -> dict:
    return {"WITH_BEAT": "1", "MACHINES_RECONCILE_EVERY_S": "1", "NODE_READY_POLL_S": "1"}


@pytest.fixture
def demo(var_dir) -> str:
    """bin/run's start-up commands (prepare: the demo into the empty database), before its processes start."""
    return start_up()


@pytest.fixture
def bin_run_lab(demo, subprocess_env, var_dir):
    """The lab as bin/run starts it, without its servers (LAB_HOSTS=0: the KubeVirt pool needs none)."""
    env = {**subprocess_env, "LAB_HOSTS": "0", "AGENT_PORT": "8001", "VMETAL_VAR_DIR": str(var_dir),
           "PYTHONUNBUFFERED": "1"}
    args = lab_command(env)
    assert "--kubevirt" in args and "one,two" in args
    log = var_dir / "lab.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_for(lambda: "lab running" in log.read_text() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, log.read_text()
        yield log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        print("--- lab, last lines ---\n" + "\n".join(Path(log).read_text().splitlines()[-30:]))


def test_the_demo_has_a_kubevirt_pool_whose_vm_joins_tenant_one_and_shows_on_its_claim(
        demo, bin_run_lab, celery_worker_process):
    assert "demo data:" in demo and "not loaded" not in demo
    assert NodeType.objects.get(name="vm-cpu-small").provider.name == "kubevirt"
    # The lab wrote the cluster's kubeconfig where the provider's clusterRef finds it (at each start: its port
    # may change).
    assert "KubeVirt cluster kubevirt" in bin_run_lab.read_text()
    assert ProviderSecret.objects.filter(namespace="vcluster-platform", name="kubevirt").exists()

    def available():
        return NodeClaim.objects.filter(tenant__name="one", pool_name="vm", phase=ClaimPhase.AVAILABLE).first()

    try:
        claim = wait_for(available, timeout=120)
    except AssertionError:
        raise AssertionError([(c.name, c.pool_name, c.phase, c.message) for c in NodeClaim.objects.all()]
                             + [(m.name, m.state, m.message) for m in Machine.objects.all()]) from None
    machine = Machine.objects.get(claim=claim)
    assert machine.kind == "kubeVirt" and machine.state == MachineState.RUNNING and machine.node_type.name == "vm-cpu-small"
    assert {m["kind"] for m in machine.made} >= {"VirtualMachine", "DataVolume"}

    tenant = Tenant.objects.get(name="one")
    node = TenantAPI(tenant.kubeconfig).get_node(claim.node_name)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert ready["Ready"] == "True"
    assert node["metadata"]["labels"]["workload"] == "vm"
    assert node["metadata"]["labels"]["vcluster.com/node-type"] == "vm-cpu-small"

    client = Client()
    client.force_login(User.objects.get(username="admin"))
    page = client.get(f"/claims/{claim.name}/").content.decode()
    assert machine.name in page and "vm-cpu-small" in page
