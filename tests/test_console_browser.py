"""The console in real Chromium (Debian's, driven by Playwright) against a real ASGI server (daphne): the
live views change the page over the websocket, without a reload. Writes the README's screenshots."""
import re
import time
from collections.abc import Iterator

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from hosts.choices import HostState
from hosts.models import BareMetalHost, HostCommand
from hosts.services import host_set_maintenance

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import bmc_addresses, log_in, pool, screenshot, stages, wait_live, with_thread  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

PROVISION_STEPS = [  # (step, seconds on a real GPU server): the seed's proportions, step 4 the longest
    ("power_on_pxe", 41.0), ("agent_lookup", 23.5), ("inspect", 0.4), ("write_image", 162.0), ("write_seed", 1.2),
    ("reboot_to_disk", 2.1), ("boot_from_disk", 38.0), ("node_ready", 47.3), ("node_labels", 0.3)]
TIME_SCALE = 0.01  # the drive takes these times a hundred times faster: about 3 s in all


@pytest.fixture
def gpu_hosts_busy(users):
    """No gpu host is free: gpu-01 waits in the repair pool, the others are in maintenance (set up
    directly, as data). A new gpu claim stays Pending until gpu-01 comes back."""
    BareMetalHost.objects.filter(labels__role="gpu").update(state=HostState.MAINTENANCE)
    BareMetalHost.objects.filter(name="gpu-01").update(state=HostState.REPAIR)
    return users


def drive_claim_to_available(pool_id: int) -> Iterator[str]:
    """Drive tenant one's new gpu claim the way the reconciler and the provisioning flow do, through their
    own functions, yielding after each change so that the test can watch the page. The provisioning lab
    (a real worker, Redfish BMCs, agents) can stand in for this function, yielding at the same points."""
    from claims import steps as claim_steps
    from claims.allocation import claims_allocate
    from claims.reconcile import pools_reconcile
    from hosts.engine import drive
    from hosts.engine.flow import Run
    from hosts.services import publish_progress
    from hosts.services import host_transition

    pools_reconcile(pool_ids=[pool_id])  # the reconcile the quantity change asked for: a claim, no free host
    yield ClaimPhase.PENDING
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state=HostState.AVAILABLE, actor="test:repair", reason="repaired")
    claims_allocate(pool_ids=[pool_id])
    yield ClaimPhase.PROVISIONING
    host = BareMetalHost.objects.select_related("claim__tenant", "claim__node_type").get(name="gpu-01")
    run = Run(host)
    run.flow = {"name": "provision"}
    for step, seconds in PROVISION_STEPS:
        started = time.monotonic()
        drive._step_event(run, step, "started")
        if step == "write_image":
            command = HostCommand.objects.create(host=host, flow_id="drive", step=step, name=step, status="sent",
                                                 progress=0.0)
            for percent in (35.0, 80.0):
                HostCommand.objects.filter(pk=command.pk).update(progress=percent, message=f"{percent:.0f}% written")
                publish_progress(host.pk)
                yield f"progress {percent:.0f}"
            HostCommand.objects.filter(pk=command.pk).update(status="done", progress=100.0)
        time.sleep(max(0.0, seconds * TIME_SCALE - (time.monotonic() - started)))
        drive._step_event(run, step, "done", duration_s=time.monotonic() - started)
        if step == "boot_from_disk":
            claim_steps.claim_joining(run)
            yield ClaimPhase.JOINING
    # the claim's reaction to its host's move (claims.reactions) makes it Available
    host_transition(host=run.host, to_state=HostState.PROVISIONED, actor="system:flow", reason="provision done")
    yield ClaimPhase.AVAILABLE


def test_admin_sets_a_pool_and_watches_the_claim_become_available_without_a_reload(browser_page, gpu_hosts_busy):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/tenants/one/")
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    gpu = pool("one", "gpu")
    cell = f"#pool-{gpu.pk}-quantity"
    page.fill(f"{cell} input[name=quantity]", "1")
    page.click(f"{cell} button")
    page.wait_for_selector(f"#pool-{gpu.pk}-saved")
    assert pool("one", "gpu").quantity == 1

    claim = None
    messages_before = page.evaluate("window.liveMessages || 0")
    for stage in stages(drive_claim_to_available(gpu.pk)):
        claim = claim or NodeClaim.objects.get(tenant__name="one", pool_name="gpu")
        row = f"#tenant-claims #claim-{claim.pk}"
        if stage.startswith("progress"):
            percent = stage.split()[1]
            page.wait_for_function(
                f"document.querySelector('{row}') && document.querySelector('{row}').textContent.includes('{percent}%')")
            if percent == "80":
                screenshot(page, "tenant.png")
            continue
        page.wait_for_selector(f'{row}[data-phase="{stage}"]')
        if stage == ClaimPhase.PENDING:  # created "waiting for a host", then the allocator says why it waits
            page.wait_for_function(f"document.querySelector('{row}').textContent.includes('no free host')")
    page.wait_for_selector('#tenant-nodes tr[data-node="gpu-01"]')
    assert page.evaluate("window.sameDocument") == "not reloaded"
    assert page.evaluate("window.liveMessages") >= messages_before + 5  # every change came over the websocket
    # The pool's count follows the claim's phase in a message of its own: wait for it, as a reader would.
    page.wait_for_function(f"document.querySelector('#pool-{gpu.pk}-claims').textContent.trim() === '1 Available'")

    page.goto(f"/claims/{claim.name}/")
    wait_live(page)
    for step, seconds in PROVISION_STEPS:
        bar = page.locator(f'#step-provision-{step}')
        assert bar.get_attribute("data-status") == "done"
        assert float(bar.get_attribute("data-duration")) >= seconds * TIME_SCALE * 0.9
        assert re.fullmatch(r"\d+\.\d s", bar.locator(".step-duration").inner_text())
    assert page.locator("#step-claim-allocate .step-duration").count() == 1
    shares = [float(s) for s in re.findall(r"([\d.]+)%", page.inner_text("#claim-seed"))]
    assert len(shares) == 6 and max(shares) == shares[3]  # the seed's step 4, writing the image, is the longest
    screenshot(page, "claim-timeline.png")

    page.goto("/hosts/gpu-01/")
    wait_live(page)
    assert "provisioned" in page.inner_text("#host-summary").lower()
    assert "redfish" in page.inner_text("#host-bmc")
    screenshot(page, "host.png")


