"""The host life cycle: one table, one service, deadlines, the sweeper and the retry cap."""
from datetime import timedelta
from unittest import mock

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.models import Event
from hosts.choices import HostState
from hosts.lifecycle import FLOWS, FLOW_FOR_STATE
from hosts.lifecycle import (IN_PROGRESS, STATE_FAILURE, TRANSITIONS, ConcurrentTransition, IllegalTransition,
                             deadline_for)
from hosts.models import BareMetalHost
from hosts.services import (host_retest, host_retry, host_return_to_service, host_set_maintenance, host_transition,
                            hosts_sweep_overdue)

pytestmark = pytest.mark.django_db


@pytest.fixture
def host(demo_site):
    return BareMetalHost.objects.get(name="gpu-01")


def test_every_state_has_a_row_in_the_transition_table():
    assert set(TRANSITIONS) == set(HostState.values)
    assert all(targets <= set(HostState.values) for targets in TRANSITIONS.values())


@pytest.mark.parametrize("to_state", ["provisioned", "repair", "error"])
def test_an_illegal_transition_raises_and_changes_nothing(host, to_state):
    events = Event.objects.count()
    with pytest.raises(IllegalTransition, match=rf"^gpu-01 is available \(it is free for the next claim\), so it "
                                                rf"cannot go to {to_state}$"):
        host_transition(host=host, to_state=to_state, actor="test")
    host.refresh_from_db()
    assert host.state == "available" and Event.objects.count() == events


def test_a_transition_writes_an_event_with_actor_reason_and_duration(host):
    BareMetalHost.objects.filter(pk=host.pk).update(state_changed_at=timezone.now() - timedelta(seconds=90))
    host.refresh_from_db()
    host_transition(host=host, to_state="provisioning", actor="user:alice", reason="a test")
    event = Event.objects.filter(host=host).first()
    assert (event.from_state, event.to_state, event.actor, event.message) == \
        ("available", "provisioning", "user:alice", "a test")
    assert 89 <= event.duration_s <= 120
    host.refresh_from_db()
    assert host.deadline_at is not None and host.deadline_at > timezone.now() + timedelta(minutes=59)


def test_a_stale_copy_loses_the_compare_and_swap(host):
    stale = BareMetalHost.objects.get(pk=host.pk)
    host_transition(host=host, to_state="maintenance", actor="test")
    with pytest.raises(ConcurrentTransition):
        host_transition(host=stale, to_state="provisioning", actor="test")
    assert BareMetalHost.objects.get(pk=host.pk).state == "maintenance"


def test_events_are_append_only(host):
    host_transition(host=host, to_state="maintenance", actor="test")
    event = Event.objects.filter(host=host).first()
    with pytest.raises(ValueError):
        event.save()
    with pytest.raises(ValueError):
        event.delete()


def test_maintenance_on_and_off_goes_through_registration(host):
    host_set_maintenance(host=host, on=True, actor="user:bob", reason="replace a DIMM")
    assert BareMetalHost.objects.get(pk=host.pk).state == "maintenance"
    host_set_maintenance(host=host, on=False, actor="user:bob")
    assert BareMetalHost.objects.get(pk=host.pk).state == "registering"


