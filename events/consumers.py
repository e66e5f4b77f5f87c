"""The live views' source of changes: the Event log. Every page's consumer builds on EventLogConsumer."""
import time

from django.db.models import Max
from django.http import QueryDict
from django.template.loader import render_to_string

from core import scoping
from core.live_views import (
    FLEET_GROUPS,
    RESYNC,
    FragmentCache,
    LiveConsumer,
    Need,
    cursor_element,
    scope_key,
    scope_tenants,
)

from .choices import ObjectType
from .filtersets import EventFilterSet
from .links import events_link
from .models import Event
from .selectors import events_visible, latest_event_id
from .views import log_query

MAX_REPLAY = 20000  # events one re-sync reads; past that it renders everything the page shows
MAX_NEW = 100  # new events one frame adds to the Event log page (its page size)
ROWS = FragmentCache()  # Event log rows, keyed by the scope that sees them (core.live_views.scope_key)
ROW_TTL_S = 60.0  # an Event row is read again after this long: the names it links to may have changed
NEWEST = FragmentCache(size=1000)  # per scope and filters: the Event ids a tick adds to the pages (EventLogPageConsumer)


class EventLogConsumer(LiveConsumer):
    def latest_cursor(self) -> int:
        return latest_event_id()

    def changes_since(self, since: int, upto: int) -> list[dict] | None:
        events = self.events_in_scope(Event.objects.filter(pk__gt=since, pk__lte=upto))
        rows = list(events.order_by().values("host_id", "claim_id", "tenant_id", "object_type")
                    .annotate(last=Max("pk"))[:MAX_REPLAY])
        return None if len(rows) >= MAX_REPLAY else rows


class EventLogPageConsumer(EventLogConsumer):
    """The Event log page: events newer than the page's cursor, in the user's scope and matching the page's
    filters, added at the top of its first page. Messages to the user's groups (the fleet's and the claims' for
    those who see everything, their tenants' for members) make its new rows due at the next tick; events linked
    to no host, claim or tenant (catalogue changes) arrive with the periodic re-sync. At a tick the pages of one
    scope and filters share one read of the new Events' ids (NEWEST) and of their rows (ROWS)."""

    top: int | None = None  # the newest Event id the page shows or has passed over
    scope = scope_key([])  # sees nothing until authorized (wanted_groups sets it, again at each re-sync)

    def authorize(self) -> bool:
        return scoping.role(self.user) != scoping.NOBODY

    def wanted_groups(self) -> set[str]:
        ids = scoping.tenant_ids(self.user)
        self.scope = scope_key(ids)
        return set(FLEET_GROUPS) if ids is None else {f"tenant-{t}" for t in ids}

    def keys_for_message(self, message: dict) -> set:
        return {("new",)}

    def events_in_scope(self, events):
        return events_visible(self.user, events)

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("new",)} if rows else set()

    def all_keys(self) -> set:
        return {("new",)}

    def render(self, keys: dict) -> list[str]:
        if ("new",) not in keys or self.query.get("page", "1") != "1":
            return []
        top = self.cursor or 0 if self.top is None else self.top
        scope = self.scope
        data = QueryDict(mutable=True)
        data.update(self.query)
        filters = log_query(data)

        def newest(upto: int) -> list[int]:
            """The newest ids (at most MAX_NEW) in (top, upto] that the scope sees and the filters keep."""
            tenants = scope_tenants(scope)
            events = Event.objects.filter(pk__gt=top, pk__lte=upto)
            events = events if tenants is None else events.filter(tenant_id__in=tenants)
            return list(EventFilterSet(filters, queryset=events).qs.order_by("-pk").values_list("pk", flat=True)
                        [:MAX_NEW])

        if self.frame_cursor is not None:  # a re-sync: up to its cursor
            upto, new = self.frame_cursor, newest(self.frame_cursor)
        else:
            upto, new = self._newest_shared(top, keys[("new",)], filters, newest)
        self.top = max(top, upto)
        if not new:
            return []

        def read(ids) -> dict:
            tenants = scope_tenants(scope)
            events = Event.objects.filter(pk__in=ids)
            events = list(events if tenants is None else events.filter(tenant_id__in=tenants))
            # The page's links, on the live rows too: host links for those who see the fleet (the scope's).
            return {e.pk: render_to_string("events/partials/event_row.html", {"e": e})
                    for e in events_link(events, None, sees_fleet=tenants is None)}

        # An Event does not change: its row, rendered once for a scope, serves every page of that scope that
        # shows it (re-read after a while: the names it links to may change).
        since = Need(since=time.monotonic() - ROW_TTL_S)
        found = ROWS.rows({("event", *scope, pk): since for pk in new}, read, latest_event_id)
        rows = "".join(found[key][1] for key in (("event", *scope, pk) for pk in new) if found.get(key))
        if not rows:
            return []
        parts = ['<tr id="event-log-empty" hx-swap-oob="delete"></tr>',
                 f'<tbody hx-swap-oob="afterbegin:#event-log-rows">{rows}</tbody>']
        if self.frame_cursor is None and upto > (self.cursor or 0):
            # The page shows the newest Events up to `upto` now: a reconnect re-syncs from there, not from the last
            # periodic re-sync (which would add again the rows this frame brought).
            self.cursor = upto
            parts.append(cursor_element(upto))
        return parts

    def _newest_shared(self, top: int, need: Need, filters: QueryDict, newest) -> tuple[int, list[int]]:
        """(upto, the new ids in (top, upto]) from one read per tick for the pages of a scope and filters: a read
        from a lower `top` serves every page above it (the newest MAX_NEW of a longer range, cut at this page's
        top, are the newest of its own)."""
        key = ("newest", *self.scope, filters.urlencode())
        with NEWEST.reader(key):
            cached = NEWEST.get(key, need)
            if cached is None or cached[1][0] > top:
                read_at, upto = time.monotonic(), latest_event_id()
                cached = (upto, (top, newest(upto)))
                NEWEST.put(key, read_at, upto, cached[1])
        upto, (_, ids) = cached
        return upto, [pk for pk in ids if pk > top]


