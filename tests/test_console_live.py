"""The live views' consumers, spoken to as a browser does (a websocket with the session cookie): who may
join, what a change sends, and how a page that missed messages catches up from the Event log."""
import re

import pytest
from channels.db import database_sync_to_async as sync_to_async  # closes the connections it opens

from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_set_maintenance
from pools.models import Tenant

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import (  # noqa: E402
    connect, first_available, latest_event, pool, receive_until, resync, session_cookie)

pytest_plugins = ["tests.console_conftest"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def cursor_of(frame: str) -> int:
    return int(re.search(r'id="live-cursor" data-cursor="(\d+)"', frame).group(1))


async def test_a_member_may_not_join_another_tenant_or_the_fleet(client, users, console_site):
    cookie = await sync_to_async(session_cookie)(client, users["bob"])
    one, two = console_site["one"], console_site["two"]
    for path in (f"/ws/tenants/{one.pk}/", "/ws/fleet/", "/ws/claims/999999/"):
        communicator = await connect(path, cookie)
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": 4403}, path
        await communicator.disconnect()
    anonymous = await connect(f"/ws/tenants/{two.pk}/", None)
    assert (await anonymous.receive_output(timeout=5))["code"] == 4403
    own = await connect(f"/ws/tenants/{two.pk}/", cookie)
    frame = await resync(own, since=0)
    assert 'id="tenant-claims"' in frame and 'id="live-cursor"' in frame
    await own.disconnect()


async def test_a_member_removed_from_the_tenant_is_cut_off_at_the_next_resync(client, users, console_site, settings):
    settings.CONSOLE_LIVE_TAIL_S = settings.CONSOLE_LIVE_RESYNC_S = 0.2
    cookie = await sync_to_async(session_cookie)(client, users["bob"])
    two = console_site["two"]
    communicator = await connect(f"/ws/tenants/{two.pk}/", cookie)
    await resync(communicator, since=await latest_event())
    await sync_to_async(lambda: users["bob"].tenant_memberships.all().delete())()
    while True:
        output = await communicator.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            assert output["code"] == 4403
            break


async def test_the_fleet_board_gets_each_transition_as_a_row_and_new_counts(client, users):
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    host = await first_available()
    communicator = await connect("/ws/fleet/", cookie)
    first = await resync(communicator, since=await latest_event(), ids=[host.pk])
    assert 'id="live-cursor"' in first
    await sync_to_async(host_set_maintenance)(host=host, on=True, actor="test")
    frame = await receive_until(communicator, f'id="host-{host.pk}"[^>]*data-state="maintenance"(.|\n)*count-maintenance|'
                                               f'count-maintenance">1<(.|\n)*id="host-{host.pk}"')
    assert f'<tr id="host-{host.pk}" data-live-id="{host.pk}" data-state="maintenance"' in frame
    assert 'id="count-maintenance">1<' in frame
    await communicator.disconnect()


async def test_a_page_that_reconnects_gets_what_it_missed_from_the_event_log(client, users):
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    host = await first_available()
    seen = await latest_event()  # the page rendered here, then lost its socket
    await sync_to_async(host_set_maintenance)(host=host, on=True, actor="test")
    communicator = await connect("/ws/fleet/", cookie)
    frame = await resync(communicator, since=seen, ids=[host.pk])
    assert 'data-state="maintenance"' in frame and f'id="host-{host.pk}"' in frame
    assert cursor_of(frame) == await latest_event()
    await communicator.disconnect()


async def test_with_messages_lost_the_event_log_tail_still_brings_every_change(client, users, settings, monkeypatch):
    """The embedded mode: the worker's messages go to its own in-memory layer and never arrive here."""
    settings.CONSOLE_LIVE_TAIL_S = settings.CONSOLE_LIVE_RESYNC_S = 0.2
    from core import live

    monkeypatch.setattr(live, "publish", lambda groups, message: None)
    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    host = await first_available()
    communicator = await connect(f"/ws/hosts/{host.pk}/", cookie)
    await resync(communicator, since=await latest_event())
    await sync_to_async(host_set_maintenance)(host=host, on=True, actor="test")
    frame = await receive_until(communicator, 'data-state="maintenance"(.|\n)*id="host-timeline"')
    assert 'id="host-summary"' in frame and 'id="host-timeline"' in frame
    assert "maintenance on" in frame
    await communicator.disconnect()


async def test_the_tenant_page_follows_its_claims(client, users, console_site):
    from claims.reconcile import pools_reconcile
    from pools.services import pool_set_quantity

    cookie = await sync_to_async(session_cookie)(client, users["alice"])
    one = console_site["one"]
    communicator = await connect(f"/ws/tenants/{one.pk}/", cookie)
    await resync(communicator, since=await latest_event())
    gpu = await sync_to_async(pool)("one", "gpu")
    await sync_to_async(pool_set_quantity)(pool=gpu, quantity=1, actor="user:alice")
    await sync_to_async(pools_reconcile)(pool_ids=[gpu.pk])
    frame = await receive_until(communicator, 'data-phase="Provisioning"(.|\n)*id="tenant-nodes"')
    assert 'data-pool="gpu"' in frame
    assert f'id="pool-{gpu.pk}-claims" data-live="1"' in frame
    assert 'id="tenant-quota">1 node(s) asked for, quota 2' in frame
    tenant = await sync_to_async(Tenant.objects.get)(name="two")
    assert tenant.name not in re.sub(r"<[^>]+>", "", frame).split()
    await communicator.disconnect()


async def test_the_fleet_boards_needs_attention_card_follows_a_host_into_error(client, users):
    from hosts.services import host_transition

    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    host = await first_available()
    communicator = await connect("/ws/fleet/", cookie)
    await resync(communicator, since=await latest_event(), ids=[host.pk])

    def fail():
        host_transition(host=host, to_state="registering", actor="test")
        host_transition(host=host, to_state="error", actor="system:flow", reason="BMC rejected credentials (401)")

    await sync_to_async(fail)()
    frame = await receive_until(communicator, f'id="attention-{host.pk}"(.|\n)*BMC rejected credentials')
    assert 'id="attention"' in frame and "BMC rejected credentials (401)" in frame
    await communicator.disconnect()


async def test_the_fleet_board_drops_a_deleted_host_and_counts_again(client, users):
    from hosts.services import host_delete

    cookie = await sync_to_async(session_cookie)(client, users["admin"])
    host = await first_available()
    available = await sync_to_async(BareMetalHost.objects.filter(state=HostState.AVAILABLE).count)()
    communicator = await connect("/ws/fleet/", cookie)
    await resync(communicator, since=await latest_event(), ids=[host.pk])
    await sync_to_async(host_delete)(host=host, actor="user:root-admin")
    frame = await receive_until(communicator, f'<tr id="host-{host.pk}" hx-swap-oob="delete">(.|\n)*|'
                                               f'count-available">{available - 1}<(.|\n)*id="host-{host.pk}"')
    assert f'<tr id="host-{host.pk}" hx-swap-oob="delete"></tr>' in frame
    assert f'id="count-available">{available - 1}<' in frame
    await communicator.disconnect()
