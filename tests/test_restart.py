"""A restart of `./bin/run` changes nothing an admin made: the demo is loaded once, into an empty database."""
import io
import shlex
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from rest_framework.test import APIClient

from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record
from pools.models import NodePool, NodeType, OSImage

from .api_conftest import issue_token

pytestmark = pytest.mark.django_db
@pytest.fixture(autouse=True)
def _var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path  # the demo keeps the admin's password there: not in the checkout's var/


BIN_RUN = Path(__file__).resolve().parent.parent / "bin" / "run"


def start_up_commands() -> list[list[str]]:
    """The manage.py commands bin/run runs before it starts its processes: those it waits for (no `&`)."""
    commands = []
    for line in BIN_RUN.read_text().replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "manage.py" in words and "&" not in words:
            commands.append(words[words.index("manage.py") + 1:])
    return commands


def start_up() -> str:
    out = io.StringIO()
    for args in start_up_commands():
        call_command(*args, stdout=out, stderr=out)
    return out.getvalue()


def export() -> str:
    out = io.StringIO()
    call_command("export", stdout=out)
    return out.getvalue()


def admin_client() -> APIClient:
    admin = User.objects.create_user("root-admin", is_staff=True, is_superuser=True)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(admin)}")
    return client


def test_bin_run_starts_with_prepare_which_loads_the_demo_into_an_empty_database():
    assert start_up_commands() == [["prepare", "--no-demo-hosts"], ["reconcile-world"]]
    printed = start_up()
    assert "demo data: 13 object(s) created or changed" in printed and "login: admin / " in printed
    assert NodePool.objects.get(name="gpu").quantity == 1 and OSImage.objects.count() == 1
    assert NodePool.objects.get(tenant__name="two", name="gpu-auto").kind == "dynamic"


def test_a_restart_after_changes_through_the_api_leaves_the_export_byte_identical():
    start_up()  # the first start, on an empty database
    client = admin_client()
    gpu = NodePool.objects.get(tenant__name="one", name="gpu")
    assert client.patch(f"/api/v1/pools/{gpu.pk}/", {"quantity": 2}, format="json").status_code == 200
    node_type = NodeType.objects.get(name="gpu-server")
    assert client.patch(f"/api/v1/nodetypes/{node_type.pk}/", {"health_nccl_min_busbw_gbps": 350},
                        format="json").status_code == 200
    image = OSImage.objects.get()
    assert client.patch(f"/api/v1/osimages/{image.pk}/", {"url": "http://127.0.0.1:8000/images/site.raw",
                                                          "checksum": "ab" * 32}, format="json").status_code == 200
    before = export()
    assert "quantity: 2" in before and "ncclMinBusbwGBps: 350" in before and "site.raw" in before

    printed = start_up()  # the restart

    assert export() == before
    assert "demo data: not loaded, the database is in use" in printed
    assert NodePool.objects.get(pk=gpu.pk).quantity == 2


def test_a_database_with_only_events_is_in_use():
    event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name="ci-bot", actor="system:test",
                 message="API token made")
    assert Event.objects.exists()
    out = io.StringIO()
    call_command("demo", "--no-hosts", stdout=out)
    assert "not loaded, the database is in use" in out.getvalue() and not OSImage.objects.exists()


def test_demo_reload_applies_the_demo_again_on_purpose():
    start_up()
    NodePool.objects.filter(name="gpu").update(quantity=3)
    out = io.StringIO()
    call_command("demo", "--reload", "--no-hosts", stdout=out)
    assert "object(s) created or changed" in out.getvalue()
    assert NodePool.objects.get(name="gpu").quantity == 1
