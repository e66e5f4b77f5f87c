"""Lists that follow the fleet live, new rows included, with the page's filters applied, spoken to as a browser
does (a websocket with the session cookie): the claims list, and isolation on it."""
import re

import pytest
from channels.db import database_sync_to_async as sync_to_async

from claims.models import NodeClaim
from pools.models import NodePool

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import pool  # noqa: E402
from .console_conftest import connect, latest_event, receive_until, resync, session_cookie  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def apply_and_reconcile(apply, text: str, tenant: str, pools: list[str]) -> dict[str, NodeClaim]:
    """`manage.py apply`, then the reconcile its pool changes ask the worker for: pool name → the new claim."""
    from claims.reconcile import pools_reconcile

    apply(text, tenant=tenant)
    ids = [pool(tenant, name).pk for name in pools]
    pools_reconcile(pool_ids=ids)
    return {name: NodeClaim.objects.filter(pool_id=pool(tenant, name).pk).order_by("-pk").first() for name in pools}


async def test_a_new_claim_that_matches_the_filter_is_added_at_the_top_and_one_that_does_not_stays_off(
        client, users, apply, seed_block):
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    communicator = await connect("/ws/claims/?pool=gpu", cookie)
    await resync(communicator, since=await latest_event())
    claims = await sync_to_async(apply_and_reconcile)(apply, seed_block, "one", ["gpu", "cpu"])
    gpu, cpu = claims["gpu"], claims["cpu"]
    frame = await receive_until(communicator, f'hx-swap-oob="afterbegin:#claims-rows"><tr id="claim-{gpu.pk}"')
    assert gpu.name in frame
    # Later changes of the new row come as in-place updates (the consumer shows it now) and the other claim's
    # changes never render: nothing of it reaches this page.
    await sync_to_async(NodeClaim.objects.filter(pk=gpu.pk).update)(message="still waiting")
    from events.services import event_record

    await sync_to_async(event_record)(kind="action", object_type="claim", object_name=gpu.name, actor="test",
                                      claim_id=gpu.pk, tenant_id=gpu.tenant_id, message="touched")
    frame += await receive_until(communicator, f'<tr id="claim-{gpu.pk}"[^>]*>(.|\n)*still waiting')
    assert cpu.name not in frame
    await communicator.disconnect()


async def test_a_page_that_reconnects_gets_the_claims_created_while_it_was_away(client, users, apply, seed_block):
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    since = await latest_event()
    claims = await sync_to_async(apply_and_reconcile)(apply, seed_block, "one", ["gpu", "cpu"])
    communicator = await connect("/ws/claims/?pool=cpu", cookie)
    frame = await resync(communicator, since=since)
    assert f'<tr id="claim-{claims["cpu"].pk}"' in frame
    assert claims["gpu"].name not in frame
    await communicator.disconnect()


async def test_a_later_page_of_the_list_gets_no_new_rows(client, users, apply, seed_block):
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    since = await latest_event()
    claims = await sync_to_async(apply_and_reconcile)(apply, seed_block, "one", ["gpu"])
    communicator = await connect("/ws/claims/?page=2", cookie)
    frame = await resync(communicator, since=since)
    assert claims["gpu"].name not in frame
    await communicator.disconnect()


async def test_a_members_claims_list_never_receives_another_tenants_new_claims(client, users, apply, seed_block):
    from .console_conftest import TWO_YAML

    cookie = await sync_to_async(session_cookie)(client, users["alice"])  # member of one only
    communicator = await connect("/ws/claims/", cookie)
    await resync(communicator, since=await latest_event())
    theirs = await sync_to_async(apply_and_reconcile)(apply, TWO_YAML.replace("quantity: 1", "quantity: 2"), "two",
                                                      ["cpu"])
    mine = await sync_to_async(apply_and_reconcile)(apply, seed_block, "one", ["gpu"])
    frame = await receive_until(communicator, f'<tr id="claim-{mine["gpu"].pk}"')
    # and the re-sync from the Event log, which reads every claim event, renders none of tenant two's either
    frame += await resync(communicator, since=0)
    assert theirs["cpu"].name not in frame
    assert "two" not in [w for w in frame.replace("<", " ").replace(">", " ").split()]
    await communicator.disconnect()


async def test_new_events_appear_at_the_top_of_the_event_log_with_its_filters(client, users, apply, seed_block):
    from hosts.services import host_set_maintenance

    from .console_conftest import first_available

    cookie = await sync_to_async(session_cookie)(client, users["auditor"])
    communicator = await connect("/ws/events/?object_type=pool", cookie)
    await resync(communicator, since=await latest_event())
    host = await first_available()
    await sync_to_async(host_set_maintenance)(host=host, on=True, actor="test", reason="fan swap")
    await sync_to_async(apply)(seed_block, tenant="one")
    frame = await receive_until(communicator, 'hx-swap-oob="afterbegin:#event-log-rows"><tr data-event="\\d+"')
    assert re.search(r'<td>pool <a href="/tenants/one/pools/gpu/" data-link="pool">\S*gpu</a>', frame)  # its page
    assert "quantity: 0 → 1" in frame
    assert "fan swap" not in frame and host.name not in frame
    await communicator.disconnect()


