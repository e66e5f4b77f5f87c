"""The Event log records that a secret changed, never its text. Secrets are found by their field type (an encrypted
field, on any app's model), so a new one is masked without a word of it in events/."""
pytest_plugins = ["tests.api_conftest"]

import json  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from django.apps import apps  # noqa: E402

from core.crypto import EncryptedTextField  # noqa: E402
from events.models import Event  # noqa: E402
from events.services import is_secret  # noqa: E402
from pools.models import Tenant  # noqa: E402

EVENTS = Path(__file__).resolve().parent.parent / "events"


def encrypted_fields() -> list:
    return [field for model in apps.get_models() for field in model._meta.concrete_fields
            if isinstance(field, EncryptedTextField)]


@pytest.mark.django_db
def test_a_tenants_new_kubeconfig_is_recorded_as_set_never_its_text(world, api):
    before = "(set)" if Tenant.objects.get(pk=world.alpha.pk).kubeconfig else "(empty)"
    kubeconfig = "apiVersion: v1\nusers:\n- user:\n    token: kc-alpha-9d41e7\n"
    changed = api("admin", "patch", f"/api/v1/tenants/{world.alpha.pk}/", {"kubeconfig": kubeconfig})
    assert changed.status_code == 200
    assert Tenant.objects.get(pk=world.alpha.pk).kubeconfig == kubeconfig
    event = Event.objects.filter(object_type="tenant", tenant_id=world.alpha.pk, kind="change").latest("id")
    assert event.data == {"kubeconfig": [before, "(set)"]}
    assert event.message == f"kubeconfig: {before} → (set)"
    assert "kc-alpha-9d41e7" not in event.message + json.dumps(event.data)


def test_the_apps_hold_encrypted_fields_and_every_one_is_a_secret_to_the_event_log():
    fields = encrypted_fields()
    assert {"hosts.BareMetalHost.bmc_password", "pools.Tenant.kubeconfig"} <= {str(f) for f in fields}
    assert [str(f) for f in fields if not is_secret(f)] == []


def test_events_names_no_secret_field_of_another_app():
    names = {field.name for field in encrypted_fields() if field.model._meta.app_label != "events"}
    named = {(path.name, name) for path in EVENTS.rglob("*.py") for name in names
             if re.search(rf"""["']{name}["']""", path.read_text())}
    assert named == set()
