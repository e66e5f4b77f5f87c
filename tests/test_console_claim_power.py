"""Power on, off and reboot of a claim's node from the console, over HTTP with CSRF as people use them: the claim
page and the tenant page offer the buttons to those the API lets power it (a tenant admin of the claim's tenant, the
platform's admins and operators); the request is in the claim's Event log with who asked, for a host (its BMC) and
for an external provider's machine. A tenant viewer and an auditor are refused (403), another tenant's member sees
no such claim (404), a claim with no node is told so; nothing is recorded then."""
pytest_plugins = ["tests.api_conftest"]

import re  # noqa: E402
import time  # noqa: E402
from html import unescape  # noqa: E402

import pytest  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402

from access.sessions import SIGNED_IN_AT  # noqa: E402
from claims.choices import ClaimPhase  # noqa: E402
from claims.models import NodeClaim  # noqa: E402
from events.models import Event  # noqa: E402
from hosts.choices import HostState  # noqa: E402
from hosts.models import BareMetalHost  # noqa: E402
from machines.choices import MachineState  # noqa: E402
from machines.models import Machine  # noqa: E402
from pools.models import NodeProvider, NodeType  # noqa: E402

pytestmark = pytest.mark.django_db

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
POWER_STEPS = ("power_on", "power_off", "power_cycle")


