"""Capacity at a glance: can the fleet serve the next claim. Hosts record their BMC's last answer (the flows' BMC
calls, the power cycle, the periodic check of available hosts against real Redfish BMCs, here the lab's emulator
and closed ports); the fleet board's capacity card, its live updates and GET /api/v1/capacity/ count a host
whose BMC does not answer as held back, not available (hosts.capacity.COLUMNS)."""
import socket

import pytest
from django.test import Client
from django.urls import reverse

from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_bmc_contact, hosts_bmc_check_due
from hosts.tasks import check_bmcs
from lab.redfish import RedfishLab

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import log_in, wait_live  # noqa: E402

pytest_plugins = ["tests.console_conftest"]

BMC_USER, BMC_PASSWORD = "admin", "lab-bmc-password-4c1e"
ROLE_OF_TYPE = {"gpu-server": "gpu", "cpu-server": "cpu"}  # the demo's NodeTypes select hosts by their role
DEAD = ("gpu-02", "gpu-03", "cpu-02")  # their BMCs do not answer (a closed port)
CARD = ("available", "held_back", "provisioned", "repair", "error", "bmc_red")  # the columns these tests touch


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redfish(console_site):
    """Every demo host's BMC is the lab's emulator, except DEAD's, which point at a port nobody listens on. The
    demo's hosts are available; one gpu host is in error and one cpu host serves a claim (as data)."""
    hosts = list(BareMetalHost.objects.order_by("name"))
    systems = [{"name": h.name, "mac": h.boot_mac, "power_state": "Off"} for h in hosts]
    with RedfishLab(systems, BMC_USER, BMC_PASSWORD) as lab:
        dead = f"redfish+http://127.0.0.1:{closed_port()}/redfish/v1/Systems/"
        for h in hosts:
            address = dead + h.name if h.name in DEAD else lab.system_address(h.name)
            BareMetalHost.objects.filter(pk=h.pk).update(bmc_address=address, bmc_username=BMC_USER,
                                                         bmc_password=BMC_PASSWORD)
        BareMetalHost.objects.filter(name="gpu-04").update(state=HostState.ERROR)
        BareMetalHost.objects.filter(name="cpu-01").update(state=HostState.PROVISIONED)
        yield lab


def expected() -> dict:
    """The counts, straight from the rows: {("type" | "rack" | "total", name): {available, held_back, ...}}."""
    out: dict = {}
    for h in BareMetalHost.objects.all():
        groups = [("total", "")] + [("rack", h.labels.get("rack", ""))]
        groups += [("type", t) for t, role in ROLE_OF_TYPE.items() if h.labels.get("role") == role]
        for group in groups:
            c = out.setdefault(group, dict.fromkeys(CARD, 0))
            if h.state == HostState.AVAILABLE:
                c["held_back" if h.bmc_ok is False else "available"] += 1
                c["bmc_red"] += h.bmc_ok is False
            c["provisioned"] += h.state in (HostState.PROVISIONING, HostState.PROVISIONED)
            c["repair"] += h.state in (HostState.REPAIR, HostState.RETESTING)
            c["error"] += h.state == HostState.ERROR
    return out


def card_row(page, key: str) -> dict:
    row = page.locator(f'#capacity-table tr[data-capacity="{key}"]')
    counts = {c: int(row.locator(f"td.cap-{c}").inner_text()) for c in CARD if c != "bmc_red"}
    counts["bmc_red"] = int(page.inner_text("#capacity-bmc-red")) if key == "total" else counts["held_back"]
    return counts


@pytest.mark.django_db(transaction=True)
def test_the_boards_capacity_counts_match_the_database_for_a_fleet_with_dead_bmcs(browser_page, users, redfish):
    page = browser_page
    log_in(page, "root-admin")
    wait_live(page)
    assert page.inner_text("#capacity-available") == "6"  # no BMC has been asked yet: none is red
    page.evaluate("window.sameDocument = 'not reloaded'")

    assert sorted(check_bmcs()) == sorted(n for n in DEAD)  # the periodic check: three BMCs turn red

    page.wait_for_selector("#capacity-bmc-red")
    assert page.inner_text("#capacity-bmc-red") == "3"
    want = expected()
    assert want[("total", "")] == {"available": 3, "held_back": 3, "provisioned": 1, "repair": 0, "error": 1,
                                   "bmc_red": 3}
    for (kind, name), counts in want.items():
        key = "total" if kind == "total" else f"{kind}:{name}"
        assert card_row(page, key) == counts, key
    # The "Available" state count still says how many are in that state; the card says how few can serve.
    assert page.inner_text("#count-available") == "6"
    assert page.inner_text("#capacity-available") == "3"
    assert page.evaluate("window.sameDocument") == "not reloaded"


