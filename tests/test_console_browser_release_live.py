"""Pages that follow a release, in real Chromium without a reload: an open host page lists the erase certificate
and the health run its release gate writes, as the gate writes them; an open pool page keeps a released claim
listed, Releasing with its host's step, until it is Released."""
import uuid

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.phases import claims_release, claims_transition
from events.choices import EventKind, ObjectType
from events.services import event_record
from hosts.choices import HostState
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun
from pools.models import NodeProvider

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, screenshot, wait_live, with_thread  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def serving(users):
    """gpu-01 serves tenant one's claim one-rl7x in pool gpu, Available."""
    host = BareMetalHost.objects.get(name="gpu-01")
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.PROVISIONED)
    claim = NodeClaim.objects.create(name="one-rl7x", tenant=users["alice"].tenant_memberships.get().tenant,
                                     provider=NodeProvider.objects.get(name="metal3"), pool=pool("one", "gpu"),
                                     pool_name="gpu", host=host, host_name=host.name, phase=ClaimPhase.AVAILABLE)
    return {"host": BareMetalHost.objects.get(pk=host.pk), "claim": claim}


def gate_writes_its_records(*, host: BareMetalHost) -> None:
    """What a release gate leaves (as data): a certificate for a disk and a health run, then its step's end."""
    flow_id = str(uuid.uuid4())
    EraseCertificate.objects.create(host=host, host_name=host.name, flow_id=flow_id, disk="nvme7n1",
                                    serial="SN-LIVE-0007", method="full", method_type="Purge", result="pass",
                                    previous_tenant="one", claim_name="one-rl7x", document={"disk": "nvme7n1"},
                                    signature="test-signature", key_id="test-key")
    HealthCheckRun.objects.create(host=host, host_name=host.name, flow_id=flow_id, suite="dcgmi", verdict="pass",
                                  reasons=["all GPUs passed level 2"])
    event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host=host,
                 step="health_dcgm", actor="system:flow", message="done")


def test_a_certificate_and_a_health_run_appear_live_on_an_open_host_page(browser_page, serving):
    page = browser_page
    log_in(page, "root-admin")
    page.goto("/hosts/gpu-01/")
    wait_live(page)
    assert page.locator("#host-certificates").count() == 0  # "None yet."
    page.evaluate("window.sameDocument = 'not reloaded'")

    with_thread(gate_writes_its_records, host=serving["host"])

    page.wait_for_selector("#host-certificates td:has-text('nvme7n1')")
    assert "SN-LIVE-0007" in page.inner_text("#host-certificates")
    page.wait_for_selector("#host-health td:has-text('dcgmi')")
    assert page.evaluate("window.sameDocument") == "not reloaded"


def test_a_releasing_claim_stays_listed_live_on_the_pool_page_until_it_is_released(browser_page, serving):
    page = browser_page
    claim = serving["claim"]
    log_in(page, "alice")
    page.goto("/tenants/one/pools/gpu/")
    wait_live(page)
    page.wait_for_selector(f'#node-{claim.pk}[data-phase="Available"]')
    page.evaluate("window.sameDocument = 'not reloaded'")

    with_thread(claims_release, claims=[claim], actor="user:alice", reason="quantity lowered")

    row = page.wait_for_selector(f'#node-{claim.pk}[data-phase="Releasing"]')
    assert "gpu-01" in row.inner_text()
    assert "1 releasing" in page.inner_text("#pool-nodes-total")
    assert "No claim in this pool" not in page.inner_text("#pool-nodes-table")
    screenshot(page, "pool-releasing.png")

    # The host's release ends: the claim is Released and leaves the list.
    released = NodeClaim.objects.get(pk=claim.pk)
    with_thread(claims_transition, claims=[released], to_phase=ClaimPhase.RELEASED, actor="system:flow",
                reason="Released", fields={"host": None})
    page.wait_for_selector(f"#node-{claim.pk}", state="detached")
    assert "No claim in this pool" in page.inner_text("#pool-nodes-table")
    assert page.evaluate("window.sameDocument") == "not reloaded"