async def test_a_members_event_log_never_receives_another_tenants_events(client, users, apply, seed_block):
    from .console_conftest import TWO_YAML

    cookie = await sync_to_async(session_cookie)(client, users["alice"])  # member of one only
    communicator = await connect("/ws/events/", cookie)
    await resync(communicator, since=await latest_event())
    await sync_to_async(apply)(TWO_YAML.replace("quantity: 1", "quantity: 3"), tenant="two")
    await sync_to_async(apply)(seed_block, tenant="one")
    frame = await receive_until(communicator, "quantity: 0 → 1")
    frame += await resync(communicator, since=0)
    assert "quantity: 1 → 3" not in frame
    assert not [w for w in frame.replace("<", " ").replace(">", " ").split() if w == "two"]
    await communicator.disconnect()


async def test_the_event_log_socket_is_refused_without_a_login(client, users):
    communicator = await connect("/ws/events/", None)
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    await communicator.disconnect()


async def test_a_rarely_changing_list_is_told_it_is_stale_when_its_objects_change(client, users):
    from hosts.choices import HostState
    from hosts.services import host_transition

    from .console_conftest import first_available

    cookie = await sync_to_async(session_cookie)(client, users["auditor"])
    communicator = await connect("/ws/lists/repair/", cookie)
    first = await resync(communicator, since=await latest_event())
    assert "live-stale" not in first  # nothing changed since the page was rendered
    host = await first_available()

    def fail():
        host_transition(host=host, to_state=HostState.REGISTERING, actor="test")
        host_transition(host=host, to_state=HostState.ERROR, actor="system:flow", reason="BMC unreachable")

    await sync_to_async(fail)()
    await receive_until(communicator, 'id="live-stale"')
    await communicator.disconnect()


async def test_a_members_tenant_list_is_not_told_of_another_tenants_changes(client, users, apply, seed_block):
    from .console_conftest import TWO_YAML

    cookie = await sync_to_async(session_cookie)(client, users["alice"])
    since = await latest_event()
    await sync_to_async(apply)(TWO_YAML.replace("quantity: 1", "quantity: 3"), tenant="two")
    communicator = await connect("/ws/lists/tenants/", cookie)
    assert "live-stale" not in await resync(communicator, since=since)
    await sync_to_async(apply)(seed_block, tenant="one")
    await receive_until(communicator, 'id="live-stale"')
    await communicator.disconnect()
    for topic in ("repair", "catalogue", "nonsense"):
        refused = await connect(f"/ws/lists/{topic}/", cookie)
        assert await refused.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}, topic
        await refused.disconnect()


async def test_the_claims_lists_group_table_follows_its_groups_live_and_a_member_never_gets_another_tenants(
        client, users, apply, seed_block):
    from claims.models import ClaimGroup
    from claims.reconcile import pools_reconcile
    from hosts.models import BareMetalHost
    from hosts.topology import RAIL_GROUP_LABEL

    admin = await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users["admin"]))
    bob = await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users["bob"]))  # tenant two
    since = await latest_event()
    await resync(admin, since=since)
    await resync(bob, since=since)

    def ask_for_a_group():
        # Tenant one's gpu pool comes in groups of 2 on one rail group: no GPU host says its rail group yet.
        NodePool.objects.filter(tenant__name="one", name="gpu").update(quantity=2, group={"size": 2})
        pools_reconcile(pool_ids=[pool("one", "gpu").pk])
        return ClaimGroup.objects.get()

    group = await sync_to_async(ask_for_a_group)()
    # Waiting, and why, in its row: the allocator's reason (no Event says it: the members' ids are published). One
    # wait for both: the row and its reason may come in one frame or two.
    await receive_until(admin, f'data-group="{group.name}" data-state="Waiting">((?!</tr>)[\\s\\S])*'
                               "needs 2 on one rail group; no free host of type gpu-server has a rail group label")

    def rails_labelled():
        for host in BareMetalHost.objects.filter(labels__role="gpu"):
            BareMetalHost.objects.filter(pk=host.pk).update(labels={**host.labels, RAIL_GROUP_LABEL: "r1"})
        pools_reconcile(pool_ids=[group.pool_id])

    await sync_to_async(rails_labelled)()
    await receive_until(admin, f'data-group="{group.name}" data-state="Provisioning">((?!</tr>)[\\s\\S])*rail r1')
    # Tenant two's member heard nothing of it, live or from the Event log.
    frame = await resync(bob, since=since)
    assert group.name not in frame and "claim-groups-section" not in frame
    await admin.disconnect()
    await bob.disconnect()
