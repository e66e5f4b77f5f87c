"""Every host state either rests (a host may stay in it for good) or has a deadline that the sweeper enforces,
sending an overdue host to the state's failure state: a host never sits in progress forever, not even one
stored without a deadline (by an older console)."""
from datetime import timedelta

import pytest
from django.utils import timezone

from events.models import Event
from hosts.choices import HostState
from hosts.lifecycle import FLOW_FOR_STATE
from hosts.lifecycle import IN_PROGRESS, STATE_FAILURE, TRANSITIONS, deadline_for
from hosts.models import BareMetalHost
from hosts.services import hosts_sweep_overdue

pytestmark = pytest.mark.django_db

# The states a host may stay in without anyone driving it. A new state goes here or gets a deadline.
# Held (after a restore) rests too: it waits for the world reconcile, which no deadline may pre-empt.
RESTING = {HostState.AVAILABLE, HostState.PROVISIONED, HostState.REPAIR, HostState.ERROR, HostState.MAINTENANCE,
           HostState.RETIRED, HostState.HELD}
IN_PROGRESS_STATES = [state for state in HostState.values if state not in RESTING]


@pytest.mark.parametrize("state", HostState.values)
def test_every_state_rests_or_has_a_deadline_and_a_failure_state(state):
    if state in RESTING:
        assert deadline_for(state) is None and state not in IN_PROGRESS and state not in FLOW_FOR_STATE
        return
    assert state in IN_PROGRESS and state in FLOW_FOR_STATE, f"{state} is in progress: it needs a flow"
    assert deadline_for(state) > timedelta(0), f"{state} has no deadline"
    assert STATE_FAILURE[state] in TRANSITIONS[state], f"{state} cannot move to its failure state"
    assert STATE_FAILURE[state] in RESTING


def stored(state: str, *, entered_ago: timedelta, deadline_at=None) -> BareMetalHost:
    """A host stored in `state` as it was `entered_ago`, as a console or a hand edit may have left it."""
    host = BareMetalHost.objects.create(name=f"host-{state}", state=state, boot_mac="52:54:00:00:d0:01",
                                        bmc_address="redfish+http://127.0.0.1:9/redfish/v1/Systems/1",
                                        deadline_at=deadline_at)
    BareMetalHost.objects.filter(pk=host.pk).update(state_changed_at=timezone.now() - entered_ago)
    host.refresh_from_db()
    return host


@pytest.mark.parametrize("dated", [True, False], ids=["past-its-deadline", "stored-without-a-deadline"])
@pytest.mark.parametrize("state", IN_PROGRESS_STATES)
def test_the_sweeper_moves_an_overdue_host_of_every_in_progress_state_to_its_failure_state(state, dated):
    limit = deadline_for(state)
    host = stored(state, entered_ago=limit + timedelta(minutes=1),
                  deadline_at=timezone.now() - timedelta(minutes=1) if dated else None)

    assert hosts_sweep_overdue() == [host.name]
    host.refresh_from_db()
    assert host.state == STATE_FAILURE[state]
    event = Event.objects.get(host=host, kind="transition", actor="system:sweeper")
    assert (event.from_state, event.to_state) == (state, STATE_FAILURE[state])
    assert event.message.startswith(f"deadline exceeded: {state} for more than ")
    if host.state == HostState.ERROR:
        assert (host.error_type, host.error_message) == (f"{state} timeout", event.message)


@pytest.mark.parametrize("state", IN_PROGRESS_STATES)
def test_the_sweeper_leaves_a_host_stored_without_a_deadline_alone_while_it_is_within_it(state):
    host = stored(state, entered_ago=deadline_for(state) - timedelta(minutes=1))
    assert hosts_sweep_overdue() == []
    host.refresh_from_db()
    assert host.state == state


@pytest.mark.parametrize("state", sorted(RESTING))
def test_the_sweeper_leaves_a_resting_host_alone_however_long_it_rests(state):
    host = stored(state, entered_ago=timedelta(days=400), deadline_at=timezone.now() - timedelta(days=300))
    assert hosts_sweep_overdue() == []
    assert BareMetalHost.objects.get(pk=host.pk).state == state