def test_the_sweeper_moves_an_overdue_host_to_error_with_its_reason(host):
    host_transition(host=host, to_state="provisioning", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert hosts_sweep_overdue() == ["gpu-01"]
    host.refresh_from_db()
    assert host.state == "error"
    hours, minutes = divmod(int(deadline_for("provisioning").total_seconds() // 60), 60)
    assert host.error_message == f"deadline exceeded: provisioning for more than {hours}h{minutes:02d}m"
    assert host.error_count == 1
    assert Event.objects.filter(host=host, to_state="error", actor="system:sweeper").exists()


def test_the_sweeper_leaves_hosts_within_their_deadline_alone(host):
    host_transition(host=host, to_state="provisioning", actor="test")
    assert hosts_sweep_overdue() == []
    assert BareMetalHost.objects.get(pk=host.pk).state == "provisioning"


# A step past its deadline is noticed by the next drive at the latest: the periodic re-drive takes hosts not
# driven for 20 s, every 10 s.
NOTICE_S = 30


@pytest.mark.parametrize("overrides", [{}, {"ERASE_DEADLINE_S": 10 * 3600, "HEALTH_DEADLINE_S": 6 * 3600},
                                       {"DRAIN_DEADLINE_S": 3600, "POWER_STEP_DEADLINE_S": 5}])
def test_every_in_progress_state_has_a_deadline_and_a_failure_state_and_its_flow_fits_in_its_deadline(
        settings, overrides):
    for name, value in overrides.items():
        setattr(settings, name, value)
    assert IN_PROGRESS == set(STATE_FAILURE) == set(FLOW_FOR_STATE)
    for state in IN_PROGRESS:
        assert STATE_FAILURE[state] in TRANSITIONS[state], state
        steps = FLOWS[FLOW_FOR_STATE[state]].steps
        # The state's clock never fires while each step is within its own deadline (and a drive to notice it).
        assert deadline_for(state).total_seconds() >= sum(s.deadline_s() + NOTICE_S for s in steps), state


@override_settings(ERASE_DEADLINE_S=3 * 3600)
def test_a_slow_erase_within_its_step_deadline_is_not_swept_to_error(host):
    host_transition(host=host, to_state="inspecting", actor="test")
    entered = timezone.now()
    BareMetalHost.objects.filter(pk=host.pk).update(flow={
        "name": "inspect", "state_since": entered.isoformat(), "done": {"power_on_pxe": {}, "agent_lookup": {},
                                                                        "inspect": {}},
        "step": "erase", "step_started_at": (entered + timedelta(minutes=5)).isoformat()})
    # 45 minutes into inspecting (whose deadline was 30 minutes), 40 into an erase that may take 3 hours; then
    # just before the erase's own deadline.
    for later in (timedelta(minutes=45), timedelta(minutes=5, hours=3) - timedelta(seconds=1)):
        with mock.patch("django.utils.timezone.now", return_value=entered + later):
            assert hosts_sweep_overdue() == []
    assert BareMetalHost.objects.get(pk=host.pk).state == "inspecting"


def test_a_retest_past_its_deadline_goes_back_to_repair_without_a_passing_verdict(host):
    for state in ("inspecting", "repair"):
        host_transition(host=host, to_state=state, actor="test")
    host_retest(host=host, actor="user:alice")
    BareMetalHost.objects.filter(pk=host.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))

    assert hosts_sweep_overdue() == ["gpu-01"]
    host.refresh_from_db()
    assert host.state == "repair" and host.error_count == 0
    event = Event.objects.filter(host=host, to_state="repair", actor="system:sweeper").get()
    assert event.message.startswith("deadline exceeded: retesting for more than ") and event.data["retest"] == "failed"
    with pytest.raises(IllegalTransition, match="no passing retest"):
        host_return_to_service(host=host, actor="user:alice")


def test_retry_moves_an_errored_host_back_to_registering_and_refuses_others(host):
    with pytest.raises(IllegalTransition, match="only a host in error can be retried"):
        host_retry(host=host, actor="test")
    host_transition(host=host, to_state="provisioning", actor="test")
    host_transition(host=host, to_state="error", actor="test", reason="BMC rejected credentials (401)")
    host_retry(host=host, actor="user:alice")
    assert BareMetalHost.objects.get(pk=host.pk).state == "registering"


@override_settings(CLAIM_MAX_ATTEMPTS=3)
def test_the_retry_cap_stops_an_endless_provision_loop(apply, demo_site, seed_block):
    apply(seed_block.replace("value: cpu-server", "value: none"), tenant="one")
    for attempt in range(1, 4):
        call_command("reconcile")
        claim = NodeClaim.objects.get(pool_name="gpu")
        assert claim.phase == ClaimPhase.PROVISIONING and claim.attempts == attempt
        BareMetalHost.objects.filter(pk=claim.host_id).update(deadline_at=timezone.now() - timedelta(seconds=1))
        hosts_sweep_overdue()
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.FAILED and claim.reason == "RetriesExhausted"
    assert claim.message.startswith("gave up after 3 attempt(s); last: host gpu-0")
    call_command("reconcile")  # a failed claim still counts: no new claim, no fourth host
    assert NodeClaim.objects.filter(pool_name="gpu").count() == 1
    assert BareMetalHost.objects.filter(state="error").count() == 3
    assert BareMetalHost.objects.filter(labels__role="gpu", state="available").count() == 1


def test_a_config_change_from_a_stale_read_keeps_what_a_worker_wrote_meanwhile(demo_site, apply):
    # apply (or the admin, or the API) reads the host, a worker moves it on and takes its drive lease, then
    # the change is saved: only the changed columns are written, never the state, flow or lease it read.
    stale = BareMetalHost.objects.get(name="gpu-01")
    lease = timezone.now() + timedelta(seconds=120)
    BareMetalHost.objects.filter(pk=stale.pk).update(state=HostState.REGISTERING, drive_lease_until=None,
                                                     flow={"name": "register", "id": "f-1", "done": {}})
    from events.services import object_update

    stale.drive_lease_until = lease  # as read while an earlier drive held it
    object_update(stale, {"bmc_password": "changed-secret"}, actor="user:test", object_type="host", self_link="host")
    host = BareMetalHost.objects.get(pk=stale.pk)
    assert host.bmc_password == "changed-secret"
    assert (host.state, host.drive_lease_until, host.flow["id"]) == (HostState.REGISTERING, None, "f-1")
