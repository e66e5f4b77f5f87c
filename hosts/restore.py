"""After a restore: how the console knows its database was restored, and the hold that keeps it off the hosts until
their real state was read."""
# The database's epoch (hosts.models.WorldEpoch) has a twin outside it, the file `epoch` in CERTIFICATE_ARCHIVE_DIR.
# `manage.py backup` dumps the database and then turns the epoch (a new one in both), so a dump always carries an epoch
# the world has left behind: a database restored from it differs from the file, whoever restored it and however. The
# first process that notices (a worker at start, any drive, the warm sweep, an operator's power action) holds every
# host (HostState.HELD) before anything else, then takes the world's epoch (the hold protects the hosts from then on),
# and asks for the world reconcile (claims/restore.py), which reads each held host's BMC and the tenants' nodes and
# only then lets each one go. So a forgotten step (a restore without
# `manage.py restore`, a worker started before the reconcile) fails safe: no power action, the hosts held.
from __future__ import annotations

import logging
import time
import uuid

from celery import current_app
from django.db import transaction

from .choices import HostState
from .gate.archive import EPOCH_FILE, archive_dir
from .lifecycle import HOLDABLE, ConcurrentTransition
from .models import BareMetalHost, WorldEpoch
from .services import hosts_transition_batch

log = logging.getLogger(__name__)

ACTOR = "system:restore"
CHECKED_FOR_S = 5  # a process that found the epochs equal looks again after this long (a drive reads a file at most so often)
_checked_at = 0.0

# The task that reconciles held hosts with the world: the claims app registers it (it knows tenants and claims).
RECONCILERS: list[str] = []


def world_reconciler(task_name: str) -> None:
    if task_name not in RECONCILERS:
        RECONCILERS.append(task_name)


def reconcile_request(countdown: float | None = None, **kwargs) -> None:
    """Ask a worker for the world reconcile; nobody registered one: the hosts stay held, which is safe. Sent every
    time it is asked (no dedupe): after the hold the epochs agree again, so nothing else asks, and a request
    swallowed here would leave the hosts held; a few reconciles at once are harmless, it is idempotent."""
    for name in RECONCILERS:
        try:
            current_app.send_task(name, kwargs=kwargs, countdown=countdown)
        except Exception:
            log.warning("could not enqueue the world reconcile; the next worker start or drive will", exc_info=True)


def db_epoch() -> str:
    row = WorldEpoch.objects.order_by("pk").first()
    if row is None:  # a database restored from before the epoch existed, or emptied by hand: surely not the world's
        row = WorldEpoch.objects.create(epoch=f"missing-{uuid.uuid4().hex}")
    return row.epoch


def world_epoch() -> str | None:
    """The epoch outside the database; None when there is no archive, or it holds no epoch yet."""
    directory = archive_dir()
    if directory is None:
        return None
    try:
        return (directory / EPOCH_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _world_epoch_write(epoch: str) -> None:
    directory = archive_dir()
    if directory is None:
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = directory / f".{EPOCH_FILE}.{uuid.uuid4().hex}"
    temporary.write_text(epoch + "\n")
    temporary.replace(directory / EPOCH_FILE)  # whole or not at all


def epoch_turn() -> str:
    """After a backup: a new epoch in the database and outside it. The dump keeps the old one."""
    epoch = uuid.uuid4().hex
    db_epoch()
    WorldEpoch.objects.update(epoch=epoch)
    _world_epoch_write(epoch)
    return epoch


def epoch_settle() -> None:
    """The world reconcile is done (no host held): the database takes the world's epoch (or, with no epoch outside
    yet, the world takes the database's)."""
    world = world_epoch()
    if world is None:
        _world_epoch_write(db_epoch())
    else:
        db_epoch()
        WorldEpoch.objects.exclude(epoch=world).update(epoch=world)


def restored() -> str:
    """Why the database is not the world's ("" when it is, or when no epoch outside it says otherwise)."""
    world = world_epoch()
    if world is None:
        return ""
    mine = db_epoch()
    if mine == world:
        return ""
    return f"the database's epoch {mine[:12]} is not the world's {world[:12]}: it was restored from a backup"


def world_check() -> bool:
    """May this process act on hosts? False after a restore: then every host is held (if it was not) and the world
    reconcile is asked for. Cheap: a process that found the epochs equal does not look again for CHECKED_FOR_S."""
    global _checked_at
    if time.monotonic() - _checked_at < CHECKED_FOR_S:
        return True
    why = restored()
    if not why:
        _checked_at = time.monotonic()
        return True
    if hosts_hold(reason=why):
        log.warning("%s: every host held until the world reconcile read its real state", why)
    # Every host is held now, and a held host is acted on by nobody: the hold, not the epoch, keeps them safe from
    # here, so the database takes the world's epoch (another process does not hold again what the reconcile let go).
    epoch_settle()
    reconcile_request()
    return False


def hosts_hold(*, reason: str, actor: str = ACTOR) -> int:
    """Hold every host that is not held or retired, keeping the state it had (`held_from`); how many were held."""
    held = 0
    for _ in range(5):
        try:
            with transaction.atomic():
                by_state: dict[str, list[BareMetalHost]] = {}
                for host in BareMetalHost.objects.select_for_update().filter(state__in=HOLDABLE).order_by("pk"):
                    by_state.setdefault(host.state, []).append(host)
                for state, hosts in by_state.items():
                    hosts_transition_batch(hosts=hosts, to_state=HostState.HELD, actor=actor,
                                           reason=f"held until its real state is read: {reason}",
                                           data={"restore": {"held_from": state}})
                    BareMetalHost.objects.filter(pk__in=[h.pk for h in hosts]).update(held_from=state,
                                                                                      drive_lease_until=None)
                    held += len(hosts)
            return held
        except ConcurrentTransition:
            held = 0
            continue
    raise ConcurrentTransition("hosts kept moving while they were being held")
