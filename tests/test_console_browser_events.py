"""The Event log in Chromium: each row links to its host, claim, pool and tenant; a search by name, tenant and a
From/To range; by default what changed and what failed, every step on demand; live rows under the same filters,
with the same links."""
from datetime import timedelta

import pytest
from django.utils import timezone

from claims.models import NodeClaim
from events.choices import EventKind, ObjectType
from events.services import event_record

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, pool, wait_live, with_thread  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)


def step(host, claim, name: str, message: str) -> None:
    event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host=host, claim=claim,
                 tenant_id=claim.tenant_id, step=name, message=message, actor="system:flow",
                 data={"flow": "provision"})


def rows(page) -> list[str]:
    return [text for text in page.locator("#event-log-rows tr").all_inner_texts()]


def filter_by(page, **fields) -> None:
    for name, value in fields.items():
        if name in ("steps", "tenant", "object_type", "kind"):
            page.select_option(f"form.filters select[name={name}]", label=value)
        else:
            page.fill(f"form.filters input[name={name}]", value)
    page.click("form.filters button[type=submit]")
    page.wait_for_load_state()


def test_the_event_log_links_its_rows_and_filters_them_by_name_tenant_time_and_steps(browser_page, users):
    from claims.allocation import claims_allocate
    from claims.reconcile import pools_reconcile

    cpu = pool("two", "cpu")
    pools_reconcile(pool_ids=[cpu.pk])
    claims_allocate(pool_ids=[cpu.pk])
    claim = NodeClaim.objects.select_related("host").get(tenant__name="two")
    host = claim.host
    step(host, claim, "write_image", "done")
    step(host, claim, "boot_from_disk", "failed: no bootable disk")
    event_record(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name="cpu", tenant_id=claim.tenant_id,
                 actor="system:autonodes", message="not added: limit nodes 1 reached")

    page = browser_page
    log_in(page, "root-admin")
    page.goto("/events/")
    wait_live(page)
    shown = "\n".join(rows(page))
    # By default: what changed and what failed, not every step's start and end.
    assert "failed: no bootable disk" in shown and "write_image" not in shown
    assert page.locator("form.filters select[name=steps] option:checked").inner_text() == "failed steps only"

    failed = page.locator("#event-log-rows tr", has_text="failed: no bootable disk")
    assert failed.locator('a[data-link="host"]').get_attribute("href") == f"/hosts/{host.name}/"
    assert failed.locator('a[data-link="claim"]').get_attribute("href") == f"/claims/{claim.name}/"
    assert failed.locator('a[data-link="tenant"]').get_attribute("href") == "/tenants/two/"
    decision = page.locator("#event-log-rows tr", has_text="not added: limit nodes 1 reached")
    assert decision.locator('a[data-link="pool"]').inner_text() == "cpu"
    assert decision.locator('a[data-link="pool"]').get_attribute("href") == "/tenants/two/pools/cpu/"
    failed.locator('a[data-link="claim"]').click()
    page.wait_for_load_state()
    assert page.url.endswith(f"/claims/{claim.name}/")

    page.goto("/events/")
    filter_by(page, steps="every step")
    assert any("write_image" in row for row in rows(page))

    filter_by(page, name=host.name)  # the search keeps "every step"
    found = rows(page)
    assert found and all(host.name in row for row in found)
    assert any("write_image" in row for row in found)

    page.goto("/events/")
    filter_by(page, tenant="one")
    assert not [row for row in rows(page) if "two" in row.split()]
    filter_by(page, tenant="two")
    assert any("failed: no bootable disk" in row for row in rows(page))

    now = timezone.now()
    page.goto("/events/")
    filter_by(page, since=(now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))
    assert page.locator("#event-log-empty").is_visible()
    filter_by(page, since=(now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
              until=(now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))
    assert any("failed: no bootable disk" in row for row in rows(page))

    # Live: a new row arrives under the page's filters (the name, the default steps), with its links.
    page.goto(f"/events/?name={host.name}")
    wait_live(page)
    page.evaluate("window.sameDocument = 'not reloaded'")
    with_thread(step, host=host, claim=claim, name="node_ready", message="done")  # a step that went well: not shown
    with_thread(step, host=host, claim=claim, name="node_labels", message="failed: labels refused")
    live = page.locator("#event-log-rows tr", has_text="failed: labels refused")
    live.wait_for()
    assert live.locator('a[data-link="claim"]').get_attribute("href") == f"/claims/{claim.name}/"
    assert live.locator('a[data-link="host"]').get_attribute("href") == f"/hosts/{host.name}/"
    assert "node_ready" not in "\n".join(rows(page))
    assert page.evaluate("window.sameDocument") == "not reloaded"
