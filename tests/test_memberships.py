"""`manage.py membership add|remove USER TENANT`: who belongs to which tenant, changed on the record."""
import getpass
import io

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from events.models import Event
from pools.models import Tenant
from core import scoping

pytestmark = pytest.mark.django_db


def membership(*args) -> str:
    out = io.StringIO()
    call_command("membership", *args, stdout=out)
    return out.getvalue().strip()


@pytest.fixture
def bob():
    return User.objects.create_user("bob")


@pytest.fixture
def one():
    return Tenant.objects.create(name="one")


def test_adding_and_removing_a_member_is_recorded_and_asking_twice_changes_nothing(bob, one):
    assert membership("add", "bob", "one", "--actor", "cli:ops") == "bob is now a tenant admin of one"
    assert membership("add", "bob", "one", "--actor", "cli:ops") == "bob was already a tenant admin of one"
    assert scoping.tenant_ids(bob) == [one.pk]
    assert membership("remove", "bob", "one", "--actor", "cli:ops") == "bob is no longer a member of one"
    assert membership("remove", "bob", "one", "--actor", "cli:ops") == "bob was not a member of one"
    assert scoping.tenant_ids(bob) == []
    assert [(e.object_type, e.object_name, e.actor, e.message, e.tenant_id) for e in Event.objects.order_by("id")] == [
        ("membership", "bob in one (admin)", "cli:ops", "created", one.pk),
        ("membership", "bob in one (admin)", "cli:ops", "deleted", one.pk)]


def test_the_login_name_is_the_actor_by_default_and_unknown_names_are_refused(bob, one):
    membership("add", "bob", "one")
    assert Event.objects.get().actor == f"cli:{getpass.getuser()}"
    with pytest.raises(CommandError, match="no user 'carol'"):
        membership("add", "carol", "one")
    with pytest.raises(CommandError, match="no tenant 'two'"):
        membership("remove", "bob", "two")
    assert Event.objects.count() == 1