def test_the_fleet_board_moves_hosts_live(browser_page, users):
    page = browser_page
    log_in(page, "root-admin")
    assert page.url.endswith("/hosts/")
    wait_live(page)
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    before = int(page.inner_text("#count-maintenance"))
    page.evaluate("window.sameDocument = 'not reloaded'")
    with_thread(host_set_maintenance, host=host, on=True, actor="test", reason="fan swap")
    page.wait_for_selector(f'#host-{host.pk}[data-state="maintenance"]')
    page.wait_for_function(f"document.getElementById('count-maintenance').textContent.trim() === '{before + 1}'")
    assert page.evaluate("window.sameDocument") == "not reloaded"
    screenshot(page, "fleet-board.png")


def test_a_member_of_two_sees_nothing_of_one_and_no_bmc_address(browser_page, users):
    page = browser_page
    log_in(page, "bob")
    assert page.url.endswith("/tenants/two/")
    seen = [page.content()]
    for url, status in (("/tenants/one/", 404), ("/hosts/", 403), ("/timing/", 403), ("/apply/", 403),
                        ("/node-types/", 403), (f"/hosts/{BareMetalHost.objects.first().name}/", 404)):
        response = page.goto(url)
        assert response.status == status, url
        seen.append(page.content())
    for url in ("/tenants/", "/claims/", "/events/"):
        assert page.goto(url).status == 200
        seen.append(page.content())
    for html in seen:
        for address in bmc_addresses():
            assert address not in html
    assert not re.search(r">\s*one\s*<", "".join(seen))


def test_quota_exceeded_shows_a_clear_error_and_changes_nothing(browser_page, users):
    page = browser_page
    log_in(page, "alice")
    wait_live(page)
    gpu = pool("one", "gpu")
    cell = f"#pool-{gpu.pk}-quantity"
    page.fill(f"{cell} input[name=quantity]", "3")
    page.click(f"{cell} button")
    error = page.wait_for_selector(f"#pool-{gpu.pk}-error")
    assert error.inner_text() == "tenant one may have at most 2 node(s); these pools ask for 3"
    assert pool("one", "gpu").quantity == 0
    assert not NodeClaim.objects.filter(tenant__name="one").exists()


def test_a_secret_that_reaches_the_browser_fails_the_test(browser_page, users, no_secrets_leak):
    from tests.api_conftest import SecretLeak

    page = browser_page
    log_in(page, "root-admin")
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).order_by("name").first()
    # A BMC password that is also a word the board shows: each page and frame that names the host carries it.
    BareMetalHost.objects.filter(pk=host.pk).update(bmc_password=f"host-{host.pk}")
    page.reload()
    wait_live(page)
    with_thread(host_set_maintenance, host=host, on=True, actor="test", reason="fan swap")
    page.wait_for_selector(f'#host-{host.pk}[data-state="maintenance"]')
    with pytest.raises(SecretLeak, match="the browser received"):
        no_secrets_leak.finish()  # what the fixture does when the test ends
    assert {leak.split(" → ")[0] for leak in no_secrets_leak.leaks} >= {"GET /hosts/", "WS /ws/fleet/"}


def test_join_node_shows_a_command_that_the_copy_button_copies(browser_page, users):
    from lab.kube import TenantAPIServer
    from pools.models import Tenant

    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    with TenantAPIServer("one") as api:  # the lab's tenant API: plain HTTP, no CA to pin
        tenant = Tenant.objects.get(name="one")
        tenant.kubeconfig = api.kubeconfig()
        tenant.save(update_fields=["kubeconfig"])
        log_in(page, "alice")
        page.goto("/tenants/one/")
        page.click("#join-button")
        command = page.wait_for_selector("#join-command-text").inner_text()
        assert command.startswith("curl -fsSL \"http://") and "-k" not in command.split()
        assert "plain HTTP (no TLS)" in page.inner_text("#join-note")
        page.click("#join-copy")
        page.wait_for_function("document.getElementById('join-copy-status').textContent.length > 0")
        assert page.inner_text("#join-copy-status") == "Copied."
        assert page.evaluate("navigator.clipboard.readText()") == command