# Rarely changing lists: the object types each follows, and whether members may watch it (their tenants' only).
LIST_TOPICS = {
    "repair": ({ObjectType.HOST}, False),
    "tenants": ({ObjectType.TENANT, ObjectType.POOL, ObjectType.CLAIM, ObjectType.MEMBERSHIP}, True),
    "catalogue": ({ObjectType.NODEPROVIDER, ObjectType.NODETYPE, ObjectType.NODEENVIRONMENT, ObjectType.OSIMAGE,
                   ObjectType.HOST}, False),
}


class ListPageConsumer(EventLogConsumer):
    """A rarely changing list (/repair/, /tenants/, the catalogue): when an object of the kinds it shows changes,
    the page is told its list is stale and re-fetches it through its own view (live.js), so the page's filters
    and the user's scope apply as on a reload. Catalogue changes link no tenant and reach no group: they
    arrive with the periodic re-sync."""

    async def connect(self):
        self.topic = self.scope["url_route"]["kwargs"]["topic"]
        await super().connect()

    def authorize(self) -> bool:
        if self.topic not in LIST_TOPICS:
            return False
        for_members = LIST_TOPICS[self.topic][1]
        return scoping.sees_everything(self.user) or (for_members and scoping.role(self.user) != scoping.NOBODY)

    def wanted_groups(self) -> set[str]:
        ids = scoping.tenant_ids(self.user)
        return set(FLEET_GROUPS) if ids is None else {f"tenant-{t}" for t in ids}

    def keys_for_message(self, message: dict) -> set:
        return {RESYNC} if message.get("object") in LIST_TOPICS[self.topic][0] else set()

    def events_in_scope(self, events):
        return events_visible(self.user, events).filter(object_type__in=LIST_TOPICS[self.topic][0])

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("stale",)} if rows else set()

    def all_keys(self) -> set:
        return {("stale",)}

    def render(self, keys: dict) -> list[str]:
        return [f'<span id="live-stale" data-at="{latest_event_id()}" hidden></span>'] if keys else []
