"""The pod watchers: one thread per tenant with a dynamic pool, watching its pods through its Kubernetes API,
and the supervisor that starts, stops and restarts them."""
# The pod watchers: one thread per tenant with a dynamic pool, watching its pods through its Kubernetes API, and the
# supervisor that starts, stops and restarts them, records what they see as demand and batches it into decisions.
#
# A tenant's watcher lists its pods once (the list's resourceVersion is where the watch starts), then follows a
# watch from the last resourceVersion it saw: a stream that ends or drops is resumed from there, not listed again.
# A list comes again only when the watch says the version is too old (410 Gone or an ERROR event), after the
# tenant's API was unreachable (an outage may outlast the API server's watch history, and a restored server may
# count versions from elsewhere: one tenant's list is cheap, a lost DELETED event is not), or when the supervisor
# could not record an event. A failure backs off exponentially with jitter (AUTONODES_WATCH_BACKOFF_S doubling up
# to AUTONODES_WATCH_BACKOFF_MAX_S); each tenant's watcher fails alone.
#
# Watchers do only network I/O; the supervisor's thread does every database write (demand.py, TenantWatch), in
# short transactions of its own, so one process holds one database connection however many tenants it watches
# and no transaction ever spans a tenant API call. Batching is Karpenter's: a tenant's batch opens at its first
# new demand and closes AUTONODES_BATCH_IDLE_S after the last, or AUTONODES_BATCH_MAX_S after it opened; closing
# it sends a decision: the batches that close in one step go as one `autonodes.tasks.decide` pass over their tenants
# (the fleet read once for all). A (re)list that finds demand pending sends one as well.
#
# Several processes may run: each tenant's watch is held by one of them under a lease (autonodes/leases.py), renewed
# at every poll; the live processes share the tenants, and a dead one's tenants move to the others once its leases
# lapse (AUTONODES_WATCH_LEASE_S). A process that cannot renew for a whole lease (the database away) stops its
# watchers, since another may have taken them.
from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from claims.tenant_api import PodWatch, TenantAPI, TenantAPIError
from core.tasks import task_send
from pools.choices import PoolKind
from pools.models import Tenant

from . import task_names
from .choices import WatchState
from .demand import (
    Seen,
    demand_forget,
    demand_observe,
    demand_resync,
    demand_uids,
    is_demand,
)
from .leases import (
    held_watch,
    lease_release,
    lease_take,
    leases_renew,
    watcher_alive,
    watcher_gone,
    watcher_name,
)
from .live import demand_changed

log = logging.getLogger(__name__)


def send_decide(tenant_ids: list[int]) -> None:
    task_send(task_names.DECIDE, tenant_ids=tenant_ids)


def backoff_s(failures: int, *, base: float | None = None, cap: float | None = None) -> float:
    """How long to wait after `failures` failures in a row: base · 2^(failures-1), at most cap, the upper half of
    it drawn at random so that tenants failing together (a network cut) do not retry together."""
    base = settings.AUTONODES_WATCH_BACKOFF_S if base is None else base
    cap = settings.AUTONODES_WATCH_BACKOFF_MAX_S if cap is None else cap
    ceiling = min(cap, base * 2 ** max(0, min(failures - 1, 30)))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


def parse_shard(text: str) -> tuple[int, int]:
    """"I/N" → (I, N), 0 ≤ I < N."""
    index, _, count = (text or "").partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"--shard wants I/N (for example 0/2), not {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"--shard {text}: want 0 <= I < N")
    return i, n


# -- what watchers tell the supervisor


@dataclasses.dataclass
class _Listed:
    pods: list[dict]
    resource_version: str
    reconnect: bool  # the first list, or the first after a failure: decisions may have waited for it


@dataclasses.dataclass
class _Event:
    type: str
    pod: dict
    resource_version: str


@dataclasses.dataclass
class _Failed:
    error: str
    failures: int
    delay_s: float


@dataclasses.dataclass
class _Note:
    watcher: TenantWatcher
    what: _Listed | _Event | _Failed


