"""Acceptance (issue 17.2) in Chromium: a step retrying against a BMC that is down shows its last error, its tries
and its deadline on the host page, live, before the step fails; then the failure's reason. The BMC is the lab's
Redfish emulator with its port closed (the `bmc-down` fault), the step the register flow's bmc_check, driven by
the step engine as a worker drives it."""
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.utils import timezone

from hosts.models import BareMetalHost
from lab.redfish import RedfishLab

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD, log_in, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

BMC_USER, BMC_PASSWORD = "admin", "lab-password-reasons"


@pytest.fixture(scope="module")
def lab():
    with RedfishLab([{"name": "gpu-41", "mac": "52:54:00:00:04:41"}], BMC_USER, BMC_PASSWORD,
                    power_delay=(0.2, 0.4)) as lab:
        yield lab


def in_thread(fn, *args):
    """Run a drive off Playwright's thread (its event loop), as a worker would, with a connection of its own."""
    def call():
        try:
            return fn(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(call).result(timeout=60)


def test_a_retrying_steps_error_is_on_the_host_page_before_the_step_fails(lab, browser_page, settings):
    from hosts.engine.drive import drive
    from hosts.services import host_create

    settings.BMC_TIMEOUT_S = 1
    User.objects.create_user("root-admin", "root@example.invalid", PASSWORD, is_staff=True, is_superuser=True)
    host = host_create(values={"name": "host-gpu-41", "bmc_address": lab.system_address("gpu-41"),
                               "bmc_username": BMC_USER, "bmc_password": BMC_PASSWORD,
                               "boot_mac": "52:54:00:00:04:41"}, actor="test")
    lab.set_fault("gpu-41", "bmc-down")
    try:
        page = browser_page
        log_in(page, "root-admin")
        page.goto(f"/hosts/{host.name}/")
        wait_live(page)
        page.evaluate("window.sameDocument = 'not reloaded'")
        assert page.locator("#host-step-error").count() == 0

        in_thread(drive, host.pk)  # the BMC's port is closed: the step waits to try again
        error = page.locator("#host-step-error")
        error.wait_for()
        text = error.inner_text()
        assert "bmc_check failed 1 time" in text and "BMC unreachable: connection refused" in text
        assert "trying again until" in text  # the step's deadline
        assert page.inner_text("#host-state") == "Registering"  # not failed: still trying
        assert BareMetalHost.objects.get(pk=host.pk).state == "registering"
        # The timeline says it too, once for this error.
        page.wait_for_function("document.querySelector('#host-timeline').textContent"
                               ".includes('retrying: BMC unreachable: connection refused')")

        in_thread(drive, host.pk)  # a second try, the same error: the count follows
        page.wait_for_selector('#host-step-error[data-retries="2"]')
        assert "bmc_check failed 2 times" in page.inner_text("#host-step-error")

        # The step's deadline passes with the BMC still down: it fails, with the last error as its reason.
        flow = BareMetalHost.objects.get(pk=host.pk).flow
        started = timezone.now() - timedelta(seconds=settings.POWER_DEADLINE_S + 1)
        BareMetalHost.objects.filter(pk=host.pk).update(flow={**flow, "step_started_at": started.isoformat()})
        in_thread(drive, host.pk)
        page.wait_for_selector('#host-summary[data-state="error"]')
        assert page.locator("#host-step-error").count() == 0
        assert "last error: BMC unreachable: connection refused" in page.inner_text("#host-summary")
        assert page.evaluate("window.sameDocument") == "not reloaded"
    finally:
        lab.clear_fault("gpu-41")
