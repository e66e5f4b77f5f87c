"""A NodeProvider's page, over HTTP as people use it: the platform's roles read its kind, configuration (never a
secret), NodeTypes with the kind's capacity, machines and (kind terraform) OpenTofu workspaces with their locks, a
stuck one marked; an admin releases a lock behind a confirmation, recorded as an Event (never the state); an
operator may look but not release; a tenant member finds no such page. The OpenTofu kind's UNTESTED notice shows on
its providers' pages only."""
pytest_plugins = ["tests.api_conftest"]

import json  # noqa: E402
import re  # noqa: E402
from datetime import timedelta  # noqa: E402
from html import unescape  # noqa: E402

import pytest  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import reverse  # noqa: E402
from django.utils import timezone  # noqa: E402

from claims.choices import ClaimPhase  # noqa: E402
from claims.models import NodeClaim  # noqa: E402
from events.models import Event  # noqa: E402
from machines import kinds  # noqa: E402
from machines.choices import MachineState  # noqa: E402
from machines.kinds import KindError  # noqa: E402
from machines.kinds.terraform import UNTESTED  # noqa: E402
from machines.models import Machine, ProviderSecret, TofuState  # noqa: E402
from pools.models import NodeProvider, NodeType  # noqa: E402

pytestmark = pytest.mark.django_db

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
CLOUD_KEY = "AKIA-provider-page-secret-7q2x"
STATE_SECRET = "state-holds-a-private-ip-and-a-password-9k1z"
GIT_TOKEN = "ghp-provider-page-git-token-4r8w"


def browser(world, role: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.users[role])
    return client


def text(response) -> str:
    return unescape(response.content.decode())


@pytest.fixture
def cloud(world) -> NodeProvider:
    """An OpenTofu provider with a credentials Secret, two NodeTypes (one whose capacity is unreadable), a running
    machine of alpha's and a gone one, and two workspaces: one whose lock outlived the provider's timeout (10m),
    one not locked."""
    provider = NodeProvider.objects.create(
        name="cloud", kind="terraform", display_name="A cloud",
        config={"timeout": "10m", "nodeTemplate": {"git": {
            "repository": f"https://deploy:{GIT_TOKEN}@git.example.invalid/infra/nodes.git", "subPath": "node"}},
            "credentialsSecret": "cloud-keys"})
    ProviderSecret.objects.create(name="cloud-keys", labels={"terraform.vcluster.com/provider": "cloud"},
                                  contents=json.dumps({"AWS_SECRET_ACCESS_KEY": CLOUD_KEY}))
    small = NodeType.objects.create(name="cloud-small", provider=provider, resources={"cpu": "4"},
                                    provider_config={"maxCapacity": 3})
    NodeType.objects.create(name="cloud-odd", provider=provider, provider_config={"maxCapacity": "many"})
    for name, state, gone in (("alpha-c1", MachineState.RUNNING, None), ("alpha-c0", MachineState.GONE,
                                                                          timezone.now())):
        claim = NodeClaim.objects.create(name=name, tenant=world.alpha, pool_name="cloud", provider=provider,
                                         node_type=small, phase=ClaimPhase.AVAILABLE if gone is None
                                         else ClaimPhase.RELEASED)
        Machine.objects.create(claim=claim, provider=provider, node_type=small, kind="terraform",
                               name=f"{name}.default.node", state=state, power="On" if gone is None else "",
                               message="applied" if gone is None else "destroyed", gone_at=gone)
    TofuState.objects.create(name="alpha-c1.default.node", provider=provider, tofu_state=STATE_SECRET, serial=7,
                             lock_id="lock-1f2e", locked_at=timezone.now() - timedelta(minutes=30),
                             lock_info={"ID": "lock-1f2e", "Who": "worker@node-3", "Operation": "OperationTypeApply"})
    TofuState.objects.create(name="alpha-c0.default.node", provider=provider, tofu_state="", serial=2)
    return provider


def release_url(provider, workspace: str) -> str:
    return reverse("provider-release-lock", args=[provider.name, workspace])


def post_with_csrf(client: Client, url: str, **kwargs):
    token = CSRF.search(client.get(reverse("providers")).content.decode()) or CSRF.search(
        client.get(reverse("tokens")).content.decode())
    return client.post(url, {"csrfmiddlewaretoken": token.group(1)}, **kwargs)


@pytest.mark.parametrize("role", ["admin", "operator", "auditor"])
def test_the_platform_s_roles_read_a_terraform_provider_s_page(world, cloud, role):
    client = browser(world, role)
    assert f'href="{reverse("provider", args=["cloud"])}"' in text(client.get(reverse("providers")))
    page = text(client.get(reverse("provider", args=["cloud"])))
    assert "OpenTofu template" in page and UNTESTED in page
    # Its NodeTypes: the kind's capacity, the live machines; an unreadable capacity is said, not a 500.
    assert re.search(r'data-node-type="cloud-small">.*?<td class="capacity">3</td><td class="live">1</td>', page,
                     re.S)
    assert re.search(r'data-node-type="cloud-odd">.*?capacity unknown: capacity unreadable', page, re.S)
    # Its machines, the gone one kept as the claim's record.
    assert 'data-machine="alpha-c1.default.node"' in page and 'data-machine="alpha-c0.default.node"' in page
    assert "Running" in page and "Gone" in page and "destroyed" in page
    # Its workspaces: the stuck lock marked, with who holds it; the other not locked.
    stuck = re.search(r'data-workspace="alpha-c1.default.node" class="stuck">(.*?)</tr>', page, re.S).group(1)
    assert "stuck" in stuck and "lock-1f2e" in stuck and "worker@node-3" in stuck and "OperationTypeApply" in stuck
    assert re.search(r'data-workspace="alpha-c0.default.node">.*?not locked', page, re.S)
    # Only the admin is offered the release.
    assert (release_url(cloud, "alpha-c1.default.node") in page) == (role == "admin")
    assert release_url(cloud, "alpha-c0.default.node") not in page


