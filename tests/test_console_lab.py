"""The console's acceptance run, end to end: an admin sets tenant one's gpu pool 0 → 1 in Chromium and
watches the claim go Pending → … → Available without a reload, while a real Celery worker provisions a
lab server (Redfish BMC, the agent on file-backed disks, the tenant's Kubernetes API)."""
import os
import re

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import DEMO, wait_for
from lab.site import LabSite
from pools.models import NodeType

from .console_conftest import PASSWORD, log_in, pool, wait_live  # noqa: F401
from .lab_conftest import FAST, gpu_pool, wait_hosts

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def lab(console_server, agent_server, worker_settings, settings, tmp_path, apply, django_user_model, request):
    # The daphne console enqueues the pool's reconcile on its own queues: the worker listens there too.
    worker_settings.update(FAST, EXTRA_QUEUE_PREFIXES=f"console-test-{os.getpid()}.")
    for key, value in FAST.items():  # the agent listener runs in this process
        if key.startswith("AGENT_"):
            setattr(settings, key, float(value))
    request.getfixturevalue("celery_worker_process")  # started with those settings, before anything is enqueued
    apply((DEMO / "site.yaml").read_text())
    NodeType.objects.update(warm_hosts=0)  # the demo keeps a warm gpu-server: here the whole cold provision shows
    apply(gpu_pool(0), tenant="one")
    django_user_model.objects.create_user("root-admin", "a@example.invalid", PASSWORD, is_staff=True,
                                          is_superuser=True)
    site = LabSite(hosts=1, gpu_hosts=1, tenants=["one"], console_url=agent_server.url,
                   power_delay=(0.3, 0.6), var_dir=tmp_path / "lab").start()
    site.register()
    yield site
    site.stop()


def test_an_admin_watches_a_real_claim_become_available_without_a_reload(lab, browser_page):
    wait_hosts("available", 1)  # registered and inspected through the agent
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/tenants/one/")
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    # Every data-phase the claims table shows, recorded as the websocket's partials land. A partial is
    # rendered from the claim as it is when it is sent, so a phase shorter than a message's trip may be
    # skipped, never shown out of order.
    page.evaluate("""() => {
        window.phasesSeen = [];
        const record = () => document.querySelectorAll('#tenant-claims [data-phase]').forEach(row => {
            const phase = row.getAttribute('data-phase');
            if (window.phasesSeen[window.phasesSeen.length - 1] !== phase) window.phasesSeen.push(phase);
        });
        new MutationObserver(record).observe(document.body, {subtree: true, childList: true, attributes: true});
    }""")
    gpu = pool("one", "gpu")
    cell = f"#pool-{gpu.pk}-quantity"
    page.fill(f"{cell} input[name=quantity]", "1")
    page.click(f"{cell} button")
    page.wait_for_selector(f"#pool-{gpu.pk}-saved")
    claim = wait_for(lambda: NodeClaim.objects.filter(tenant__name="one", pool_name="gpu").first(), timeout=30)
    row = f"#tenant-claims #claim-{claim.pk}"
    page.wait_for_selector(f'{row}[data-phase="{ClaimPhase.AVAILABLE}"]', timeout=240_000)
    seen = page.evaluate("window.phasesSeen")
    order = [ClaimPhase.PENDING, ClaimPhase.PROVISIONING, ClaimPhase.JOINING, ClaimPhase.AVAILABLE]
    assert seen[-1] == "Available" and len(seen) >= 2, seen  # it changed in place, at least once before Available
    assert seen == sorted(seen, key=order.index), seen  # forward only
    assert "Provisioning" in seen, seen  # writing the image takes seconds: never skipped
    page.wait_for_selector('#tenant-nodes tr[data-node="gpu-01"]')
    assert page.evaluate("window.sameDocument") == "not reloaded"  # every change came over the websocket
    assert "gpu-01" in {n["metadata"]["name"] for n in lab.tenants["one"].objects("nodes")}

    page.goto(f"/claims/{claim.name}/")
    wait_live(page)
    for step in ("power_on_pxe", "agent_lookup", "write_image", "write_seed", "reboot_to_disk", "boot_from_disk",
                 "node_ready", "node_labels"):
        bar = page.locator(f"#step-provision-{step}")
        assert bar.get_attribute("data-status") == "done", step
        assert re.fullmatch(r"\d+\.\d s", bar.locator(".step-duration").inner_text()), step
