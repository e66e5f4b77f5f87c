"""`manage.py token create USER --service-user ROLE [--tenant T]`: the user automation acts as, made when missing."""
import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from access.models import ApiToken
from core import scoping
from events.models import Event

from .api_conftest import ISSUED_KEYS

pytestmark = pytest.mark.django_db


def token_create(*args) -> APIClient:
    out = io.StringIO()
    call_command("token", "create", *args, stdout=out)
    key = out.getvalue().strip()
    ISSUED_KEYS.add(key)  # the leak check knows it from here on
    assert len(key) == 64
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_an_admin_service_user_is_made_without_a_password_and_its_token_works(world):
    client = token_create("ci-bot", "--service-user", "admin")
    bot = User.objects.get(username="ci-bot")
    assert scoping.role(bot) == scoping.ADMIN and not bot.has_usable_password() and not bot.is_superuser
    assert client.get("/api/v1/hosts/").status_code == 200
    pool = world.pool_a
    assert client.patch(f"/api/v1/pools/{pool.pk}/", {"quantity": pool.quantity}, format="json").status_code == 200
    assert Event.objects.filter(object_type="user", object_name="ci-bot",
                                message__startswith="service user made (admin").exists()


def test_an_auditor_service_user_reads_everything_and_changes_nothing(world):
    client = token_create("audit-bot", "--service-user", "auditor")
    assert scoping.role(User.objects.get(username="audit-bot")) == scoping.AUDITOR
    pools = client.get("/api/v1/pools/").json()["results"]
    assert {p["tenant"] for p in pools} == {"alpha", "bravo"}
    assert client.patch(f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 0}, format="json").status_code == 403


def test_a_member_service_user_belongs_to_its_tenant_only(world):
    client = token_create("alpha-bot", "--service-user", "member", "--tenant", "alpha")
    pools = client.get("/api/v1/pools/").json()["results"]
    assert {p["tenant"] for p in pools} == {"alpha"}
    assert Event.objects.filter(object_type="membership", tenant=world.alpha).exists()


def test_running_it_again_gives_the_same_user_a_second_token_and_the_first_keeps_working(world):
    first = token_create("ci-bot", "--service-user", "admin")
    second = token_create("ci-bot", "--service-user", "admin")
    assert User.objects.filter(username="ci-bot").count() == 1
    assert sorted(ApiToken.objects.filter(user__username="ci-bot").values_list("name", flat=True)) == [
        "token", "token-2"]
    assert first.get("/api/v1/hosts/").status_code == 200 and second.get("/api/v1/hosts/").status_code == 200


@pytest.mark.parametrize("args, message", [
    (["new-bot", "--service-user", "member"], "give --tenant NAME"),
    (["new-bot", "--service-user", "member", "--tenant", "nowhere"], "no tenant 'nowhere'"),
    (["new-bot", "--service-user", "admin", "--tenant", "alpha"], "--tenant is for members only"),
    (["bad bot!", "--service-user", "admin"], "username"),
    (["new-bot"], "no user 'new-bot' (--service-user admin|auditor|member makes one"),
    (["new-bot", "--tenant", "alpha"], "--tenant goes with --service-user member"),
])
def test_bad_input_is_refused_and_makes_nothing(world, args, message):
    users, events = User.objects.count(), Event.objects.count()
    with pytest.raises(CommandError) as refused:
        call_command("token", "create", *args, stdout=io.StringIO())
    assert message in str(refused.value)
    assert User.objects.count() == users and Event.objects.count() == events


@pytest.mark.parametrize("args", [["--service-user", "admin"], ["--service-user", "member", "--tenant", "bravo"]])
def test_an_existing_user_of_another_role_or_tenant_is_refused_and_left_as_it_was(world, args):
    alice = world.users["member_a"]  # a member of alpha
    with pytest.raises(CommandError, match="alice-alpha"):
        call_command("token", "create", "alice-alpha", *args, stdout=io.StringIO())
    alice.refresh_from_db()
    assert not alice.is_staff and list(alice.tenant_memberships.values_list("tenant__name", flat=True)) == ["alpha"]
    assert ApiToken.objects.get(user=alice).prefix == world.tokens["member_a"][:8]  # its token still the same
