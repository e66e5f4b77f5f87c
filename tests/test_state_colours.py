"""A host's state and a claim's phase are declared once, with their label and their badge colour
(core.choices.ColouredChoices, as NetBox's DeviceStatusChoices); the console's badges and the admin's read
the colour from there."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from events.admin import BADGE_COLOURS
from hosts.choices import HostState
from hosts.models import BareMetalHost

# Each state's one colour (issue 17.6: Available green for hosts and claims alike, repair violet, not amber).
HOST_COLOURS = {
    "registering": "secondary", "inspecting": "secondary", "available": "success", "provisioning": "warning",
    "provisioned": "primary", "deprovisioning": "warning", "repair": "purple", "retesting": "warning",
    "repairing": "warning", "checking": "secondary", "servicing": "warning",
    "retired": "dark", "error": "danger", "maintenance": "dark", "held": "dark"}
PHASE_COLOURS = {"Pending": "secondary", "Provisioning": "warning", "Joining": "warning", "Available": "success",
                 "Failed": "danger", "Releasing": "warning", "Released": "dark"}


def test_each_state_and_phase_declares_its_one_colour():
    assert HostState.colours == HOST_COLOURS
    assert ClaimPhase.colours == PHASE_COLOURS
    assert [label for _, label in HostState.choices][:3] == ["Registering", "Inspecting", "Available"]


def test_the_models_and_an_unknown_value_ask_the_choices():
    assert BareMetalHost(state=HostState.REPAIR).state_colour == "purple"
    assert NodeClaim(phase=ClaimPhase.FAILED).phase_colour == "danger"
    assert HostState.colour("no-such-state") == ClaimPhase.colour("") == "secondary"


def test_the_admin_can_draw_every_declared_colour():
    assert set(HostState.colours.values()) | set(ClaimPhase.colours.values()) <= set(BADGE_COLOURS)


@pytest.mark.django_db
def test_the_console_s_state_counts_draw_each_state_in_its_colour():
    from hosts import presenters

    html = presenters.render_counts(presenters.state_counts(BareMetalHost.objects.none()), "")
    for state, colour in HOST_COLOURS.items():
        assert f'id="count-{state}">0</span><span class="badge badge-{colour}">{HostState(state).label}' in html


def test_a_choice_without_a_colour_is_refused():
    from core.choices import ColouredChoices

    with pytest.raises(TypeError, match="declare \\(value, label, colour\\)"):
        class Bad(ColouredChoices):
            ONE = "one", "One"