def browser(world, role: str) -> Client:
    """A client that, like a browser, must carry the CSRF token of the form it posts."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users[role])
    return client


def text(response) -> str:
    return unescape(response.content.decode())


def confirm(client: Client, claim: NodeClaim, action: str, data: dict | None = None, query: str = ""):
    """Open the confirmation, then submit its form with its CSRF token; follows the redirect."""
    url = reverse("claim-power", args=[claim.name, action])
    page = client.get(url + query)
    assert page.status_code == 200, page.status_code
    token = CSRF.search(page.content.decode())
    assert token, f"the confirmation has no form: {text(page)[-2000:]}"
    return client.post(url + query, {"csrfmiddlewaretoken": token.group(1), **(data or {})}, follow=True)


def csrf_of(client: Client, url: str) -> str:
    return CSRF.search(client.get(url).content.decode()).group(1)


@pytest.fixture
def host_claim(world) -> NodeClaim:
    """Alpha's claim, its host provisioned (no flow drives its power), the host's power as last read."""
    BareMetalHost.objects.filter(pk=world.host_a.pk).update(state=HostState.PROVISIONED, power_state="on")
    NodeClaim.objects.filter(pk=world.claim_a.pk).update(phase=ClaimPhase.AVAILABLE)
    return NodeClaim.objects.get(pk=world.claim_a.pk)


@pytest.fixture
def machine_claim(world) -> NodeClaim:
    """A claim of alpha served by a machine an external (OpenTofu) provider made: running, powered on."""
    provider = NodeProvider.objects.create(name="cloud", kind="terraform")
    node_type = NodeType.objects.create(name="cloud-small", provider=provider, resources={"cpu": "4"})
    claim = NodeClaim.objects.create(name="alpha-cloud-1", tenant=world.alpha, pool_name="cloud", provider=provider,
                                     node_type=node_type, phase=ClaimPhase.AVAILABLE)
    Machine.objects.create(claim=claim, provider=provider, node_type=node_type, kind="terraform",
                           name="alpha-cloud-1.default.node", state=MachineState.RUNNING, power="On")
    return claim


def power_requests(claim: NodeClaim):
    return Event.objects.filter(claim_id=claim.pk, kind="action", data__has_key="action")


# --- who sees the buttons --------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["admin", "operator", "member_a"])
def test_those_who_may_power_see_the_buttons_and_the_power_state_on_the_claim_and_tenant_pages(
        world, host_claim, role):
    client = browser(world, role)
    page = text(client.get(reverse("claim", args=[host_claim.name])))
    assert 'id="claim-power-state">on<' in page
    for slug, label in (("power-on", "Power on"), ("power-off", "Power off"), ("power-cycle", "Reboot")):
        assert reverse("claim-power", args=[host_claim.name, slug]) in page and f"{label}…" in page
    tenant = text(client.get(reverse("tenant", args=["alpha"])))
    assert reverse("claim-power", args=[host_claim.name, "power-cycle"]) + "?next=tenant" in tenant
    assert "<th>Power</th>" in tenant


@pytest.mark.parametrize("role", ["auditor", "viewer_a"])
def test_an_auditor_and_a_tenant_viewer_see_the_power_state_but_no_buttons(world, host_claim, role):
    client = browser(world, role)
    page = text(client.get(reverse("claim", args=[host_claim.name])))
    assert 'id="claim-power-state">on<' in page
    assert reverse("claim-power", args=[host_claim.name, "power-cycle"]) not in page
    tenant = text(client.get(reverse("tenant", args=["alpha"])))
    assert "claim-power" not in tenant and "<th>Power</th>" not in tenant


# --- a host's claim: the request to its BMC, in the claim's events ---------------------------------------------

@pytest.mark.parametrize("role", ["admin", "operator", "member_a"])
def test_a_reboot_of_a_host_claim_is_asked_of_its_bmc_and_listed_in_the_claim_s_events(world, host_claim, role):
    client = browser(world, role)
    done = confirm(client, host_claim, "power-cycle", {"reason": "hung kernel"})
    assert done.redirect_chain[-1][0] == reverse("claim", args=[host_claim.name])
    page = text(done)
    assert f"Reboot: asked for claim {host_claim.name}'s host {world.host_a.name}" in page
    request = Event.objects.get(host_id=world.host_a.pk, step="power_cycle")
    assert request.claim_id == host_claim.pk and request.actor == world.actor(role)
    assert request.data["action"] == "power-cycle" and request.data["reason"] == "hung kernel"
    assert "power cycle requested: hung kernel" in page  # the claim's event list shows it
    # The API's path is the same service: its request goes to the claim's event list too.
    answer = world.client("admin").post(f"/api/v1/claims/{host_claim.pk}/power/", {"action": "power-off"},
                                        format="json")
    assert answer.status_code == 200, answer.content
    assert Event.objects.get(host_id=world.host_a.pk, step="power_off").claim_id == host_claim.pk


def test_power_on_and_off_from_the_tenant_page_come_back_to_it(world, host_claim):
    client = browser(world, "member_a")
    done = confirm(client, host_claim, "power-off", query="?next=tenant")
    assert done.redirect_chain[-1][0] == reverse("tenant", args=["alpha"])
    assert "Power off: asked for claim" in text(done)
    confirm(client, host_claim, "power-on", query="?next=tenant")
    assert list(Event.objects.filter(host_id=world.host_a.pk, step__in=POWER_STEPS).order_by("pk")
                .values_list("step", "actor")) == [("power_off", world.actor("member_a")),
                                                   ("power_on", world.actor("member_a"))]


def test_a_host_whose_power_a_flow_drives_is_refused_with_the_reason_and_nothing_is_recorded(world):
    # The world's claim is provisioning: the provisioning flow drives its host's power.
    client = browser(world, "member_a")
    page = text(confirm(client, world.claim_a, "power-cycle"))
    assert f"Reboot: {world.host_a.name} cannot be power cycled now" in page
    assert not power_requests(world.claim_a).exists()
    assert not Event.objects.filter(step__in=POWER_STEPS).exists()


# --- an external provider's machine ------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["admin", "operator", "member_a"])
def test_power_off_of_a_machine_claim_goes_to_its_provider_and_is_in_the_claim_s_events(
        world, machine_claim, role):
    client = browser(world, role)
    page = text(client.get(reverse("claim", args=[machine_claim.name])))
    assert 'id="claim-power-state">On<' in page
    done = text(confirm(client, machine_claim, "power-off", {"reason": "maintenance"}))
    assert f"Power off: asked for claim {machine_claim.name}'s machine" in done
    request = power_requests(machine_claim).get()
    assert (request.step, request.actor, request.data["machine"]) == (
        "power-off", world.actor(role), "alpha-cloud-1.default.node")
    assert "power-off of terraform machine alpha-cloud-1.default.node requested: maintenance" in done


# --- refusals: nothing recorded ------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ["viewer_a", "auditor"])
def test_a_tenant_viewer_and_an_auditor_may_not_power_a_claim(world, host_claim, machine_claim, role):
    client = browser(world, role)
    token = csrf_of(client, reverse("claim", args=[host_claim.name]))
    for claim in (host_claim, machine_claim):
        url = reverse("claim-power", args=[claim.name, "power-cycle"])
        assert client.get(url).status_code == 403
        assert client.post(url, {"csrfmiddlewaretoken": token}).status_code == 403
    assert not Event.objects.filter(kind="action", data__has_key="action").exists()


def test_another_tenant_s_member_finds_no_such_claim(world, host_claim, machine_claim):
    client = browser(world, "member_b")
    token = csrf_of(client, reverse("tenant", args=["bravo"]))
    for claim in (host_claim, machine_claim):
        url = reverse("claim-power", args=[claim.name, "power-off"])
        assert client.get(url).status_code == 404
        assert client.post(url, {"csrfmiddlewaretoken": token}).status_code == 404
    assert not Event.objects.filter(kind="action", data__has_key="action").exists()


def test_a_post_without_the_csrf_token_is_refused(world, host_claim):
    client = browser(world, "admin")
    assert client.post(reverse("claim-power", args=[host_claim.name, "power-off"])).status_code == 403
    assert not power_requests(host_claim).exists()


def test_an_unknown_action_is_not_found(world, host_claim):
    assert browser(world, "admin").get(reverse("claim-power", args=[host_claim.name, "power-sideways"])
                                       ).status_code == 404


@pytest.mark.parametrize("phase", [ClaimPhase.RELEASED, ClaimPhase.PENDING])
def test_a_claim_with_no_node_is_told_so_and_nothing_is_recorded(world, phase):
    claim = NodeClaim.objects.create(name=f"alpha-{phase.lower()}", tenant=world.alpha, pool_name="gpu",
                                     provider=world.provider, phase=phase)
    client = browser(world, "member_a")
    url = reverse("claim-power", args=[claim.name, "power-cycle"])
    shown = text(client.get(url))
    assert f"Not possible now: claim {claim.name} is {phase} and holds no node to power" in shown
    token = csrf_of(client, reverse("claim", args=[claim.name]))
    refused = text(client.post(url, {"csrfmiddlewaretoken": token}, follow=True))
    assert f"Reboot: claim {claim.name} is {phase} and holds no node to power" in refused
    assert not Event.objects.filter(kind="action", data__has_key="action").exists()
    answer = world.client("member_a").post(f"/api/v1/claims/{claim.pk}/power/", {"action": "power-on"},
                                           format="json")
    assert answer.status_code == 409 and "holds no node to power" in answer.json()["detail"]


def test_switching_off_or_rebooting_wants_a_recent_sign_in_and_power_on_does_not(world, host_claim, settings):
    client = browser(world, "member_a")
    token = csrf_of(client, reverse("claim", args=[host_claim.name]))
    session = client.session
    session[SIGNED_IN_AT] = int(time.time() - settings.FRESH_SIGN_IN_S - 5)
    session.save()
    for action in ("power-off", "power-cycle"):
        url = reverse("claim-power", args=[host_claim.name, action])
        assert "Sign in again" in text(client.get(url))
        refused = text(client.post(url, {"csrfmiddlewaretoken": token}, follow=True))
        assert "needs a sign-in of the last" in refused and "nothing was done" in refused
    assert not Event.objects.filter(step__in=POWER_STEPS).exists()
    confirm(client, host_claim, "power-on")
    assert Event.objects.filter(host_id=world.host_a.pk, step="power_on").exists()
