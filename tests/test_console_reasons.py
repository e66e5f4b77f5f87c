"""The reason in sight while it happens: a failed step on the claim page carries its reason, a claim given another
host says so, its timeline separates the attempts per host (time on a failed host is not "allocate"), and the
fleet board's error column can be read whole. (A retrying step's error on the host page, live, in Chromium:
tests/test_console_reasons_browser.py.)"""
import re
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.engine import drive as engine
from hosts.engine.flow import Run, StepFailed
from hosts.lifecycle import FLOWS
from hosts.models import BareMetalHost
from pools.models import Tenant, TenantMembership

from .lab_conftest import gpu_pool

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.console_conftest"]
PASSWORD = "pw-reasons-5e1b"
WRITE_ERROR = "agent: write_image: /dev/vda: Input/output error at sector 81920"


def client_for(username: str, **flags) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(username, f"{username}@example.invalid", PASSWORD, **flags))
    return client


def html_of(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return unescape(response.content.decode())


def element(html: str, dom_id: str) -> str:
    """The text of the element with this id (its tags stripped), up to its row's end."""
    found = re.search(rf'id="{dom_id}"(.*?)(?=<div class="row"|<div class="attempt"|</table>|\Z)', html, re.S)
    assert found, f"no #{dom_id}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip()


def attribute(html: str, dom_id: str, name: str) -> str:
    found = re.search(rf'<[^>]*id="{dom_id}"[^>]*\b{name}="([^"]*)"', html)
    assert found, f"no {name} on #{dom_id}"
    return found.group(1)


def step(host: BareMetalHost, name: str, message: str, duration_s: float | None = None):
    """A step Event of the host's provision flow, as the step engine writes it."""
    run = Run(BareMetalHost.objects.select_related("claim__tenant").get(pk=host.pk))
    run.flow = {"name": "provision"}
    engine._step_event(run, name, message, duration_s=duration_s)
    return run


@pytest.fixture
def retried_claim(apply, demo_site):
    """Tenant one's gpu claim: gpu-01 failed it at write_image after 280 s (its steps backdated), the claim went
    back to Pending and got gpu-02 10 s later. Only gpu-01 and gpu-02 are free."""
    BareMetalHost.objects.filter(labels__role="gpu").exclude(name__in=["gpu-01", "gpu-02"]).update(state="maintenance")
    BareMetalHost.objects.filter(name="gpu-02").update(state="maintenance")
    apply(gpu_pool(1), tenant="one")
    call_command("reconcile")
    claim = NodeClaim.objects.get()
    gpu01 = claim.host
    assert gpu01.name == "gpu-01"
    step(gpu01, "power_on_pxe", "started")
    step(gpu01, "power_on_pxe", "done", duration_s=40)
    step(gpu01, "write_image", "started")
    run = step(gpu01, "write_image", f"failed: {WRITE_ERROR}", duration_s=240)
    run.host.flow = run.flow = {"name": "provision", "id": "f1", "done": {}, "data": {}}
    FLOWS["provision"].fail(run, next(s for s in FLOWS["provision"].steps if s.name == "write_image"),
                            StepFailed(WRITE_ERROR, clean=True))
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.PENDING and claim.failed_hosts == ["gpu-01"]
    BareMetalHost.objects.filter(name="gpu-02").update(state="available")
    call_command("reconcile")
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.PROVISIONING and claim.host.name == "gpu-02"
    step(claim.host, "power_on_pxe", "started")

    # The times a real run would have: created at -300 s, gpu-01 from -290 s to -10 s, back to Pending at -10 s.
    now = timezone.now()
    at = lambda s: now - timedelta(seconds=s)  # noqa: E731
    NodeClaim.objects.filter(pk=claim.pk).update(created_at=at(300))
    events = list(Event.objects.filter(claim_id=claim.pk).order_by("pk"))
    first_scheduled = next(e for e in events if e.to_state == ClaimPhase.PROVISIONING)
    back = next(e for e in events if e.to_state == ClaimPhase.PENDING and e.from_state == ClaimPhase.PROVISIONING)
    for e in events:
        if e.pk <= first_scheduled.pk:
            when = at(290)
        elif e.host_id == gpu01.pk and e.kind == "step":
            when = {("power_on_pxe", "started"): at(290), ("power_on_pxe", "done"): at(250),
                    ("write_image", "started"): at(250)}.get((e.step, e.message), at(10))
        elif e.pk <= back.pk:
            when = at(10)
        else:
            continue
        Event.objects.filter(pk=e.pk).update(created_at=when)
    return NodeClaim.objects.get(pk=claim.pk)


def test_a_failed_step_on_the_claim_page_carries_its_reason(retried_claim):
    admin = client_for("root-admin", is_staff=True, is_superuser=True)
    html = html_of(admin, f"/claims/{retried_claim.name}/")
    assert attribute(html, "step-provision-write_image", "data-status") == "failed"
    assert WRITE_ERROR in element(html, "step-provision-write_image")


def test_a_claim_given_another_host_says_so_instead_of_only_allocated(retried_claim):
    assert retried_claim.message == "a gpu-server host was allocated: gpu-02, attempt 2 (gpu-01 failed it before)"
    admin = client_for("root-admin", is_staff=True, is_superuser=True)
    html = html_of(admin, f"/claims/{retried_claim.name}/")
    assert "gpu-01 failed it before" in html[html.index('id="claim-summary"'):html.index('id="claim-steps"')]


def test_the_claims_timeline_separates_the_attempts_per_host(retried_claim):
    admin = client_for("root-admin", is_staff=True, is_superuser=True)
    html = html_of(admin, f"/claims/{retried_claim.name}/")
    assert (attribute(html, "attempt-1", "data-host"), attribute(html, "attempt-1", "data-outcome")) == \
        ("gpu-01", "failed")
    first = element(html, "attempt-1")
    assert "provision failed at write_image" in first and WRITE_ERROR in first
    assert (attribute(html, "attempt-2", "data-host"), attribute(html, "attempt-2", "data-outcome")) == \
        ("gpu-02", ClaimPhase.PROVISIONING)
    # Each attempt's steps under it: the same step on both hosts, two rows.
    assert attribute(html, "step-provision-power_on_pxe", "data-attempt") == "1"
    assert attribute(html, "step-provision-power_on_pxe-a2", "data-attempt") == "2"
    assert attribute(html, "step-provision-power_on_pxe-a2", "data-status") == "running"
    # "allocate" is the wait for a host only: 10 s before gpu-01, 10 s before gpu-02; not the 280 s on gpu-01.
    first_wait = float(attribute(html, "step-claim-allocate", "data-duration"))
    second_wait = float(attribute(html, "step-claim-allocate-a2", "data-duration"))
    assert 9 < first_wait < 12 and 9 < second_wait < 30
    seed = html[html.index('id="claim-seed"'):]
    allocate_row = re.search(r"<td>1</td>.*?</tr>", seed, re.S).group(0)
    seconds = float(re.search(r"([\d.]+) s", re.sub(r"<[^>]+>", "", allocate_row)).group(1))
    assert seconds == pytest.approx(first_wait + second_wait, abs=0.2)
    earlier = element(html, "claim-seed-earlier")
    assert "gpu-01" in earlier and "280.0 s" in earlier


def test_the_reasons_on_a_claim_page_stay_within_its_tenant(retried_claim, apply):
    apply(gpu_pool(0), tenant="two")
    alice, bob = client_for("alice"), client_for("bob")
    TenantMembership.objects.create(tenant=Tenant.objects.get(name="one"), user=User.objects.get(username="alice"))
    TenantMembership.objects.create(tenant=Tenant.objects.get(name="two"), user=User.objects.get(username="bob"))
    assert WRITE_ERROR in html_of(alice, f"/claims/{retried_claim.name}/")
    assert bob.get(f"/claims/{retried_claim.name}/").status_code == 404
    assert WRITE_ERROR not in bob.get("/claims/").content.decode()


def test_a_retrying_step_shows_its_last_error_tries_and_deadline_on_the_host_and_claim_pages(retried_claim):
    claim = retried_claim
    host = claim.host
    run = Run(BareMetalHost.objects.select_related("claim__tenant").get(pk=host.pk))
    run.flow = {"name": "provision", "id": "f2", "state_since": "", "done": {}, "data": {},
                "step": "power_on_pxe", "step_started_at": timezone.now().isoformat()}
    run.save_flow()
    for _ in range(3):
        engine.step_retry(run, "BMC unreachable: connection refused", recheck_s=None)
    # One Event for the error (its first try), not one per try.
    assert Event.objects.filter(host=host, step="power_on_pxe", message__startswith="retrying: ").count() == 1
    admin = client_for("root-admin", is_staff=True, is_superuser=True)
    page = html_of(admin, f"/hosts/{host.name}/")
    assert attribute(page, "host-step-error", "data-retries") == "3"
    shown = re.sub(r"<[^>]+>", "", re.search(r'id="host-step-error"[^>]*>(.*?)</dd>', page, re.S).group(1))
    assert "power_on_pxe failed 3 times" in shown and "BMC unreachable: connection refused" in shown
    assert "trying again until" in shown  # the step's deadline
    assert "deadline" in re.search(r'id="host-step-times"[^>]*>(.*?)</span>', page, re.S).group(1)
    claim_page = html_of(admin, f"/claims/{claim.name}/")
    now_line = re.sub(r"<[^>]+>", "", re.search(r'id="claim-now"[^>]*>(.*?)</p>', claim_page, re.S).group(1))
    assert "power_on_pxe on gpu-02" in now_line and "deadline" in now_line
    assert "failed 3 times, trying again; the last error: BMC unreachable: connection refused" in now_line
    # A new error is recorded as such; the step's end clears what the page shows.
    engine.step_retry(run, "BMC timed out after 10s", recheck_s=None)
    assert Event.objects.filter(host=host, step="power_on_pxe", message__startswith="retrying: ").count() == 2
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"name": "provision", "done": {}})
    assert 'id="host-step-error"' not in html_of(admin, f"/hosts/{host.name}/")


