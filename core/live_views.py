"""Live views over websockets: the base consumer that every page's consumer builds on.

A page renders with a cursor (the newest Event id it reflects) and opens a websocket through the htmx
ws extension. On open, and again on every reconnect, the page sends
`{"type": "resync", "since": <cursor>, "ids": [<ids of the objects it shows>]}`. The consumer

1. asks core.scoping whether the user may see the topic before it joins any group (and
   checks each group by name again, see `may_join`); a refusal closes the socket with 4403, which the
   ws extension does not retry;
2. joins its groups, to which the services publish `object.changed` on commit (core.live),
   through the process's Hub: one group member per web process hands each message to its pages;
3. answers messages by re-rendering the affected partials from the database (the current state, never
   the message's content), gathering what arrives within CONSOLE_LIVE_FLUSH_S into one frame of
   elements that htmx swaps by id (FragmentCache: pages told of the same change share one read);
4. re-syncs from the Event log: when the page (re)connects (every event after the page's cursor), then
   every CONSOLE_LIVE_TAIL_S while the channel layer is in-memory (the embedded mode: messages of the
   worker process never reach the web process, its Event rows do) or every CONSOLE_LIVE_RESYNC_S with
   Redis (a message the layer dropped is caught up). Live messages and the Event log take one path:
   both only mark objects dirty. Only re-sync frames move the page's cursor, so the cursor never
   passes a change the page has not seen, and a missed message loses nothing (the event log's live frames
   move it too: a frame of it shows the newest Events up to the cursor it sends, by design).

The cursor is an Event id. On SQLite ids are handed out in commit order (one writer at a time); on
PostgreSQL a transaction can commit after one with a later id, which a re-sync could skip: there the
Redis message of that commit still arrives, and the next change of the object renders it anyway.

This module knows no app: where the cursor and the changes since it come from (the Event log:
events.consumers.EventLogConsumer), which groups exist and who may join them (each app registers a
`group_rule`), and what is live beyond the log (agent progress: hosts.consumers) are hooks."""
import asyncio
import functools
import json
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import InMemoryChannelLayer
from django.conf import settings
from django.db import close_old_connections

from core import scoping

log = logging.getLogger(__name__)
DENIED = 4403
MAX_VISIBLE = 1000  # ids a page may declare; a fleet page shows at most a few hundred rows
RESYNC = "resync"  # a key a topic returns to have its groups and the Event log checked at once


def cursor_element(cursor: int) -> str:
    return f'<span id="live-cursor" data-cursor="{int(cursor)}" hidden></span>'


def frames(parts: list[str]) -> list[str]:
    """Websocket messages for rendered parts. htmx parses each message as one fragment, and the HTML parser
    rearranges table pieces (<tr>, <td>, <tbody>) next to other elements, so only parts that start with the
    same tag share a message: many rows go in one, a row and a counter do not."""
    messages, last_tag = [], None
    for part in parts:
        match = _FIRST_TAG.match(part)
        tag = match.group(1).lower() if match else ""
        if messages and tag == last_tag:
            messages[-1] += part
        else:
            messages.append(part)
        last_tag = tag
    return messages


_FIRST_TAG = re.compile(r"\s*<([a-zA-Z][a-zA-Z0-9]*)")


_FRAME_POOL = ThreadPoolExecutor(max_workers=int(os.environ.get("CONSOLE_LIVE_THREADS", "4")),
                                 thread_name_prefix="live-frames")


def frame_in_thread(fn):
    """Renders run in a pool of threads, not Channels' one shared thread: a page's frame waits on database
    round trips, and one thread would queue every page's frames behind each other. Plain threads (not
    asgiref's sync_to_async, whose thread_sensitive=False gives each call a context, and so a database
    connection, of its own) keep one connection per thread, closed by the usual CONN_MAX_AGE rule. One flush
    per consumer runs at a time, so a consumer's own state is never touched by two threads at once."""

    async def run(*args):
        return await asyncio.get_running_loop().run_in_executor(_FRAME_POOL, functools.partial(_closing, fn, *args))

    return run


