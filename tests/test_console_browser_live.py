"""Live lists in real Chromium against daphne: new rows arrive without a reload, with the page's filters
applied; the live badge offers an immediate reconnect; pages that are not live say so."""
import time

import pytest

from claims.models import NodeClaim

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_claim_created_by_apply_appears_on_an_open_filtered_claims_page_within_a_second(
        browser_page, users, apply, seed_block):
    from claims.services import pools_reconcile

    page = browser_page
    log_in(page, "root-admin")
    page.goto("/claims/?pool=gpu")
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    apply(seed_block, tenant="one")  # gpu and cpu to quantity 1
    pools_reconcile(pool_ids=[pool("one", "gpu").pk, pool("one", "cpu").pk])  # what the worker runs on commit
    committed = time.monotonic()
    gpu = NodeClaim.objects.get(tenant__name="one", pool_name="gpu")
    cpu = NodeClaim.objects.get(tenant__name="one", pool_name="cpu")
    page.wait_for_selector(f"#claims-rows > tr#claim-{gpu.pk}:first-child")
    assert time.monotonic() - committed < 1.0
    assert page.locator(f"#claim-{cpu.pk}").count() == 0
    assert page.locator("#claims-empty").count() == 0
    assert page.evaluate("window.sameDocument") == "not reloaded"
