"""The claims list's and the event log's live rows are rendered once per process for every page of one scope
(core.live_views.FragmentCache), and a page never gets, through that sharing, a row its user may not see. Spoken
to as a browser does (a websocket with the session cookie)."""
import random
import re

import pytest
from channels.db import database_sync_to_async as sync_to_async

from claims.models import NodeClaim
from pools.models import NodeProvider

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import connect, latest_event, receive_until, resync, session_cookie  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@sync_to_async
def claim_of(tenant) -> NodeClaim:
    # An id no other test's claim has: tests running in parallel share Redis, and so the live groups' messages.
    return NodeClaim.objects.create(pk=random.randrange(10**8, 10**9), name=f"shared-{tenant.name}", tenant=tenant,
                                    pool_name="gpu", provider=NodeProvider.objects.get_or_create(name="metal3")[0])


@sync_to_async
def change(claim: NodeClaim, message: str) -> None:
    """The claim's message changes and its Event says so: one live message to its tenant's group and the claims'."""
    from events.services import event_record

    NodeClaim.objects.filter(pk=claim.pk).update(message=message)
    event_record(kind="action", object_type="claim", object_name=claim.name, actor="test", claim_id=claim.pk,
                 tenant_id=claim.tenant_id, message=message)


def row_of(frame: str, claim: NodeClaim) -> str:
    """The claim's row as the page last got it."""
    return re.findall(f'<tr id="claim-{claim.pk}"(?:(?!</tr>)[\\s\\S])*</tr>', frame)[-1]


@pytest.fixture
def rendered(monkeypatch):
    """The claims each claims list render made a row of, in order, whichever page asked."""
    from claims import consumers

    made = []
    render = consumers.presenters.render_claim_rows

    def counting(claims, **kw):
        made.extend(c.pk for c in claims)
        return render(claims, **kw)

    monkeypatch.setattr(consumers.presenters, "render_claim_rows", counting)
    return made


async def test_two_pages_of_one_scope_get_one_render_of_a_changed_claim(client, users, console_site, rendered):
    claim = await claim_of(console_site["one"])
    pages = [await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users[who]))
             for who in ("admin", "auditor")]  # both see every tenant
    since = await latest_event()
    for page in pages:
        await resync(page, since=since, ids=[claim.pk])
    await change(claim, "rendered once")
    frames = [await receive_until(page, f'<tr id="claim-{claim.pk}"[^>]*>((?!</tr>)[\\s\\S])*rendered once')
              for page in pages]
    assert row_of(frames[0], claim) == row_of(frames[1], claim)
    assert rendered.count(claim.pk) == 1
    for page in pages:
        await page.disconnect()


async def test_a_member_gets_the_rows_of_its_own_scope_not_the_admins(client, users, console_site, rendered):
    claim = await claim_of(console_site["one"])
    admin = await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users["admin"]))
    alice = await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users["alice"]))  # of one
    since = await latest_event()
    await resync(admin, since=since, ids=[claim.pk])
    await resync(alice, since=since, ids=[claim.pk])
    await change(claim, "for each scope")
    pattern = f'<tr id="claim-{claim.pk}"[^>]*>((?!</tr>)[\\s\\S])*for each scope'
    admins, alices = row_of(await receive_until(admin, pattern), claim), row_of(await receive_until(alice, pattern), claim)
    # The admin's row names the tenant (every tenant's claims are listed); a member of one tenant has no such column.
    assert "<td>one</td>" in admins and "<td>one</td>" not in alices
    assert rendered.count(claim.pk) == 2  # one render for each scope
    await admin.disconnect()
    await alice.disconnect()


async def test_a_member_never_gets_another_tenants_row_that_an_admins_page_has_cached(
        client, users, console_site, monkeypatch):
    from events import consumers

    theirs = await claim_of(console_site["one"])
    admin = await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users["admin"]))
    since = await latest_event()
    await resync(admin, since=since, ids=[theirs.pk])
    await change(theirs, "tenant one only")
    await receive_until(admin, f'<tr id="claim-{theirs.pk}"[^>]*>((?!</tr>)[\\s\\S])*tenant one only')
    # Tenant two's member declares tenant one's claim among its page's rows, and its re-sync has too much history
    # to replay: it renders every row the page declares. The admin's fragment of that row is in the cache.
    monkeypatch.setattr(consumers, "MAX_REPLAY", 0)  # any history is too long
    bob = await connect("/ws/claims/", await sync_to_async(session_cookie)(client, users["bob"]))
    frame = await resync(bob, since=0, ids=[theirs.pk])
    assert f'id="claim-{theirs.pk}"' not in frame and "tenant one only" not in frame
    await admin.disconnect()
    await bob.disconnect()


