"""One "needs attention" list (hosts.selectors.hosts_needing_attention) on the repair page and the fleet board:
hosts in error, in repair and past their deadline, each with its reason and the action that fixes it."""
from datetime import timedelta
from html import unescape

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from hosts.models import BareMetalHost
from hosts.selectors import attention_explain, hosts_needing_attention
from hosts.services import host_transition

pytestmark = pytest.mark.django_db


def login(username: str, **flags) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(username, f"{username}@example.invalid", "pw-attention-8e4f",
                                                **flags))
    return client


@pytest.fixture
def admin(demo_site) -> Client:
    return login("root-admin", is_staff=True, is_superuser=True)


@pytest.fixture
def auditor(demo_site) -> Client:
    client = login("audrey")
    User.objects.get(username="audrey").groups.add(Group.objects.get_or_create(name="auditors")[0])
    return client


def failed_release(name: str, why: str) -> BareMetalHost:
    """A host whose release failed: provisioned, deprovisioning, then error with the flow's reason."""
    host = BareMetalHost.objects.get(name=name)
    for state in ("provisioning", "deprovisioning"):
        host_transition(host=host, to_state=state, actor="test")
    host_transition(host=host, to_state="error", actor="system:flow", reason=why, step="erase")
    return host


def html(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return unescape(response.content.decode())


def row(page: str, row_id: str) -> str:
    start = page.index(f'id="{row_id}"')
    return page[start: page.index("</tr>", start)]


def test_two_hosts_in_error_after_a_failed_release_are_on_the_repair_page_and_the_board(admin):
    one = failed_release("gpu-01", "deprovision failed at erase: BMC unreachable (connection refused)")
    two = failed_release("gpu-02", "deprovision failed at erase: agent did not answer")
    repair = html(admin, reverse("repair"))
    for host, why in ((one, "BMC unreachable"), (two, "agent did not answer")):
        shown = row(repair, f"repair-{host.pk}")
        assert why in shown and 'class="badge badge-' in shown
        assert reverse("host-action", args=[host.name, "retry"]) + "?next=repair" in shown
    board = html(admin, reverse("fleet"))
    assert 'id="attention-total">(2)<' in board
    for host, why in ((one, "BMC unreachable"), (two, "agent did not answer")):
        shown = row(board, f"attention-{host.pk}")
        assert why in shown and reverse("host-action", args=[host.name, "retry"]) in shown
    assert 'id="attention-more"' not in board


def test_a_host_past_its_deadline_needs_attention_and_says_what_to_check(admin, auditor):
    host = BareMetalHost.objects.get(name="gpu-03")
    host_transition(host=host, to_state="inspecting", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(deadline_at=timezone.now() - timedelta(minutes=5))
    [shown] = attention_explain(list(hosts_needing_attention()))
    assert (shown.name, shown.overdue) == ("gpu-03", True)
    assert shown.why.startswith("inspecting past its deadline") and "the sweeper then moves it to error" in \
        shown.fix["hint"]
    for page in (html(admin, reverse("repair")), html(auditor, reverse("repair"))):
        shown = row(page, f"repair-{host.pk}")
        assert "overdue" in shown and "inspecting past its deadline" in shown and "workers" in shown
    board = row(html(auditor, reverse("fleet")), f"attention-{host.pk}")
    assert "overdue" in board and "workers" in board
    # Auditors see the fix, but no button to do it.
    BareMetalHost.objects.filter(pk=host.pk).update(deadline_at=timezone.now() + timedelta(minutes=5))
    failed_release("gpu-04", "deprovision failed at erase: disk gone")
    gpu4 = BareMetalHost.objects.get(name="gpu-04")
    board = row(html(auditor, reverse("fleet")), f"attention-{gpu4.pk}")
    assert "<b>Retry</b>" in board and reverse("host-action", args=["gpu-04", "retry"]) not in board
    assert f'id="attention-{host.pk}"' not in html(auditor, reverse("fleet"))  # within its deadline again


def test_repair_comes_after_errors_with_retest_or_return_to_service_as_the_fix(admin):
    broken = BareMetalHost.objects.get(name="cpu-01")
    for state in ("provisioning", "deprovisioning"):
        host_transition(host=broken, to_state=state, actor="test")
    host_transition(host=broken, to_state="repair", actor="system:flow", reason="health_dcgm: XID 48 on GPU 3")
    failed_release("cpu-02", "deprovision failed at erase: disk gone")
    rows = attention_explain(list(hosts_needing_attention()))
    assert [(h.name, h.fix["action"]) for h in rows] == [("cpu-02", "retry"), ("cpu-01", "retest")]
    assert rows[1].why == "health_dcgm: XID 48 on GPU 3"
    host_transition(host=broken, to_state="retesting", actor="test")
    host_transition(host=broken, to_state="repair", actor="system:flow", reason="retest passed",
                    data={"retest": "passed"})
    rows = attention_explain(list(hosts_needing_attention()))
    assert rows[1].fix["action"] == "return-to-service"


def test_the_board_shows_the_first_ten_and_links_to_the_rest(admin):
    for i in range(12):
        BareMetalHost.objects.create(name=f"broken-{i:02d}", state="error", boot_mac=f"52:54:00:00:01:{i:02x}",
                                     bmc_address=f"redfish+http://127.0.0.1:1/redfish/v1/Systems/{i}",
                                     error_message=f"broken {i}")
    board = html(admin, reverse("fleet"))
    assert board.count('<tr id="attention-') == 10 and 'id="attention-total">(12)<' in board
    assert 'id="attention-more">All 12 on the repair page' in board
    assert html(admin, reverse("repair")).count('<tr id="repair-') == 12
