"""Hosts work with their own flows alone: with the claims app's flows and reactions unregistered, a lab server is
registered, inspected and passes its release gate to available; a state whose flow nobody registered fails loudly,
naming what is missing, and the deadline sweep passes over it."""
import pytest

from conftest import wait_for
from events.models import Event
from hosts import lifecycle, services
from hosts.choices import HostState
from hosts.engine.drive import drive
from hosts.lifecycle import FlowMissing, deadline_for
from hosts.models import BareMetalHost, EraseCertificate
from hosts.services import host_transition, hosts_sweep_overdue

from .lab_conftest import lab_report

pytest_plugins = ["tests.lab_conftest"]

CLAIM_FLOWS = {"provision": HostState.PROVISIONING, "deprovision": HostState.DEPROVISIONING}


@pytest.fixture
def hosts_alone(monkeypatch):
    """The registries as they are with no claims app: hosts' own flows and receivers, nobody holding idle checks."""
    for name, state in CLAIM_FLOWS.items():
        monkeypatch.delitem(lifecycle.FLOWS, name)
        monkeypatch.delitem(lifecycle.FLOW_FOR_STATE, state)
    own = [r for r in lifecycle.TRANSITION_RECEIVERS if r.__module__.startswith("hosts.")]
    monkeypatch.setattr(lifecycle, "TRANSITION_RECEIVERS", own)
    monkeypatch.setattr(services, "TRANSITION_RECEIVERS", own)
    monkeypatch.setattr(services, "_idle_check_holds", None)


def drive_all_until(state: str, timeout: float) -> BareMetalHost:
    """The worker's part, played here: drive every host until one is in `state`."""
    def arrived():
        for pk in BareMetalHost.objects.values_list("pk", flat=True):
            drive(pk)
        return BareMetalHost.objects.filter(state=state).first()

    try:
        return wait_for(arrived, timeout=timeout, interval=0.2)
    except AssertionError:
        raise AssertionError(f"no host {state} within {timeout}s\n{lab_report()}") from None


@pytest.mark.django_db(transaction=True)
def test_a_host_registers_is_inspected_and_passes_its_release_gate_without_the_claims_flows(hosts_alone,
                                                                                             lab_factory):
    lab_factory(hosts=1, gpu_hosts=1)
    host = drive_all_until(HostState.AVAILABLE, timeout=180)
    moves = list(Event.objects.filter(host=host, kind="transition").order_by("pk").values_list("to_state", flat=True))
    assert moves == [HostState.REGISTERING, HostState.INSPECTING, HostState.AVAILABLE]
    assert EraseCertificate.objects.filter(host=host, result="pass").exists()  # the release gate's erase, verified
    assert hosts_sweep_overdue() == []


@pytest.mark.django_db
def test_a_state_whose_flow_nobody_registered_fails_loudly_and_the_sweep_passes_over_it(hosts_alone, demo_site):
    with pytest.raises(FlowMissing, match="no flow drives the host state 'provisioning'.*claims.steps"):
        deadline_for(HostState.PROVISIONING)
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state=HostState.INSPECTING, actor="test")
    host_transition(host=host, to_state=HostState.AVAILABLE, actor="test")
    with pytest.raises(FlowMissing, match="'provisioning'"):
        host_transition(host=host, to_state=HostState.PROVISIONING, actor="test")
    assert BareMetalHost.objects.get(pk=host.pk).state == HostState.AVAILABLE
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.INSPECTING, deadline_at=None,
                                                    state_changed_at=host.state_changed_at.replace(year=2000))
    assert hosts_sweep_overdue() == [host.name]  # a state hosts drives is swept; provisioning is passed over