def _closing(fn, *args):
    close_old_connections()
    try:
        return fn(*args)
    finally:
        close_old_connections()


class Need:
    """What a dirty key's fragment must reflect: a read after `since` (time.monotonic() when a message
    announced a change: messages are sent after the commit) and every Event up to `version` (a re-sync)."""

    __slots__ = ("since", "version")

    def __init__(self, since: float = 0.0, version: int = 0):
        self.since, self.version = since, version

    def __or__(self, other: "Need") -> "Need":
        """What both ask for: a read after the later announcement, reflecting the newer Event."""
        return Need(max(self.since, other.since), max(self.version, other.version))


class FragmentCache:
    """Rendered fragments shared by the consumers of one process. Twenty admins watching the fleet board get
    the same row for the same change: the first consumer to flush reads and renders it, the others take it.
    A fragment is reused only when it was read after the change was announced (the message arrives after
    the commit), so a cached fragment is never older than what the consumer was told.

    A key names who may see the fragment as well as what it shows: pages whose users see different rows (an
    admin every tenant's claims, a member their tenants') put their scope in the key (`scope_key`), so a
    fragment read for one scope is never served to another."""

    def __init__(self, size: int = 20000):
        self.size = size
        self.items: dict = {}  # key → (read at, newest Event id then, value: the html, or what the page needs)
        self.wanted: dict = {}  # key → since: changes announced to some consumer of this process, not read yet
        self.lock = threading.Lock()
        self.reading: dict = {}  # a kind (the key less its last part) → the lock its readers take in turn

    def want(self, keys, since: float) -> None:
        with self.lock:
            for key in keys:
                self.wanted[key] = max(self.wanted.get(key, 0.0), since)

    def take_wanted(self, kind) -> list:
        """Keys any consumer will need: the first consumer to read fetches them for all in one query. kind: the
        key's first part, or a tuple of its first parts (a kind and a scope)."""
        kind = kind if isinstance(kind, tuple) else (kind,)
        with self.lock:
            keys = [k for k in self.wanted if k[:len(kind)] == kind]
            for key in keys:
                del self.wanted[key]
        return keys

    def get(self, key, need: Need) -> tuple[int, str] | None:
        with self.lock:
            item = self.items.get(key)
        if item is None or item[0] < need.since or item[1] < need.version:
            return None
        return item[1], item[2]

    def put(self, key, read_at: float, upto: int, html) -> None:
        with self.lock:
            if len(self.items) >= self.size:
                for old in list(self.items)[: self.size // 4]:
                    del self.items[old]
            current = self.items.get(key)
            if current is None or current[0] <= read_at:
                self.items[key] = (read_at, upto, html)

    def reader(self, kind: tuple) -> threading.Lock:
        """The lock a kind's readers take in turn: one reads, the others waiting on it take what it read."""
        with self.lock:
            return self.reading.setdefault(kind, threading.Lock())

    def one(self, key, need: Need, make, upto) -> tuple[int, object]:
        """One fragment (a count, a card): the cached one when current, or `make()` read now and kept for the
        others. upto() gives the newest Event id, read before the fragment. Returns (Event id it reflects, value)."""
        with self.reader(key):  # one consumer reads, the others waiting here take its fragment
            cached = self.get(key, need)
            if cached is not None:
                return cached
            read_at, newest = time.monotonic(), upto()
            value = make()
            self.put(key, read_at, newest, value)
            return newest, value

    def rows(self, wanted: dict, read, upto) -> dict:
        """Row fragments, keyed `(*kind, id)` (kind: a name and, where users see different rows, their scope):
        wanted maps key → Need. Those not current in the cache are read at once with the rows of that kind any
        other consumer of the process was told about (`want`), by read(ids) → {id: value} (the rows that exist,
        in the reader's scope: every consumer of one kind shares it), and kept for the others. upto() gives the
        newest Event id, read before the rows. Returns key → (Event id it reflects, value), None where the row
        is gone."""
        found: dict = {}
        by_kind: dict = {}
        for key, need in wanted.items():
            by_kind.setdefault(key[:-1], {})[key] = need
        for kind, needs in by_kind.items():
            with self.reader(kind):  # one consumer reads, the others waiting here take its rows
                missing = []
                for key, need in needs.items():
                    cached = self.get(key, need)
                    if cached is None:
                        missing.append(key)
                    else:
                        found[key] = cached
                if not missing:
                    continue
                read_at, newest = time.monotonic(), upto()
                ids = {k[-1] for k in missing} | {k[-1] for k in self.take_wanted(kind)}
                values = read(ids)
                for pk, value in values.items():
                    self.put((*kind, pk), read_at, newest, value)
                for key in missing:
                    found[key] = (newest, values[key[-1]]) if key[-1] in values else None
        return found


def scope_key(tenant_ids: list[int] | None) -> tuple:
    """What decides which rows a user sees (scoping.tenant_ids): every tenant's (admins, operators, auditors) or
    those of their tenants. Pages of users with the same scope share fragments; a fragment's key carries it,
    and its rows are read for the scope (`scope_tenants`), not for whichever user read them first."""
    return ("all",) if tenant_ids is None else ("tenants", *sorted(tenant_ids))


def scope_tenants(scope: tuple) -> list[int] | None:
    """The tenants a scope key sees; None: all of them."""
    return None if scope[0] == "all" else list(scope[1:])


class Hub:
    """One member of each group per web process, for all its consumers in that group. A group message crosses
    the channel layer once per process (not once per page: twenty fleet boards would take twenty copies of
    every host change through the layer and the consumers' dispatch) and is handed to each page here.
    Consumers join only after `may_join` allowed them, as they would join the group itself."""

    hubs: dict = {}

    def __init__(self, group: str, layer):
        self.group, self.layer = group, layer
        self.members: set = set()
        self.channel = None
        self.task = None

    @classmethod
    async def join(cls, group: str, layer, consumer) -> None:
        key = (asyncio.get_running_loop(), group)
        hub = cls.hubs.get(key)
        if hub is None:
            hub = cls.hubs[key] = Hub(group, layer)
            hub.members.add(consumer)
            hub.channel = await layer.new_channel()
            await layer.group_add(group, hub.channel)
            hub.task = asyncio.create_task(hub.run())
        else:
            hub.members.add(consumer)

    @classmethod
    async def leave(cls, group: str, consumer) -> None:
        key = (asyncio.get_running_loop(), group)
        hub = cls.hubs.get(key)
        if hub is None:
            return
        hub.members.discard(consumer)
        if not hub.members:
            del cls.hubs[key]
            if hub.task is not None:
                hub.task.cancel()
            if hub.channel is not None:
                await hub.layer.group_discard(group, hub.channel)

    async def run(self) -> None:
        while True:
            message = await self.layer.receive(self.channel)
            if message.get("type") != "object.changed":
                continue
            for consumer in list(self.members):
                try:
                    consumer.note(message)
                except Exception:
                    log.exception("live view %s: a message could not be noted", type(consumer).__name__)


# Who may join a group "<kind>-<id>": kind → rule(user, id). The apps register theirs (group_rule) in their
# AppConfig.ready; a kind nobody registered is joined by nobody.
GROUP_RULES: dict = {}
FLEET_GROUPS = ("fleet", "claims")  # fleet-wide groups: for those who see everything


def group_rule(kind: str, rule) -> None:
    GROUP_RULES[kind] = rule


def _tenant_rule(user, pk: int) -> bool:
    ids = scoping.tenant_ids(user)
    return ids is None or pk in ids


group_rule("tenant", _tenant_rule)


def may_join(user, group: str) -> bool:
    """The one rule for groups: fleet-wide groups for those who see everything; a tenant's, a host's or a
    claim's group only when that object is in the user's scope (the kind's registered rule)."""
    if group in FLEET_GROUPS:
        return scoping.sees_everything(user)
    kind, _, ident = group.partition("-")
    rule = GROUP_RULES.get(kind)
    return rule is not None and ident.isdigit() and rule(user, int(ident))


class LiveConsumer(AsyncWebsocketConsumer):
    """Subclasses say who may watch (`authorize`), which groups to join (`wanted_groups`), what a message
    or an Event makes dirty (`keys_for_message`, `keys_for_events`) and how dirty keys render (`render`).
    The sync methods run in a worker thread with database access."""

    # --- to override -------------------------------------------------------------------------------

    def authorize(self) -> bool:
        raise NotImplementedError

    def wanted_groups(self) -> set[str]:
        raise NotImplementedError

    def keys_for_message(self, message: dict) -> set:
        raise NotImplementedError

    def events_in_scope(self, events):
        """The Event rows this topic cares about (a queryset filter)."""
        return events

    def keys_for_events(self, rows: list[dict]) -> set:
        """rows: dicts of host_id, claim_id, tenant_id, object_type."""
        raise NotImplementedError

    def all_keys(self) -> set:
        """Everything the page shows (a re-sync whose history is too long renders it all)."""
        raise NotImplementedError

    # Keys (by their first part) of summary cards: a read of the whole topic, rendered at most every
    # CONSOLE_LIVE_CARDS_S while changes stream in (see `_due`).
    card_kinds: frozenset = frozenset()
    cards_next = 0.0  # the clock time before which this page's cards wait (`_due`)

    def render(self, keys: dict) -> list[str]:
        """keys: dirty key → Need (a fragment read after `since`, and reflecting Event `version`, is current).
        A subclass that renders from FragmentCache records in self.sent what each key's fragment reflects."""
        raise NotImplementedError

    def changed_cards(self, cards: dict) -> list[str]:
        """Of the cards rendered (kind → html), those the page does not have as they are: a card that did not
        change (the needs-attention card, mostly) is not sent again."""
        changed = [html for kind, html in cards.items() if self.cards_sent.get(kind) != html]
        self.cards_sent.update(cards)
        return changed

    def followed_hosts(self) -> set[int]:
        """Hosts whose agent progress (image write %) the page shows. Progress is not in the Event log:
        with an in-memory layer the re-sync reads it through `progress_of` instead."""
        return set()

    # --- the source of changes (events.consumers.EventLogConsumer provides it) -----------------------

    def latest_cursor(self) -> int:
        """The newest change id: what the page reflects at least, once the frame read after it arrives."""
        raise NotImplementedError

    def changes_since(self, since: int, upto: int) -> list[dict] | None:
        """The changes in (since, upto] in this topic's scope, one row per object: dicts of host_id, claim_id,
        tenant_id, object_type and `last` (the newest change id); None when there are too many to replay."""
        raise NotImplementedError

    def progress_of(self, hosts: set[int]) -> dict:
        """host id → something that changes when its progress does (hosts.consumers provides it)."""
        return {}

    # --- the machinery -----------------------------------------------------------------------------

    async def connect(self):
        self.user = self.scope.get("user")
        self.dirty: dict = {}  # key → Need
        self.sent: dict = {}  # key → the newest Event id the fragment last sent for it reflects
        self.visible: set[int] = set()
        self.cursor: int | None = None
        self.frame_cursor: int | None = None  # the cursor the re-sync frame being rendered moves to
        self.cursor_unsent = False
        self.progress_seen: dict[int, tuple] = {}
        self.resync_due = False
        self.cards_sent: dict = {}  # card kind → the html the page last got
        self.joined: set[str] = set()
        self.flush_task = None
        self.poller = None
        self.query = self._query_params()
        allowed = await database_sync_to_async(self._authorized_groups)()
        await self.accept()
        if allowed is None:
            await self.close(code=DENIED)
            return
        await self._join(allowed)
        self.in_memory = isinstance(self.channel_layer, InMemoryChannelLayer) or self.channel_layer is None
        every = settings.CONSOLE_LIVE_TAIL_S if self.in_memory else settings.CONSOLE_LIVE_RESYNC_S
        self.poller = asyncio.create_task(self._poll(every))

    def _query_params(self) -> dict:
        from urllib.parse import parse_qs

        raw = parse_qs((self.scope.get("query_string") or b"").decode(), keep_blank_values=False)
        return {k: v[-1] for k, v in raw.items()}

    def _authorized_groups(self) -> set[str] | None:
        """The groups to be in, each one checked; None when the user may not watch this topic."""
        if self.user is None or not self.user.is_authenticated or not self.authorize():
            return None
        return {g for g in self.wanted_groups() if may_join(self.user, g)}

    async def _join(self, groups: set[str]) -> None:
        if self.channel_layer is None:
            return
        for group in sorted(groups - self.joined):
            await Hub.join(group, self.channel_layer, self)
        for group in sorted(self.joined - groups):
            await Hub.leave(group, self)
        self.joined = set(groups)

    async def disconnect(self, code):
        for task in (getattr(self, "poller", None), getattr(self, "flush_task", None)):
            if task is not None:
                task.cancel()
        if self.channel_layer is not None:
            for group in getattr(self, "joined", ()):
                await Hub.leave(group, self)
            self.joined = set()

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "{}")
        except ValueError:
            return
        if not isinstance(message, dict) or message.get("type") != "resync":
            return
        since = message.get("since")
        try:
            self.cursor = max(0, int(since))
        except (TypeError, ValueError):
            self.cursor = 0 if self.cursor is None else self.cursor
        ids = message.get("ids")
        if isinstance(ids, list):
            self.visible = {int(i) for i in ids[:MAX_VISIBLE] if str(i).isdigit()}
        self.cursor_unsent = True  # the page asked: answer even when nothing changed
        self.resync_due = True
        self._schedule(0)

    async def object_changed(self, message):
        self.note(message)

    def note(self, message: dict) -> None:
        """A change announced to one of the consumer's groups (through the process's Hub)."""
        keys = self.keys_for_message(message)
        if RESYNC in keys:  # the topic's groups may follow (a claim got another host): re-check them now
            keys.discard(RESYNC)
            self.resync_due = True
        if keys or self.resync_due:
            now = time.monotonic()
            for key in keys:
                need = self.dirty.setdefault(key, Need())
                need.since = now
            self._schedule(settings.CONSOLE_LIVE_FLUSH_S)

    async def _poll(self, every: float):
        while True:
            await asyncio.sleep(every)
            if self.cursor is not None:
                self.resync_due = True
                self._schedule(0)

    def _schedule(self, delay: float) -> None:
        if self.flush_task is None or self.flush_task.done():
            self.flush_task = asyncio.create_task(self._flush(delay))

    async def _flush(self, delay: float):
        cutoff = None
        if delay:
            # On the process's common clock: every consumer told of the same changes wakes in the same tick, so
            # the first to read renders for all (FragmentCache) instead of each reading in turn.
            now = time.monotonic()
            tick = now - now % delay + delay
            await asyncio.sleep(tick - now)
            cutoff = min(tick, time.monotonic())
        keys, self.dirty = self._due(cutoff)
        resync, self.resync_due = self.resync_due, False
        if not keys and not resync:  # only cards, waiting for their clock: nothing to read yet
            self.flush_task = asyncio.create_task(self._flush(settings.CONSOLE_LIVE_FLUSH_S))
            return
        try:
            parts, groups = await frame_in_thread(self._frame)(keys, resync)
        except Exception:
            log.exception("live view %s: rendering failed", type(self).__name__)
            return
        if groups is None:
            await self._join(set())
            await self.close(code=DENIED)
            return
        if groups != self.joined:
            await self._join(groups)
        for message in frames(parts):
            await self.send(text_data=message)
        if self.resync_due or self.dirty:  # what came meanwhile goes at the next tick
            self.flush_task = asyncio.create_task(self._flush(0 if self.resync_due else settings.CONSOLE_LIVE_FLUSH_S))

    def _due(self, cutoff: float | None) -> tuple[dict, dict]:
        """The dirty keys this tick renders, and those it leaves for the next. Only changes announced before the
        tick go now: the consumers of the process wake at the same tick but start in turn, and a change noted
        after the tick by one of them would make its fragment newer than the one the first consumer read at
        the tick, so that consumer would read and render the rows again for itself (at 200 changes a second,
        most of them did: one read per page instead of one per process). The later change waits one tick.

        Cards (`card_kinds`) go at most every CONSOLE_LIVE_CARDS_S, at the first tick past a multiple of it: the
        pages of a process cross it together and share one read of each card, where every tick cost a read and
        a render of each (a card shows the whole fleet, which changes at every tick under load). A card goes at the
        next tick when its page sent none since the last multiple (a change on a quiet fleet). A flush without a
        tick (a re-sync) takes every other key."""
        clock = time.monotonic() if cutoff is None else cutoff
        cards_due = clock >= self.cards_next
        now, later = {}, {}
        for key, need in self.dirty.items():
            waits = key[0] in self.card_kinds and not cards_due
            (now if (cutoff is None or need.since <= cutoff) and not waits else later)[key] = need
        if any(key[0] in self.card_kinds for key in now):
            self._cards_go(clock)
        return now, later

    def _cards_go(self, clock: float) -> None:
        """The page's cards go now: the next wait for the clock's next multiple."""
        every = settings.CONSOLE_LIVE_CARDS_S
        self.cards_next = clock - clock % every + every if every > 0 else 0.0

    def _frame(self, keys: dict, resync: bool) -> tuple[list[str], set[str] | None]:
        new_cursor = None
        if resync:
            groups = self._authorized_groups()  # the user's scope may have changed since they connected
            if groups is None:
                return [], None
            new_cursor = self.latest_cursor()  # read first: what renders below includes at least this much
            self.frame_cursor = new_cursor  # a render that reads changes up to a cursor may take this one
            found = self._keys_since(self.cursor or 0, new_cursor) if new_cursor > (self.cursor or 0) else {}
            now = time.monotonic()
            cards_wait = now < self.cards_next
            for key, version in found.items():
                if key not in keys and self.sent.get(key, 0) >= version:
                    continue  # the page has it already (a live message brought it)
                if key[0] in self.card_kinds and key not in keys:
                    if cards_wait:
                        # The card waits for its clock, as a live change's does: read after now, it reflects this
                        # cursor (twenty pages' periodic re-syncs read every card again each, at their own times).
                        need = self.dirty.setdefault(key, Need())
                        need.since = max(need.since, now)
                        continue
                    self._cards_go(now)
                keys.setdefault(key, Need()).version = version
            if self.in_memory:
                for key in self._progress_keys():
                    keys.setdefault(key, Need()).since = time.monotonic()
        else:
            groups, self.frame_cursor = self.joined, None
        parts = self.render(keys) if keys else []
        if resync:
            for key in keys:
                self.sent[key] = max(self.sent.get(key, 0), new_cursor)
            moved = new_cursor != self.cursor or self.cursor_unsent
            self.cursor, self.cursor_unsent = new_cursor, False
            if moved or parts:
                parts.append(cursor_element(new_cursor))  # last: the cursor moves once the rest has arrived
        return parts, groups

    def _progress_keys(self) -> set:
        hosts = self.followed_hosts()
        if not hosts:
            return set()
        now = self.progress_of(hosts)
        changed = [h for h in hosts if now.get(h) != self.progress_seen.get(h)]
        self.progress_seen = now
        if not changed:
            return set()
        keys = self.keys_for_message({"object": "host", "ids": changed, "progress": True})
        keys.discard(RESYNC)
        return keys

    def _keys_since(self, since: int, upto: int) -> dict:
        """Keys the changes since the cursor made dirty, each with the newest change id that changed it."""
        rows = self.changes_since(since, upto)
        if rows is None:
            return dict.fromkeys(self.all_keys(), upto)
        found: dict = {}
        for row in rows:
            for key in self.keys_for_events([row]):
                found[key] = max(found.get(key, 0), row["last"])
        return found
