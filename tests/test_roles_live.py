"""Roles in the live views: who may join which websocket, as a browser does (the session cookie). Refusals
close with 4403."""
import json

import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.contrib.auth.models import Group, User

from pools.models import TenantMembership

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import PASSWORD, connect, first_available, resync, session_cookie  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def people(users, console_site):
    operator = User.objects.create_user("otto", "otto@example.invalid", PASSWORD)
    operator.groups.add(Group.objects.get_or_create(name="operators")[0])
    vic = User.objects.create_user("vic", "vic@example.invalid", PASSWORD)
    TenantMembership.objects.create(tenant=console_site["one"], user=vic, role="viewer")
    return {**users, "operator": operator, "vic": vic}


async def joins(client, user, path: str) -> bool:
    cookie = await sync_to_async(session_cookie)(client, user) if user else None
    return await joins_with(cookie, path)


async def test_every_role_joins_the_live_views_its_pages_have_and_no_other(client, people, console_site):
    one, two = console_site["one"], console_site["two"]
    host = await first_available()
    paths = {"/ws/fleet/": {"admin", "operator", "auditor"},
             f"/ws/hosts/{host.pk}/": {"admin", "operator", "auditor"},
             f"/ws/tenants/{one.pk}/": {"admin", "operator", "auditor", "alice", "vic"},
             f"/ws/tenants/{two.pk}/": {"admin", "operator", "auditor", "bob"},
             "/ws/events/": {"admin", "operator", "auditor", "alice", "vic", "bob"}}
    mismatches = []
    for path, allowed in paths.items():
        for role in ("admin", "operator", "auditor", "alice", "vic", "bob", "anonymous"):
            await sync_to_async(client.logout)()
            joined = await joins(client, people.get(role), path)
            if joined != (role in allowed):
                mismatches.append(f"{role} {path}: {'joined' if joined else 'refused'}")
    assert not mismatches, mismatches


async def test_the_operator_s_fleet_board_offers_the_host_actions_live(client, people):
    cookie = await sync_to_async(session_cookie)(client, people["operator"])
    host = await first_available()
    communicator = await connect(f"/ws/hosts/{host.pk}/", cookie)
    frame = await resync(communicator, since=0)
    assert "Maintenance on…" in frame and "Retire…" not in frame
    await communicator.disconnect()


async def test_a_session_idle_past_the_timeout_joins_no_live_view(client, people, settings):
    import time

    cookie = await sync_to_async(session_cookie)(client, people["admin"])
    assert await joins_with(cookie, "/ws/fleet/")

    def age():
        session = client.session
        session["seen_at"] = int(time.time() - settings.SESSION_IDLE_TIMEOUT_S - 5)
        session.save()

    await sync_to_async(age)()
    assert not await joins_with(cookie, "/ws/fleet/")


async def joins_with(cookie: bytes | None, path: str) -> bool:
    """Joined: the page's re-sync comes back with its cursor; refused: the socket closes with 4403 first."""
    communicator = await connect(path, cookie)
    try:
        await communicator.send_to(text_data=json.dumps({"type": "resync", "since": 0, "ids": []}))
        while True:
            output = await communicator.receive_output(timeout=5)
            if output["type"] == "websocket.close":
                assert output["code"] == 4403, (path, output)
                return False
            if 'id="live-cursor"' in output.get("text", ""):
                return True
    finally:
        await communicator.disconnect()