class TenantWatcher(threading.Thread):
    """The pod watch of one tenant (network only; what it sees goes to the supervisor's inbox)."""

    def __init__(self, *, tenant_id: int, tenant_name: str, kubeconfig: str, inbox: queue.Queue) -> None:
        super().__init__(name=f"watch-pods-{tenant_name}", daemon=True)
        self.tenant_id = tenant_id
        self.tenant_name = tenant_name
        self._kubeconfig = kubeconfig
        self.fingerprint = hashlib.sha256(kubeconfig.encode()).hexdigest()  # a changed kubeconfig: a new watcher
        self.inbox = inbox
        self.lists = 0  # full lists made (the first one included)
        self.resource_version = ""
        self._stopping = threading.Event()
        self._relist = threading.Event()
        self._current: PodWatch | None = None

    def __repr__(self) -> str:
        return f"<TenantWatcher {self.tenant_name}>"

    def stop(self) -> None:
        self._stopping.set()
        if (current := self._current) is not None:
            current.stop()

    def relist(self) -> None:
        """List everything again soon (the supervisor lost an event it could not record)."""
        self._relist.set()
        if (current := self._current) is not None:
            current.stop()

    def _put(self, what) -> None:
        while not self._stopping.is_set():
            try:
                self.inbox.put(_Note(self, what), timeout=0.5)  # a full inbox slows the watch down, loses nothing
                return
            except queue.Full:
                continue

    def run(self) -> None:
        failures = 0  # failures in a row: drive the back-off
        gone = 0  # 410s in a row: the first lists again at once, more are backed off
        relist, reconnect = True, True  # reconnect: the list follows a start or a failure
        timeout = settings.TENANT_API_TIMEOUT_S
        while not self._stopping.is_set():
            try:
                api = TenantAPI(self._kubeconfig, timeout=timeout)
                if relist or self._relist.is_set():
                    self._relist.clear()
                    pods, self.resource_version = api.list_pods_for_watch()
                    self.lists += 1
                    self._put(_Listed(pods, self.resource_version, reconnect))
                    relist = reconnect = False
                    failures = 0
                # Each watch asks the server to end it after a while (jittered as client-go does), then resumes.
                watch_s = settings.AUTONODES_WATCH_TIMEOUT_S * random.uniform(1.0, 2.0)
                self._current = api.pod_watch(self.resource_version, int(watch_s))
                if self._stopping.is_set():
                    break
                began = time.monotonic()
                for event in self._current:
                    self.resource_version = self._current.resource_version
                    self._put(_Event(event["type"], event["object"], self.resource_version))
                self.resource_version = self._current.resource_version or self.resource_version
                if self._current.events_seen:
                    gone = 0
                elif time.monotonic() - began < 1:
                    self._stopping.wait(1)  # a server that ends every watch at once is not asked in a tight loop
            except TenantAPIError as exc:
                relist = True
                if exc.status == 410:
                    gone += 1
                    log.info("pod watch of tenant %s: %s; listing again", self.tenant_name, exc)
                    if gone == 1:
                        continue
                    failures += 1
                else:
                    failures += 1
                reconnect = True
                self._fail(str(exc), failures)
            except Exception as exc:  # a bug must not end the watch for good: report, back off, list again
                log.exception("pod watch of tenant %s failed", self.tenant_name)
                relist = reconnect = True
                failures += 1
                self._fail(f"unexpected error in the pod watcher ({type(exc).__name__})", failures)
            finally:
                self._current = None

    def _fail(self, error: str, failures: int) -> None:
        delay = backoff_s(failures)
        log.warning("pod watch of tenant %s: %s; retrying in %.1fs (failure %d in a row)", self.tenant_name, error,
                    delay, failures)
        self._put(_Failed(error, failures, delay))
        self._stopping.wait(delay)


@dataclasses.dataclass
class Batch:
    """A tenant's open batch of new demand (Karpenter's batch window)."""

    opened: float | None = None
    last: float | None = None

    def note(self, now: float) -> None:
        if self.opened is None:
            self.opened = now
        self.last = now

    def due_at(self) -> float | None:
        if self.opened is None:
            return None
        return min(self.last + settings.AUTONODES_BATCH_IDLE_S, self.opened + settings.AUTONODES_BATCH_MAX_S)