def test_the_page_never_shows_a_secret(world, cloud):
    page = text(browser(world, "admin").get(reverse("provider", args=["cloud"])))
    for secret in (CLOUD_KEY, STATE_SECRET, GIT_TOKEN, "deploy:"):
        assert secret not in page
    assert "credentialsSecret: (hidden)" in page
    assert "nodeTemplate.git.repository: https://****@git.example.invalid/infra/nodes.git" in page


def test_a_capacity_the_kind_cannot_read_is_said_on_the_page(world, cloud, monkeypatch):
    class Unreachable:
        def capacity(self, node_type):
            raise KindError("the cloud's API did not answer within 10 s")

    monkeypatch.setitem(kinds._KINDS, "terraform", Unreachable())
    page = text(browser(world, "operator").get(reverse("provider", args=["cloud"])))
    assert "capacity unknown: the cloud's API did not answer within 10 s" in page


def test_other_providers_pages_carry_no_untested_notice(world, cloud):
    page = text(browser(world, "admin").get(reverse("provider", args=["metal3"])))
    assert "Metal3" in page and UNTESTED not in page and "OpenTofu workspaces" not in page
    assert re.search(r'data-node-type="gpu-server">.*?host', page, re.S)  # the console's own hosts, counted


@pytest.mark.parametrize("role", ["member_a", "viewer_a", "member_b"])
def test_a_tenant_member_finds_no_provider_page(world, cloud, role):
    client = browser(world, role)
    assert client.get(reverse("provider", args=["cloud"])).status_code == 404
    assert client.get(release_url(cloud, "alpha-c1.default.node")).status_code == 404
    assert post_with_csrf(client, release_url(cloud, "alpha-c1.default.node")).status_code == 404
    assert TofuState.objects.get(name="alpha-c1.default.node").lock_id == "lock-1f2e"


def test_a_missing_provider_or_workspace_is_not_found(world, cloud):
    client = browser(world, "admin")
    assert client.get(reverse("provider", args=["no-such"])).status_code == 404
    assert client.get(release_url(cloud, "no-such.default.node")).status_code == 404
    assert client.get(release_url(NodeProvider.objects.get(name="metal3"), "alpha-c1.default.node")
                      ).status_code == 404


@pytest.mark.parametrize("role", ["operator", "auditor"])
def test_an_operator_or_auditor_may_not_release_a_lock(world, cloud, role):
    client = browser(world, role)
    assert client.get(release_url(cloud, "alpha-c1.default.node")).status_code == 403
    assert post_with_csrf(client, release_url(cloud, "alpha-c1.default.node")).status_code == 403
    state = TofuState.objects.get(name="alpha-c1.default.node")
    assert (state.lock_id, state.lock_info["Who"]) == ("lock-1f2e", "worker@node-3")
    assert not Event.objects.filter(step="tofu-lock-released").exists()


def test_an_admin_releases_a_stuck_lock_after_confirming_and_the_event_says_who_and_which(world, cloud):
    client = browser(world, "admin")
    url = release_url(cloud, "alpha-c1.default.node")
    confirmation = client.get(url)
    shown = text(confirmation)
    assert "lock-1f2e" in shown and "worker@node-3" in shown and STATE_SECRET not in shown
    token = CSRF.search(confirmation.content.decode()).group(1)
    done = client.post(url, {"csrfmiddlewaretoken": token}, follow=True)
    assert done.redirect_chain[-1][0] == reverse("provider", args=["cloud"])
    assert "lock lock-1f2e released" in text(done)
    state = TofuState.objects.get(name="alpha-c1.default.node")
    assert (state.lock_id, state.lock_info, state.locked_at) == ("", {}, None)
    assert str(state.tofu_state) == STATE_SECRET and state.serial == 7  # the state itself is untouched
    event = Event.objects.get(step="tofu-lock-released")
    assert event.actor == world.actor("admin") and event.data["workspace"] == "alpha-c1.default.node"
    assert event.data["lock"]["ID"] == "lock-1f2e" and event.claim.name == "alpha-c1"
    assert STATE_SECRET not in event.message + json.dumps(event.data)
    assert 'data-workspace="alpha-c1.default.node">' in text(done)  # no longer stuck


def test_releasing_a_workspace_that_is_not_locked_says_so_and_records_nothing(world, cloud):
    client = browser(world, "admin")
    url = release_url(cloud, "alpha-c0.default.node")
    assert "is not locked: nothing to release" in text(client.get(url))
    done = text(post_with_csrf(client, url, follow=True))
    assert "OpenTofu state alpha-c0.default.node is not locked: nothing to release" in done
    assert not Event.objects.filter(step="tofu-lock-released").exists()


def test_a_release_without_the_csrf_token_is_refused(world, cloud):
    client = browser(world, "admin")
    assert client.post(release_url(cloud, "alpha-c1.default.node")).status_code == 403
    assert TofuState.objects.get(name="alpha-c1.default.node").lock_id == "lock-1f2e"