def test_the_fleet_board_shows_a_long_error_whole_on_demand(demo_site):
    reason = ("register failed at bmc_check: bmc_check did not finish within 60s; last error: BMC unreachable: "
              "connection refused (the port of the BMC at rack r2 is closed)")
    BareMetalHost.objects.filter(name="gpu-03").update(state="error", error_type="register error",
                                                       error_message=reason)
    admin = client_for("root-admin", is_staff=True, is_superuser=True)
    html = html_of(admin, "/hosts/")
    row = re.search(r'<tr id="host-\d+"[^>]*>(?:(?!</tr>).)*gpu-03(?:(?!</tr>).)*</tr>', html, re.S).group(0)
    cell = re.search(r'<td class="small host-error">(.*?)</td>', row, re.S).group(1)
    assert f'title="{reason}"' in cell  # on hover
    assert re.search(r'<details class="clipped">.*<span class="clipped-whole">' + re.escape(reason), cell, re.S)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_host_page_is_told_of_each_try_live_even_when_the_error_repeats(client, users):
    """A try that repeats the last error writes no Event; the host's page still gets its new count (a live message
    on commit, as for agent progress)."""
    from channels.db import database_sync_to_async as sync_to_async

    from .console_conftest import connect, latest_event, receive_until, resync, session_cookie

    def retrying_host():
        host = BareMetalHost.objects.filter(state="available").order_by("name").first()
        BareMetalHost.objects.filter(pk=host.pk).update(state="registering")
        host.refresh_from_db()
        run = Run(host)
        run.flow = {"name": "register", "id": "r1", "state_since": host.state_changed_at.isoformat(), "done": {},
                    "data": {}, "step": "bmc_check", "step_started_at": timezone.now().isoformat()}
        run.save_flow()
        engine.step_retry(run, "BMC unreachable: connection refused", recheck_s=None)
        return run

    run = await sync_to_async(retrying_host)()
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    communicator = await connect(f"/ws/hosts/{run.host.pk}/", cookie)
    await resync(communicator, since=await latest_event())
    await sync_to_async(engine.step_retry)(run, "BMC unreachable: connection refused", recheck_s=None)
    frame = await receive_until(communicator, 'id="host-step-error"[^>]*data-retries="2"')
    assert "bmc_check failed 2 times" in frame
    await communicator.disconnect()