class Supervisor:
    """Keeps one TenantWatcher per tenant that needs one, records what they see, closes batches.

    run() in a thread of its own (or the main thread of `manage.py watch-pods`); stop() from anywhere.
    `send(tenant_ids)` enqueues one decision pass for the tenants whose batches closed in the same step (by default
    the Celery task autonodes.tasks.decide: the fleet is read once for all of them)."""

    def __init__(self, *, shard: tuple[int, int] = (0, 1), send: Callable[[list[int]], None] = send_decide,
                 poll_s: float | None = None, name: str | None = None) -> None:
        self.shard = shard
        self.send = send
        self.name = name or watcher_name()  # the holder its leases name
        self.lease_s = settings.AUTONODES_WATCH_LEASE_S
        # Leases are renewed at each poll: at least three times per lease.
        self.poll_s = min(settings.AUTONODES_WATCH_POLL_S if poll_s is None else poll_s, self.lease_s / 3)
        self._renewed = time.monotonic()
        self.inbox: queue.Queue = queue.Queue(maxsize=10_000)
        self.watchers: dict[int, TenantWatcher] = {}
        self.batches: dict[int, Batch] = {}
        self.known: dict[int, set[str]] = {}  # uids with a PendingPod row: other pods' events need no query
        self.decisions_sent = 0
        self._state: dict[int, dict] = {}  # TenantWatch fields not written yet (last_event_at, resource_version)
        self._changed: set[int] = set()  # tenants whose demand or watcher changed in this step: their pages are told
        self._state_flushed = 0.0
        self._next_poll = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- running

    def start(self) -> Supervisor:
        """run() in a background thread (tests, and processes that embed the watchers)."""
        self._thread = threading.Thread(target=self.run, name="watch-pods-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> None:
        log.info("pod watchers %s: shard %d/%d, tenants re-read every %gs, leases of %gs", self.name, *self.shard,
                 self.poll_s, self.lease_s)
        try:
            while not self._stopping.is_set():
                self.step()
        finally:
            try:
                self._shutdown()
            finally:
                connection.close()  # this thread's own connection

    def step(self) -> None:
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + self.poll_s
            try:
                close_old_connections()
                self.reconcile()
            except Exception:  # the database away, a kubeconfig that cannot be decrypted: the watchers keep going
                log.exception("pod watchers: could not read the tenants; trying again in %gs", self.poll_s)
            if self.watchers and time.monotonic() - self._renewed > self.lease_s:
                log.warning("pod watchers: leases not renewed for %gs; another process may hold them now: stopping "
                            "every watch until they are renewed", self.lease_s)
                for tenant_id in list(self.watchers):
                    self._stop_watcher(tenant_id, forget=False, lost=True)
        self._close_due_batches()
        dues = [due for batch in self.batches.values() if (due := batch.due_at()) is not None]
        wait = max(0.0, min([self._next_poll, *dues]) - time.monotonic())
        try:
            note = self.inbox.get(timeout=min(wait, 0.2))
        except queue.Empty:
            note = None
        while note is not None:
            self._record(note)
            try:
                note = self.inbox.get_nowait()
            except queue.Empty:
                note = None
        self._close_due_batches()
        self._flush_state()
        self._tell_pages()

    # -- which tenants are watched

    def wanted(self) -> dict[int, Tenant]:
        index, count = self.shard
        tenants = (Tenant.objects.filter(deleting_since__isnull=True, pools__kind=PoolKind.DYNAMIC)
                   .distinct().only("pk", "name", "kubeconfig"))
        return {t.pk: t for t in tenants if t.pk % count == index and str(t.kubeconfig or "").strip()}

    def reconcile(self) -> None:
        wanted = self.wanted()
        live = watcher_alive(name=self.name, shard="{}/{}".format(*self.shard), lease_s=self.lease_s)
        held = leases_renew(holder=self.name, tenant_ids=self.watchers, lease_s=self.lease_s)
        self._renewed = time.monotonic()
        for tenant_id in set(self.watchers) - held:
            log.warning("pod watch of tenant %s: its lease lapsed and another watcher holds it; stopping here",
                        self.watchers[tenant_id].tenant_name)
            self._stop_watcher(tenant_id, forget=False, lost=True)
        for tenant_id, watcher in list(self.watchers.items()):
            tenant = wanted.get(tenant_id)
            if tenant is None:
                log.info("pod watch of tenant %s: stopped (no dynamic pool, no kubeconfig, or being deleted)",
                         watcher.tenant_name)
                self._stop_watcher(tenant_id, forget=True)
            elif not watcher.is_alive() or watcher.fingerprint != hashlib.sha256(
                    str(tenant.kubeconfig).encode()).hexdigest():
                log.info("pod watch of tenant %s: restarting (%s)", watcher.tenant_name,
                         "its thread ended" if not watcher.is_alive() else "its kubeconfig changed")
                self._stop_watcher(tenant_id, forget=False)
        # This process's share of the tenants, the live processes counted: one past it gives tenants back (a
        # process that joined takes them at its next poll), one under it takes free or lapsed ones.
        share = math.ceil(len(wanted) / live)
        for tenant_id in sorted(self.watchers, reverse=True)[:max(0, len(self.watchers) - share)]:
            log.info("pod watch of tenant %s: given to another watcher (%d live share %d tenants)",
                     self.watchers[tenant_id].tenant_name, live, len(wanted))
            self._stop_watcher(tenant_id, forget=False)
        for tenant_id, tenant in sorted(wanted.items()):
            if len(self.watchers) >= share:
                break
            if tenant_id not in self.watchers and lease_take(holder=self.name, tenant_id=tenant_id,
                                                             lease_s=self.lease_s):
                self._start_watcher(tenant)

    def _start_watcher(self, tenant: Tenant) -> None:
        held_watch(holder=self.name, tenant_id=tenant.pk).update(
            state=WatchState.STARTING, error="", retry_at=None, failures=0, updated_at=timezone.now())
        watcher = TenantWatcher(tenant_id=tenant.pk, tenant_name=tenant.name, kubeconfig=str(tenant.kubeconfig),
                                inbox=self.inbox)
        self.watchers[tenant.pk] = watcher
        self.known[tenant.pk] = demand_uids(tenant_id=tenant.pk)
        watcher.start()
        log.info("pod watch of tenant %s: started", tenant.name)

    def _stop_watcher(self, tenant_id: int, *, forget: bool, lost: bool = False) -> None:
        """Stop the tenant's watcher and give its lease up; `lost`: the lease is another's already (nothing is
        written, the open batch is left to the new holder's first list)."""
        watcher = self.watchers.pop(tenant_id)
        watcher.stop()
        watcher.join(5)
        self._state.pop(tenant_id, None)
        if lost:
            self.batches.pop(tenant_id, None)
            self.known.pop(tenant_id, None)
            self._changed.add(tenant_id)
            return
        if forget:  # nobody watches this tenant's pods now: its demand would only go stale
            self.batches.pop(tenant_id, None)
            self.known.pop(tenant_id, None)
            demand_forget(tenant_id=tenant_id)
        lease_release(holder=self.name, tenant_id=tenant_id)
        self._changed.add(tenant_id)

    def _shutdown(self) -> None:
        for watcher in self.watchers.values():
            watcher.stop()
        # What the open batches hold is decided now, not after a restart.
        self._send([t for t, batch in self.batches.items() if batch.opened is not None])
        for tenant_id in list(self.watchers):
            try:
                self._stop_watcher(tenant_id, forget=False)
            except DatabaseError:
                log.exception("pod watchers: could not record the stop of tenant %s's watcher", tenant_id)
        try:
            watcher_gone(name=self.name)
        except DatabaseError:
            log.exception("pod watchers: could not record this process's stop (its leases lapse by themselves)")
        self._tell_pages()
        log.info("pod watchers: stopped")

    # -- what the watchers saw

    def _record(self, note: _Note) -> None:
        watcher, what = note.watcher, note.what
        if self.watchers.get(watcher.tenant_id) is not watcher:
            return  # from a watcher stopped since
        tenant_id = watcher.tenant_id
        try:
            if isinstance(what, _Event):
                self._observe(tenant_id, what)
            elif isinstance(what, _Listed):
                self._listed(watcher, what)
            else:
                self._failed(tenant_id, what)
        except DatabaseError:
            log.exception("pod watch of tenant %s: could not record what it saw; it will list again",
                          watcher.tenant_name)
            close_old_connections()
            watcher.relist()
        except Exception:  # one odd pod must not stop every tenant's watch: it is logged and skipped
            log.exception("pod watch of tenant %s: could not record what it saw", watcher.tenant_name)

    def _observe(self, tenant_id: int, event: _Event) -> None:
        state = self._state.setdefault(tenant_id, {})
        state.update(last_event_at=timezone.now(), resource_version=event.resource_version)
        uid = (event.pod.get("metadata") or {}).get("uid")
        known = self.known.setdefault(tenant_id, set())
        deleted = event.type == "DELETED"
        if uid in known or (not deleted and is_demand(event.pod)):  # anything else changes no row
            seen = demand_observe(tenant_id=tenant_id, pod=event.pod, deleted=deleted)
            if seen is not Seen.IGNORED:
                self._changed.add(tenant_id)
            if deleted or not is_demand(event.pod):
                known.discard(uid)
            else:
                known.add(uid)
            if seen.is_new_demand:
                self.batches.setdefault(tenant_id, Batch()).note(time.monotonic())

    def _listed(self, watcher: TenantWatcher, listed: _Listed) -> None:
        tenant_id = watcher.tenant_id
        new, pending = demand_resync(tenant_id=tenant_id, pods=listed.pods)
        self.known[tenant_id] = demand_uids(tenant_id=tenant_id)
        self._state.pop(tenant_id, None)
        self._changed.add(tenant_id)
        now = timezone.now()
        held_watch(holder=self.name, tenant_id=tenant_id).update(
            state=WatchState.WATCHING, error="", failures=0, retry_at=None, connected_at=now,
            resource_version=listed.resource_version[:64], updated_at=now)
        log.info("pod watch of tenant %s: watching from resourceVersion %s (%d pods listed, %d pending, %d new)",
                 watcher.tenant_name, listed.resource_version, len(listed.pods), pending, new)
        # New demand, or a (re)connect with demand pending (decisions wait while the tenant API is away): one
        # decision, batched with what arrives next. A list after a 410 alone decides nothing again.
        if new or (pending and listed.reconnect):
            self.batches.setdefault(tenant_id, Batch()).note(time.monotonic())

    def _failed(self, tenant_id: int, failed: _Failed) -> None:
        self._state.pop(tenant_id, None)
        self._changed.add(tenant_id)
        held_watch(holder=self.name, tenant_id=tenant_id).update(
            state=WatchState.BACKING_OFF, error=failed.error[:2000], failures=failed.failures,
            retry_at=timezone.now() + timedelta(seconds=failed.delay_s), updated_at=timezone.now())

    def _flush_state(self, every_s: float = 2.0) -> None:
        """Last event time and resourceVersion, written every few seconds rather than for every event."""
        now = time.monotonic()
        if not self._state or now - self._state_flushed < every_s:
            return
        self._state_flushed = now
        pending, self._state = self._state, {}
        for tenant_id, fields in pending.items():
            try:
                held_watch(holder=self.name, tenant_id=tenant_id).update(
                    last_event_at=fields["last_event_at"], resource_version=fields["resource_version"][:64],
                    updated_at=timezone.now())
            except DatabaseError:
                log.exception("pod watch of tenant %s: could not record its last event", tenant_id)
                close_old_connections()

    def _tell_pages(self) -> None:
        """One live message per tenant and step, however many pods changed in it (autonodes.live)."""
        changed, self._changed = self._changed, set()
        for tenant_id in sorted(changed):
            try:
                demand_changed(tenant_id=tenant_id)
            except Exception:  # a page that misses it re-syncs anyway; the demand is recorded
                log.warning("pod watch of tenant %s: could not tell the live pages", tenant_id, exc_info=True)

    # -- batches

    def _close_due_batches(self) -> None:
        now = time.monotonic()
        self._send([t for t, batch in self.batches.items() if (due := batch.due_at()) is not None and due <= now])

    def _send(self, tenant_ids: list[int]) -> None:
        """One decision pass for the tenants whose batches closed together."""
        if not tenant_ids:
            return
        for tenant_id in tenant_ids:
            self.batches.pop(tenant_id, None)
            watcher = self.watchers.get(tenant_id)
            log.info("pod watch of tenant %s: batch closed; decision requested",
                     watcher.tenant_name if watcher else tenant_id)
        self.decisions_sent += len(tenant_ids)
        try:
            self.send(sorted(tenant_ids))
        except Exception:
            log.exception("pod watch: could not request a decision for tenants %s", sorted(tenant_ids))