@pytest.mark.django_db(transaction=True)
def test_the_periodic_check_records_each_bmcs_answer_and_writes_an_event_only_when_it_changes(users, redfish):
    red = check_bmcs()
    assert sorted(red) == sorted(DEAD)
    rows = {h.name: h for h in BareMetalHost.objects.filter(state=HostState.AVAILABLE)}
    assert {n for n, h in rows.items() if h.bmc_ok is False} == set(DEAD)
    assert all(h.bmc_ok is True and h.bmc_checked_at for n, h in rows.items() if n not in DEAD)
    assert "refused" in rows["gpu-02"].bmc_error or "unreachable" in rows["gpu-02"].bmc_error.lower()
    assert rows["gpu-01"].power_state == "off"  # read from the BMC on the way
    # Only available hosts are checked: the one in error and the one serving were not asked.
    assert BareMetalHost.objects.get(name="gpu-04").bmc_checked_at is None
    assert BareMetalHost.objects.get(name="cpu-01").bmc_checked_at is None
    events = Event.objects.filter(step="bmc_contact")
    assert sorted(events.values_list("object_name", flat=True)) == sorted(DEAD)
    assert events.first().actor == "system:bmc-check" and "BMC does not answer" in events.first().message
    # Checked a moment ago: not due again.
    assert hosts_bmc_check_due() == []
    # The BMC answers again: green, one more Event; the capacity follows.
    gpu02 = BareMetalHost.objects.get(name="gpu-02")
    BareMetalHost.objects.filter(pk=gpu02.pk).update(bmc_address=redfish.system_address("gpu-02"), bmc_checked_at=None)
    assert hosts_bmc_check_due() == ["gpu-02"]
    assert Event.objects.filter(step="bmc_contact", object_name="gpu-02").first().message == "BMC answers"
    assert BareMetalHost.objects.get(pk=gpu02.pk).bmc_ok is True


@pytest.mark.django_db
def test_the_api_gives_admins_and_auditors_what_the_card_shows_and_refuses_members(users, console_site):
    host = BareMetalHost.objects.get(name="gpu-01")
    host_bmc_contact(host=host, ok=False, error="BMC at 10.0.0.1 unreachable")
    client = Client()
    for who in ("root-admin", "audrey"):
        client.force_login(users["admin" if who == "root-admin" else "auditor"])
        body = client.get("/api/v1/capacity/").json()
        assert (body["total"]["available"], body["total"]["held_back"], body["total"]["bmc_red"]) == (7, 1, 1)
        types = {t["name"]: t for t in body["node_types"]}
        assert (types["gpu-server"]["available"], types["gpu-server"]["bmc_red"]) == (3, 1)
        assert types["cpu-server"]["available"] == 4
        racks = {r["name"]: r for r in body["racks"]}
        assert racks["r1"]["bmc_red"] == 1 and racks["r2"]["bmc_red"] == 0
        html = client.get(reverse("fleet")).content.decode()
        assert 'id="capacity-available">7<' in html and 'id="capacity-bmc-red">1<' in html
    for member in ("alice", "bob"):
        client.force_login(users[member])
        assert client.get("/api/v1/capacity/").status_code == 403
        assert client.get(reverse("fleet")).status_code in (302, 403)
    client.logout()
    assert client.get("/api/v1/capacity/").status_code in (401, 403)


@pytest.mark.django_db
def test_hosts_held_after_a_restore_have_a_column_of_their_own_and_a_power_action_says_what_to_do(
        users, console_site):
    BareMetalHost.objects.filter(name__in=("gpu-01", "cpu-01")).update(state=HostState.HELD, held_from="available")
    client = Client()
    client.force_login(users["admin"])
    body = client.get("/api/v1/capacity/").json()
    total = body["total"]
    assert (total["total"], total["available"], total["held_back"], total["provisioned"], total["held"]) == (8, 6, 0, 0, 2)
    assert {t["name"]: t["held"] for t in body["node_types"]} == {"cpu-server": 1, "gpu-server": 1}
    html = client.get(reverse("fleet")).content.decode()
    assert 'id="capacity-held">2<' in html and "manage.py reconcile-world</code> runs it now" in html
    page = client.get(reverse("host-action", args=["gpu-01", "power-on"])).content.decode()
    assert ("the host is held after a restore: no power action until the world reconcile has read its real state; "
            "it runs at each worker&#x27;s start") in page
    assert "(manage.py reconcile-world runs it now), then act on the host where it went" in page


@pytest.mark.django_db
def test_a_flows_bmc_calls_record_the_answer_and_a_red_bmc_holds_an_available_host_back(users, console_site):
    from hosts.bmc.client import BMCError
    from hosts.engine.flow import Run, Waiting
    from hosts.flows.steps import _bmc_call

    host = BareMetalHost.objects.get(name="gpu-01")
    run = Run(host)
    run.flow = {"name": "provision", "step": "power_on_ramdisk"}

    def dead():
        raise BMCError("unreachable", "BMC at 127.0.0.1 unreachable: connection refused")

    with pytest.raises(Waiting):
        _bmc_call(dead, run)
    host.refresh_from_db()
    assert (host.bmc_ok, host.bmc_error) == (False, "BMC at 127.0.0.1 unreachable: connection refused")
    assert _bmc_call(lambda: "on", run) == "on"
    host.refresh_from_db()
    assert host.bmc_ok is True and host.bmc_error == ""
    assert list(Event.objects.filter(host_id=host.pk, step="bmc_contact").order_by("pk")
                .values_list("message", flat=True)) == [
        "BMC does not answer: BMC at 127.0.0.1 unreachable: connection refused", "BMC answers"]


@pytest.mark.django_db
def test_the_allocator_gives_the_next_claim_an_allocatable_host_before_one_whose_bmc_is_red(users, console_site):
    from claims.models import NodeClaim
    from claims.reconcile import pools_reconcile
    from pools.services import pool_set_quantity

    from .console_conftest import pool

    first = BareMetalHost.objects.filter(labels__role="gpu", state=HostState.AVAILABLE).order_by("pk").first()
    host_bmc_contact(host=first, ok=False, error="BMC at 127.0.0.1 unreachable")
    gpu = pool("one", "gpu")
    pool_set_quantity(pool=gpu, quantity=1, actor="user:alice")
    pools_reconcile(pool_ids=[gpu.pk])
    claim = NodeClaim.objects.get(pool=gpu)
    assert claim.host_id is not None and claim.host_id != first.pk
    assert BareMetalHost.objects.get(pk=first.pk).state == HostState.AVAILABLE
