"""Join tokens a person can see and revoke, against the lab's tenant Kubernetes APIs: "Join Node…" shows the same
person's live token again instead of minting one per click; the tenant page lists the tokens (for whom, when, the
expiry, whether a node used one); revoking one deletes it in the tenant's API, after which a kubelet cannot join
with it; another tenant's member neither sees nor revokes it. Every response is checked for secrets."""
pytest_plugins = ["tests.api_conftest"]

import re  # noqa: E402
from html import unescape  # noqa: E402

import pytest  # noqa: E402
from django.test import Client  # noqa: E402

from claims.models import JoinToken  # noqa: E402
from events.models import Event  # noqa: E402
from lab.kube import KubeletJoinError, TenantAPIServer, kubelet_join  # noqa: E402
from pools.models import Tenant  # noqa: E402

pytestmark = pytest.mark.django_db
TOKEN_IN_COMMAND = re.compile(r"token=([a-z0-9]{6})\.([a-z0-9]{16})")


@pytest.fixture
def alpha_api(world):
    with TenantAPIServer("alpha") as server:
        Tenant.objects.filter(pk=world.alpha.pk).update(api_endpoint=server.endpoint)
        tenant = Tenant.objects.get(pk=world.alpha.pk)
        tenant.kubeconfig = server.kubeconfig()
        tenant.save(update_fields=["kubeconfig"])
        yield server


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def join(client: Client, tenant: str = "alpha") -> str:
    """The token id.secret in the join command the button shows."""
    answer = client.post(f"/tenants/{tenant}/join/", HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    match = TOKEN_IN_COMMAND.search(unescape(answer.content.decode()))
    assert match, answer.content.decode()
    return f"{match[1]}.{match[2]}"


def secrets_in(server) -> set[str]:
    return {s["metadata"]["name"] for s in server.objects("secrets", "kube-system")
            if s["metadata"]["name"].startswith("bootstrap-token-")}


def listed(client: Client, tenant: str = "alpha") -> dict[str, str]:
    page = client.get(f"/tenants/{tenant}/join-tokens/")
    assert page.status_code == 200
    rows = re.findall(r'<tr data-token="([a-z0-9]{6})">(.*?)</tr>', page.content.decode(), re.S)
    return {token: re.sub(r"<[^>]+>", " ", row) for token, row in rows}


def test_join_node_shows_the_same_live_token_again_rather_than_minting_one_per_click(world, alpha_api):
    alice = signed_in(world.users["member_a"])
    first = join(alice)
    assert join(alice) == first
    assert secrets_in(alpha_api) == {f"bootstrap-token-{first[:6]}"}
    admin = signed_in(world.users["admin"])
    assert join(admin) != first  # another person: a token of their own
    assert JoinToken.objects.filter(tenant=world.alpha).count() == 2
    shown = Event.objects.filter(kind="read", tenant=world.alpha, actor="user:alice-alpha")
    assert [e.message for e in shown.order_by("id")] == [f"join command shown (join token {first[:6]})",
                                                         f"join command shown (join token {first[:6]}, again)"]
    assert all(first[7:] not in e.message for e in Event.objects.all())


def test_the_tenant_page_lists_its_join_tokens_and_tells_which_one_a_node_used(world, alpha_api):
    alice, admin = signed_in(world.users["member_a"]), signed_in(world.users["admin"])
    mine, theirs = join(alice), join(admin)
    rows = listed(alice)
    assert set(rows) == {mine[:6], theirs[:6]}
    assert "alice-alpha" in rows[mine[:6]] and "ada-admin" in rows[theirs[:6]]
    assert " no " in rows[mine[:6]]
    kubelet_join(alpha_api.endpoint, mine, "hand-made-1")
    rows = listed(alice)
    assert " yes " in rows[mine[:6]] and " no " in rows[theirs[:6]]
    assert JoinToken.objects.get(token_id=mine[:6]).used_at is not None


def test_a_revoked_join_token_is_gone_in_the_tenant_api_and_a_kubelet_cannot_join_with_it(world, alpha_api):
    alice = signed_in(world.users["member_a"])
    token = join(alice)
    row = JoinToken.objects.get(token_id=token[:6])
    assert alice.post(f"/tenants/alpha/join-tokens/{row.pk}/revoke/").status_code == 302
    assert secrets_in(alpha_api) == set()
    with pytest.raises(KubeletJoinError, match="refused the bootstrap token"):
        kubelet_join(alpha_api.endpoint, token, "too-late")
    assert "revoked" in listed(alice)[token[:6]]
    assert join(alice) != token  # the next click makes a new one
    event = Event.objects.filter(tenant=world.alpha, message__contains="revoked").latest("id")
    assert event.actor == "user:alice-alpha" and event.via == "session"


def test_another_tenant_s_member_and_an_auditor_can_neither_see_nor_revoke_it(world, alpha_api):
    token = join(signed_in(world.users["member_a"]))
    row = JoinToken.objects.get(token_id=token[:6])
    bob = signed_in(world.users["member_b"])
    assert bob.get("/tenants/alpha/join-tokens/").status_code == 404
    assert bob.post(f"/tenants/alpha/join-tokens/{row.pk}/revoke/").status_code == 404
    assert bob.post(f"/tenants/bravo/join-tokens/{row.pk}/revoke/").status_code == 404  # not bravo's token
    auditor = signed_in(world.users["auditor"])
    assert token[:6] in listed(auditor)  # auditors read everything ...
    assert auditor.post(f"/tenants/alpha/join-tokens/{row.pk}/revoke/").status_code == 403  # ... and change nothing
    assert secrets_in(alpha_api) == {f"bootstrap-token-{token[:6]}"}
    assert JoinToken.objects.get(pk=row.pk).revoked_at is None
