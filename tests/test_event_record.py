"""One function records events (events.services.events_record, and event_record for one): it writes the
rows, refuses kinds and object types that are not declared choices, and, once the transaction commits,
publishes to the live groups the events' links name, so no writer picks group names by hand."""
import asyncio
import random

import pytest
from channels.db import database_sync_to_async as sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from core import live
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record, events_record


@pytest.fixture
def published(monkeypatch) -> list[tuple[list[str], dict]]:
    sent = []
    monkeypatch.setattr(live, "publish", lambda groups, message: sent.append((groups, message)))
    return sent


def far_ids(n: int) -> list[int]:
    """Ids no other test's objects have (Event links have no foreign key constraint): the groups are ours."""
    base = random.randrange(10**9, 2 * 10**9)
    return [base + i for i in range(n)]


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_an_event_recorded_through_the_function_reaches_the_groups_its_links_name():
    host_id, claim_id, tenant_id = far_ids(3)
    groups = ["fleet", f"host-{host_id}", f"claim-{claim_id}", f"tenant-{tenant_id}"]
    layer = get_channel_layer()
    channels = {}
    for group in groups + [f"host-{host_id + 1}"]:
        channels[group] = await layer.new_channel()
        await layer.group_add(group, channels[group])

    @sync_to_async
    def record():
        with transaction.atomic():
            event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name="gpu-77", host_id=host_id,
                         claim_id=claim_id, tenant_id=tenant_id, step="write_image", message="done",
                         actor="system:flow")

    await record()
    want = {"type": "object.changed", "object": "host", "ids": [host_id], "step": "write_image"}
    for group in groups:
        while True:  # the fleet group carries other tests' messages too
            message = await asyncio.wait_for(layer.receive(channels[group]), timeout=5)
            if message.get("ids") == [host_id]:
                break
        assert message == want, group
    with pytest.raises(asyncio.TimeoutError):  # a group the event does not link
        await asyncio.wait_for(layer.receive(channels[f"host-{host_id + 1}"]), timeout=0.5)
    for group, channel in channels.items():
        await layer.group_discard(group, channel)


@pytest.mark.django_db
def test_a_batch_goes_out_on_commit_as_one_message_to_every_group_its_events_link(
        published, django_capture_on_commit_callbacks):
    a, b, tenant = far_ids(3)
    with django_capture_on_commit_callbacks(execute=True):
        events_record([Event(kind=EventKind.TRANSITION, object_type=ObjectType.HOST, object_name=name, host_id=pk,
                             tenant_id=tenant_id, from_state="available", to_state="maintenance", actor="test")
                       for name, pk, tenant_id in (("a", a, tenant), ("b", b, None))])
        assert published == []  # not before the commit
    assert published == [(["fleet", f"host-{a}", f"host-{b}", f"tenant-{tenant}"],
                          {"object": "host", "ids": [a, b], "from_state": "available", "to_state": "maintenance"})]
    assert Event.objects.filter(host_id__in=[a, b]).count() == 2


@pytest.mark.django_db
def test_a_claim_s_transition_reaches_the_claims_its_tenant_s_and_its_host_s_groups(
        published, django_capture_on_commit_callbacks):
    claim, tenant, host = far_ids(3)
    with django_capture_on_commit_callbacks(execute=True):
        event_record(kind=EventKind.TRANSITION, object_type=ObjectType.CLAIM, object_name="one-x", claim_id=claim,
                     tenant_id=tenant, host_id=host, from_state="Joining", to_state="Available", actor="test")
    assert published == [(["claims", f"host-{host}", f"claim-{claim}", f"tenant-{tenant}"],
                          {"object": "claim", "ids": [claim], "from_state": "Joining", "to_state": "Available"})]


@pytest.mark.django_db
def test_a_change_of_an_object_without_a_group_of_its_own_reaches_its_tenant_s_group(
        published, django_capture_on_commit_callbacks):
    [tenant] = far_ids(1)
    with django_capture_on_commit_callbacks(execute=True):
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.POOL, object_name="t/gpu", tenant_id=tenant,
                     message="quantity: 1 → 2", actor="test")
    assert published == [([f"tenant-{tenant}"], {"object": "pool", "ids": []})]


@pytest.mark.django_db
def test_nothing_is_published_when_the_transaction_rolls_back(published, django_capture_on_commit_callbacks):
    [host] = far_ids(1)
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            event_record(kind=EventKind.ACTION, object_type=ObjectType.HOST, object_name="h", host_id=host,
                         actor="test")
            raise RuntimeError("the write failed")
    assert published == [] and not Event.objects.filter(host_id=host).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("kind, object_type", [("change", "widget"), ("update", "host")])
def test_an_undeclared_kind_or_object_type_is_refused_and_nothing_written(kind, object_type, published):
    with pytest.raises(ValueError):
        event_record(kind=kind, object_type=object_type, object_name="x", actor="test")
    assert not Event.objects.filter(object_name="x").exists() and published == []


@pytest.mark.django_db
def test_every_event_a_whole_site_writes_has_a_declared_kind_and_object_type(world, api):
    api("admin", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2})
    api("admin", "post", "/api/v1/hosts/", {
        "name": "gpu-29", "bmc_address": "redfish+http://127.0.0.1:8099/redfish/v1/Systems/gpu-29",
        "boot_mac": "52:54:00:00:29:01", "bmc_username": "user-gpu-29", "bmc_password": "pw-gpu-29-7c1d"})
    kinds = set(Event.objects.values_list("kind", flat=True))
    types = set(Event.objects.values_list("object_type", flat=True))
    assert {"transition", "change", "action"} <= kinds <= set(EventKind.values)
    assert {"host", "claim", "pool", "tenant", "token"} <= types <= set(ObjectType.values)


@pytest.mark.django_db
def test_events_recorded_together_keep_every_value_and_get_their_ids_in_order(published):
    recorded = events_record([
        Event(kind=EventKind.DECISION, object_type=ObjectType.POOL, object_name=f"pool-{i}", actor="user:alice",
              message=f"line one\nline two %s {i}", address="10.0.0.7" if i % 2 else "::1", duration_s=i / 2,
              data={"pods": ["ml/a", "ml/b"], "quote": "it's \"here\"", "none": None, "n": i})
        for i in range(60)])  # more rows than a statement's parameters are cached for

    rows = {e.pk: e for e in Event.objects.filter(pk__in=[e.pk for e in recorded])}
    assert len(rows) == 60
    for i, event in enumerate(recorded):
        row = rows[event.pk]
        assert row.object_name == f"pool-{i}" and row.message == f"line one\nline two %s {i}"
        assert row.address == ("10.0.0.7" if i % 2 else "::1") and row.duration_s == i / 2
        assert row.data == {"pods": ["ml/a", "ml/b"], "quote": "it's \"here\"", "none": None, "n": i}
        assert row.created_at == event.created_at
