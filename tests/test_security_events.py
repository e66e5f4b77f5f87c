"""Security events are for a person to look at: a flood of refusals is one row with a count, the fleet board's
alarm counts only what needs attention, and the lab's routine repair and retest raise none."""
import json
import re

import pytest

from conftest import wait_for
from events.choices import EventKind
from events.models import Event
from hosts import services
from hosts.boot.ramdisk import agent_sessions_end, ramdisk_boot_start
from hosts.models import BareMetalHost, HostCommand
from hosts.services import host_transition

from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db


def board_alarm(client) -> int:
    """The fleet board's red count of security events (0: no alarm shown)."""
    page = client.get("/hosts/").content.decode()
    found = re.search(r'id="security-events">(\d+) security event', page)
    return int(found.group(1)) if found else 0


@pytest.fixture
def booting(demo_site):
    """gpu-01 inspecting, with an inspect command queued and a ramdisk boot started (its secret not delivered)."""
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state="inspecting", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"name": "inspect", "id": "flow-1"})
    HostCommand.objects.create(host=host, flow_id="flow-1", step="inspect", name="inspect")
    ramdisk_boot_start(host=host, flow_id="flow-1")
    return BareMetalHost.objects.get(pk=host.pk)


def security_events(host) -> list[Event]:
    return list(Event.objects.filter(kind=EventKind.SECURITY, host=host).order_by("id"))


def boot_script(agent_client, host, address="10.0.0.5"):
    return agent_client.get(f"/boot/{host.boot_mac.replace(':', '-')}.ipxe", REMOTE_ADDR=address)


def lookup(agent_client, host, secret: str | None, address: str):
    body = {"macs": [host.boot_mac], "boot_id": "b"} | ({"boot_secret": secret} if secret is not None else {})
    return agent_client.post("/agent/lookup", json.dumps(body), content_type="application/json", REMOTE_ADDR=address)


def secret_of(script) -> str:
    kernel = next(line for line in script.content.decode().splitlines() if line.startswith("kernel "))
    return dict(word.split("=", 1) for word in kernel.split() if word.startswith("vmetal."))["vmetal.boot_secret"]


def test_a_hundred_refused_boot_fetches_are_one_event_with_their_count(agent_client, booting):
    assert boot_script(agent_client, booting).status_code == 200  # the server's own fetch
    for _ in range(100):
        assert boot_script(agent_client, booting, address="10.0.0.66").status_code == 404
    [event] = security_events(booting)  # the race (the second fetch), and every later fetch counted into it
    assert "raced" in event.message and event.data["boot"] == booting.ramdisk_boots.first().pk
    assert event.data["count"] == 100 and event.data["addresses"] == ["10.0.0.5", "10.0.0.66"]
    assert event.data["attention"] is True


def test_refused_lookups_are_counted_per_reason_and_a_new_boot_starts_a_new_row(agent_client, booting):
    for _ in range(30):
        assert lookup(agent_client, booting, None, "10.0.0.66").status_code == 403
    for address in ("10.0.0.67", "10.0.0.68"):
        assert lookup(agent_client, booting, "guessed", address).status_code == 403
    without, guessed = security_events(booting)
    assert "without a boot secret" in without.message and without.data["count"] == 30
    assert "not this boot's" in guessed.message and guessed.data["count"] == 2
    assert guessed.data["addresses"] == ["10.0.0.67", "10.0.0.68"]
    ramdisk_boot_start(host=booting, flow_id="flow-1")  # the host's next boot: its refusals are news again
    assert lookup(agent_client, booting, None, "10.0.0.66").status_code == 403
    assert [e.data["count"] for e in security_events(booting)] == [30, 2, 1]


def test_the_hosts_own_agent_looking_up_again_is_routine_but_a_forged_lookup_from_elsewhere_raises_the_alarm(
        agent_client, booting, admin_client):
    secret = secret_of(boot_script(agent_client, booting))
    assert lookup(agent_client, booting, secret, "10.0.0.5").status_code == 200
    # A retest ends the session while the server still runs (its power-off lands later): its agent asks again.
    agent_sessions_end(host_ids=[booting.pk])
    for _ in range(3):
        assert lookup(agent_client, booting, secret, "10.0.0.5").status_code == 403
    old_secret = secret
    ramdisk_boot_start(host=booting, flow_id="flow-1")
    assert lookup(agent_client, booting, old_secret, "10.0.0.5").status_code == 403  # the last boot's agent
    assert [(e.data["attention"], e.data["count"]) for e in security_events(booting)] == [(False, 3), (False, 1)]
    assert board_alarm(admin_client) == 0

    # Someone else on the provisioning network, with the MACs and the old secret: a person must look.
    assert lookup(agent_client, booting, old_secret, "10.0.0.66").status_code == 403
    assert lookup(agent_client, booting, None, "10.0.0.66").status_code == 403
    assert [e.data["attention"] for e in security_events(booting)][2:] == [True, True]
    assert board_alarm(admin_client) == 2


def test_a_repair_and_retest_cycle_in_the_lab_raises_no_board_alarm(lab_factory, celery_worker_process, admin_client):
    lab_factory(hosts=1, gpu_hosts=1, faults={"gpu-01": "gpu-xid:3"}, disk_bytes=96 * 1024 * 1024, power_delay=(3, 3.5))
    wait_hosts("repair", 1, timeout=90)
    host = BareMetalHost.objects.get()
    for retest in (1, 2):
        services.host_retest(host=BareMetalHost.objects.get(), actor="user:ops")
        wait_for(lambda: Event.objects.filter(host=host, from_state="retesting", to_state="repair").count() == retest,
                 timeout=90)
    events = list(Event.objects.filter(kind=EventKind.SECURITY).values_list("message", "data"))
    assert board_alarm(admin_client) == 0, (events, lab_report())
    print("security events:", json.dumps(events, default=str))
