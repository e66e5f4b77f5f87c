"""The console's NodeType form edits the blocks a manifest sets beside the release gate and warm hosts: the SKU,
the health tiers and the repair ladder, as YAML, checked by NodeType.clean() (the rules apply and the API use);
a bad value is refused next to its field with the same message, and nothing changes."""
import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.forms import NodeTypeForm
from events.models import Event
from pools.models import NodeType


@pytest.fixture
def console(demo_site):
    client = Client()
    client.force_login(User.objects.create_user("root-admin", is_staff=True, is_superuser=True))
    return client


def edit_url(node_type: NodeType) -> str:
    return f"/catalogue/node-types/{node_type.name}/edit/"


def as_posted(node_type: NodeType, **changes) -> dict:
    """What a browser posts back from the edit page as rendered, with `changes` typed over it."""
    data = {}
    for field in NodeTypeForm(instance=node_type):
        value = field.value()
        if value is None or value is False:
            continue  # an empty number or an unticked box: not sent
        data[field.name] = value
    return {**data, **changes}


@pytest.mark.django_db
def test_the_edit_page_shows_the_repair_ladder_as_yaml_and_saves_a_new_one_with_an_event(console):
    node_type = NodeType.objects.get(name="gpu-server")
    NodeType.objects.filter(pk=node_type.pk).update(repair={"ladders": {"gpu-xid": ["gpu-reset", "retest"]}})
    node_type.refresh_from_db()
    page = console.get(edit_url(node_type)).content.decode()
    assert 'id="row-repair"' in page and "Repair ladder" in page
    assert "gpu-xid:\n  - gpu-reset\n  - retest" in page  # the current ladder, as YAML

    response = console.post(edit_url(node_type), as_posted(
        node_type, repair="automatic: true\nladders:\n  gpu-xid: [power-cycle, retest]\n  nccl-slow: []\n"))
    assert response.status_code == 302, response.content.decode()[:2000]
    node_type.refresh_from_db()
    assert node_type.repair == {"automatic": True, "ladders": {"gpu-xid": ["power-cycle", "retest"], "nccl-slow": []}}
    assert node_type.repair_ladder("gpu-xid") == ["power-cycle", "retest"]
    change = Event.objects.filter(object_name="gpu-server", kind="change").latest("id")
    assert list(change.data) == ["repair"] and change.actor.endswith("root-admin")


@pytest.mark.django_db
@pytest.mark.parametrize("field, value, message", [
    ("repair", "ladders: {gpu-xid: [reboot]}", "ladders.gpu-xid[0]: 'reboot' is not a remedy; expected one of"),
    ("repair", "ladders: {gpu-xid: [retest, retest]}", "ladders.gpu-xid: a remedy is listed twice"),
    ("repair", "ladders: {gpu-melted: [retest]}", "ladders.gpu-melted: unknown failure kind; expected one of"),
    ("repair", "automatic: yes please", "automatic: must be true or false"),
    ("repair", "- gpu-reset", "must be a mapping"),
    ("health", "idle: {hostsAtOnce: 0}", "idle.hostsAtOnce: must be a whole number, 1 or more"),
    ("sku", "gpu: {count: eight}", "gpu.count: must be a whole number, 0 or more"),
])
def test_a_bad_block_is_refused_next_to_its_field_with_its_message_and_nothing_changes(console, field, value,
                                                                                       message):
    node_type = NodeType.objects.get(name="gpu-server")
    before = {f.name: getattr(node_type, f.name) for f in NodeType._meta.concrete_fields}
    events = Event.objects.count()
    # A good change to another field in the same post is not saved either.
    response = console.post(edit_url(node_type), as_posted(node_type, display_name="renamed", **{field: value}))
    assert response.status_code == 400
    html = response.content.decode()
    assert f'id="error-{field}"' in html, html[:3000]
    error = html.split(f'id="error-{field}"', 1)[1].split("</ul>", 1)[0]
    assert message in error.replace("&#x27;", "'"), error
    node_type.refresh_from_db()
    assert {f.name: getattr(node_type, f.name) for f in NodeType._meta.concrete_fields} == before
    assert Event.objects.count() == events


@pytest.mark.django_db
def test_an_empty_repair_field_restores_the_default_ladders(console):
    node_type = NodeType.objects.get(name="gpu-server")
    NodeType.objects.filter(pk=node_type.pk).update(repair={"automatic": False})
    node_type.refresh_from_db()
    assert node_type.repair_ladder("gpu-xid") == []
    response = console.post(edit_url(node_type), as_posted(node_type, repair=""))
    assert response.status_code == 302
    node_type.refresh_from_db()
    assert node_type.repair == {} and node_type.repair_ladder("gpu-xid")  # the default ladder again


@pytest.mark.django_db
def test_a_node_type_s_inspection_mode_is_set_from_its_edit_page_and_a_bad_one_is_refused(console):
    node_type = NodeType.objects.get(name="gpu-server")
    page = console.get(edit_url(node_type)).content.decode()
    assert 'name="inspection_mode"' in page and "Inspection" in page
    refused = console.post(edit_url(node_type), as_posted(node_type, inspection_mode="disabled"))
    assert refused.status_code == 400 and "Select a valid choice." in refused.content.decode()
    assert NodeType.objects.get(pk=node_type.pk).inspection_mode == ""
    response = console.post(edit_url(node_type), as_posted(node_type, inspection_mode="fast"))
    assert response.status_code == 302, response.content.decode()[:2000]
    assert NodeType.objects.get(pk=node_type.pk).inspection_mode == "fast"
    change = Event.objects.filter(object_name="gpu-server", kind="change").latest("id")
    assert change.data["inspection_mode"] == ["", "fast"]