async def test_two_event_logs_of_one_scope_get_one_render_of_a_new_event(client, users, console_site, monkeypatch):
    from events import consumers

    made = []
    render = consumers.render_to_string

    def counting(template, context=None, *args, **kw):
        if template == "events/partials/event_row.html":
            made.append(context["e"].message)
        return render(template, context, *args, **kw)

    monkeypatch.setattr(consumers, "render_to_string", counting)
    claim = await claim_of(console_site["one"])
    pages = [await connect("/ws/events/", await sync_to_async(session_cookie)(client, users[who]))
             for who in ("admin", "auditor")]
    since = await latest_event()
    for page in pages:
        await resync(page, since=since)
    await change(claim, "logged once")
    frames = [await receive_until(page, "logged once") for page in pages]
    rows = [re.search(r'<tr data-event="\d+"((?!</tr>)[\s\S])*logged once(.|\n)*?</tr>', f).group(0) for f in frames]
    assert rows[0] == rows[1]
    assert made.count("logged once") == 1
    for page in pages:
        await page.disconnect()


async def test_fleet_boards_share_one_read_of_the_counts_and_send_them_once_a_clock_period_not_every_tick(
        client, users, settings, monkeypatch):
    from hosts import consumers
    from hosts.choices import HostState
    from hosts.models import BareMetalHost
    from hosts.services import host_set_maintenance

    settings.CONSOLE_LIVE_CARDS_S = 1e9  # the cards' next clock multiple never comes in this test
    settings.CONSOLE_LIVE_RESYNC_S = 1e6  # no periodic re-sync: the cards go only when the test says
    counted = []
    render_counts = consumers.presenters.render_counts

    def counting(counts, query):
        counted.append({c["state"]: c["count"] for c in counts})
        return render_counts(counts, query)

    monkeypatch.setattr(consumers.presenters, "render_counts", counting)
    one, two = await sync_to_async(lambda: list(BareMetalHost.objects.filter(state=HostState.AVAILABLE)
                                                .order_by("name")[:2]))()
    pages = [await connect("/ws/fleet/", await sync_to_async(session_cookie)(client, users[who]))
             for who in ("admin", "auditor", "admin")]
    since = await latest_event()
    for page in pages:
        await resync(page, since=since, ids=[one.pk, two.pk])
    counted.clear()
    for host in (one, two):  # the second move comes after the first's frame: a tick of its own
        await sync_to_async(host_set_maintenance)(host=host, on=True, actor="test")
        for page in pages:
            await receive_until(page, f'<tr id="host-{host.pk}"[^>]*data-state="maintenance"')
    # Three pages, two ticks with a move: at most one read of the counts (the first card of each page goes at once,
    # shared), none for the second move's tick (every tick read them again for every page's next frame before).
    assert len(counted) <= 1
    # A page that reconnects gets the counts as they are now.
    await pages[0].disconnect()
    pages[0] = await connect("/ws/fleet/", await sync_to_async(session_cookie)(client, users["admin"]))
    frame = await resync(pages[0], since=since, ids=[one.pk, two.pk])
    maintenance = await sync_to_async(BareMetalHost.objects.filter(state=HostState.MAINTENANCE).count)()
    assert f'id="count-maintenance">{maintenance}<' in frame
    for page in pages:
        await page.disconnect()


async def test_event_logs_of_one_scope_share_one_read_of_the_new_events(client, users, console_site, monkeypatch):
    from events import consumers

    reads = []
    put = consumers.NEWEST.put

    def recording(key, read_at, upto, value):
        reads.append(value[1])  # the ids the read found
        return put(key, read_at, upto, value)

    monkeypatch.setattr(consumers.NEWEST, "put", recording)
    claim = await claim_of(console_site["one"])
    pages = [await connect("/ws/events/", await sync_to_async(session_cookie)(client, users[who]))
             for who in ("admin", "auditor", "admin")]
    since = await latest_event()
    for page in pages:
        await resync(page, since=since)
    await change(claim, "read once")
    for page in pages:
        await receive_until(page, "read once")
    made = await latest_event()  # the change's Event
    assert sum(made in ids for ids in reads) == 1  # one read for the three pages (each page read its own before)
    for page in pages:
        await page.disconnect()
