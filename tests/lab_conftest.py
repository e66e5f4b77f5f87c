"""Fixtures for end-to-end tests in the lab: the live agent listener (boot path, agent protocol), a real Celery worker on
the real broker, the Redfish emulator, agents on file-backed disks and tenant Kubernetes APIs."""
import socket

import pytest
import yaml
from django.core.management import call_command

from conftest import DEMO, wait_for
from lab.site import IMAGE_NAME, LabSite

# Short deadlines so that faults show within seconds (the worker reads them from its environment).
FAST = {
    "BMC_TIMEOUT_S": "2", "BMC_RETRY_S": "0.5", "POWER_DEADLINE_S": "6", "POWER_POLL_S": "0.2", "POWER_STEP_DEADLINE_S": "10",
    "AGENT_LOOKUP_DEADLINE_S": "30", "AGENT_COMMAND_DEADLINE_S": "60", "AGENT_SILENCE_S": "4", "WARM_POLL_S": "3",
    "NODE_READY_POLL_S": "2", "NODE_READY_DEADLINE_S": "60", "DRAIN_DEADLINE_S": "20", "DRAIN_GRACE_S": "1",
    "DRAIN_POLL_S": "1",
    "DRIVE_STALE_EVERY_S": "2", "RECONCILE_EVERY_S": "5",
    # Hosts the gate sets aside stay in repair, where these tests look for them; tests/test_repair_ladder.py turns
    # the ladder on (ladder_lab).
    "REPAIR_LADDER": "0", "REPAIR_COLD_OFF_S": "1",
    # The lab's servers fetch their boot configuration within a second of power-on: a settle window of seconds.
    "BOOT_SETTLE_S": "2", "BOOT_SETTLE_MARGIN_S": "1",
}

# Tenant pool `gpu` over the lab's gpu-servers, as a tenant's vcluster.yaml declares it.
GPU_POOL = """\
privateNodes:
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: {image}
      static:
        - name: gpu
          quantity: {quantity}
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          nodeLabels:
            workload: gpu
"""


def gpu_pool(quantity: int) -> str:
    return GPU_POOL.format(image=IMAGE_NAME, quantity=quantity)


@pytest.fixture
def lab_factory(agent_server, tmp_path, worker_settings, settings):
    """lab_factory(hosts=2, gpu_hosts=1, tenants=[...], faults={...}) → a started, registered LabSite. `warm`: how
    many gpu-servers are kept warm after their gate (the demo keeps one; tests keep none unless they ask);
    `firmware`: the gpu-server NodeType's BIOS settings and firmware minimums (pools/firmware.py), set before the
    servers register; `gpu`: its GPUs' handover state (pools/gpu.py)."""
    worker_settings.update(FAST)
    for key, value in FAST.items():
        if hasattr(settings, key):
            setattr(settings, key, type(getattr(settings, key))(float(value)))
    sites = []

    def make(warm: int = 0, warm_idle_minutes: int = 30, firmware: dict | None = None, gpu: dict | None = None,
             **kwargs):
        from pools.models import NodeType

        kwargs.setdefault("power_delay", (0.2, 0.5))
        site = LabSite(console_url=agent_server.url, var_dir=tmp_path / "lab", **kwargs).start()
        sites.append(site)
        call_command("apply", "-f", str(DEMO / "site.yaml"), verbosity=0)
        NodeType.objects.filter(name="gpu-server").update(warm_hosts=warm, warm_idle_minutes=warm_idle_minutes,
                                                          firmware=firmware or {}, gpu=gpu or {})
        site.register()
        return site

    yield make
    for site in sites:
        site.stop()


def wait_hosts(state: str, count: int, timeout: float = 120):
    from hosts.models import BareMetalHost

    try:
        return wait_for(lambda: BareMetalHost.objects.filter(state=state).count() == count, timeout=timeout)
    except AssertionError:
        raise AssertionError(f"not {count} host(s) {state} within {timeout}s\n{lab_report()}") from None


def lab_report() -> str:
    """Hosts, claims and the latest events: what a failing lab test prints."""
    from claims.models import NodeClaim
    from events.models import Event
    from hosts.models import BareMetalHost

    lines = [f"host {h.name}: {h.state} {h.error_message} flow={h.flow.get('name')}/{h.flow.get('step')}"
             for h in BareMetalHost.objects.all()]
    lines += [f"claim {c.name}: {c.phase} {c.message}" for c in NodeClaim.objects.all()]
    lines += [f"  {e.created_at:%H:%M:%S.%f} {e.object_name} {e.from_state}>{e.to_state} {e.step} {e.message}"
              for e in Event.objects.order_by("-id")[:25][::-1]]
    return "\n".join(lines)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: nothing listens there


def lab_tenant_api(site, name, *, endpoint=None, server=None, ca=None):
    """Point tenant `name` at `endpoint` (its VIP) with the lab's kubeconfig, its server and CA changed."""
    from pools.models import Tenant
    from pools.services import tenant_set_api

    config = yaml.safe_load(site.tenants[name].kubeconfig())
    cluster = config["clusters"][0]["cluster"]
    if server:
        cluster["server"] = server
    if ca:
        cluster["certificate-authority-data"] = ca
    tenant_set_api(tenant=Tenant.objects.get(name=name), api_endpoint=endpoint or site.tenants[name].endpoint,
                   kubeconfig=yaml.safe_dump(config), actor="user:test")
