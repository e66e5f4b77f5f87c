"""The services behind OpenTofu's HTTP state backend: each workspace's state, encrypted in TofuState, with its
lock as OpenTofu's LockInfo and its ID, and the basic-auth password the runner hands to OpenTofu.

The answers follow OpenTofu's http backend: a state is read with GET (204 when there is none), written with POST
(`?ID=` the holding lock's ID while locked), locked with LOCK and unlocked with UNLOCK, each carrying the LockInfo
JSON; a lock already taken answers 409 with the holder's LockInfo."""
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.services import event_record
from pools.choices import ProviderKind

from ..models import Machine, TofuState


@dataclass
class Answer:
    status: int
    body: str = ""  # JSON or the state as written
    content_type: str = "application/json"


def _hash(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def _lock_body(state: TofuState) -> str:
    return json.dumps(state.lock_info or {"ID": state.lock_id})


def tofu_credentials(*, name: str, provider=None) -> str:
    """A new password for workspace `name` (made if missing), returned once: only its hash is kept. Each run gets
    its own, so a password outlives neither its run nor the next."""
    password = secrets.token_urlsafe(32)
    state, made = TofuState.objects.get_or_create(name=name, defaults={"provider": provider,
                                                                       "password_hash": _hash(password)})
    if not made:
        TofuState.objects.filter(pk=state.pk).update(password_hash=_hash(password))
    return password


def tofu_authenticate(*, name: str, password: str) -> TofuState | None:
    """The workspace that this name and password open, or None (no such workspace, or another's password)."""
    state = TofuState.objects.filter(name=name).first()
    if state is None or not state.password_hash or not hmac.compare_digest(state.password_hash, _hash(password)):
        return None
    return state


def tofu_get(*, name: str) -> Answer:
    state = TofuState.objects.filter(name=name).first()
    if state is None or not state.tofu_state:
        return Answer(204)
    return Answer(200, str(state.tofu_state))


def tofu_put(*, name: str, body: str, lock_id: str | None) -> Answer:
    """Write the state. While the workspace is locked only the holder's ID may write; an ID given while it is not
    locked (an admin released the lock under a running apply) is refused too, so that no writer overwrites
    another's state. A serial below the kept one of the same lineage is refused."""
    try:
        document = json.loads(body)
        serial = int(document.get("serial", 0))
    except (ValueError, TypeError, AttributeError):
        return Answer(400, json.dumps({"detail": "the state is not OpenTofu's JSON"}))
    with transaction.atomic():
        state = TofuState.objects.select_for_update().get(name=name)
        if (state.lock_id or lock_id) and lock_id != state.lock_id:
            return Answer(409, _lock_body(state) if state.lock_id else json.dumps({"detail": "not locked"}))
        if state.tofu_state:
            kept = json.loads(str(state.tofu_state))
            if kept.get("lineage") == document.get("lineage") and serial < int(kept.get("serial", 0)):
                return Answer(409, json.dumps({"detail": f"serial {serial} is older than the kept {state.serial}"}))
        state.tofu_state, state.serial = body, serial
        state.save(update_fields=["tofu_state", "serial", "updated_at"])
    return Answer(200)


def tofu_delete(*, name: str) -> Answer:
    with transaction.atomic():
        state = TofuState.objects.select_for_update().get(name=name)
        if state.lock_id:
            return Answer(409, _lock_body(state))
        state.tofu_state, state.serial = "", 0
        state.save(update_fields=["tofu_state", "serial", "updated_at"])
    return Answer(200)


def _lock_info(body: str) -> dict | None:
    try:
        info = json.loads(body or "{}")
    except ValueError:
        return None
    return info if isinstance(info, dict) and isinstance(info.get("ID"), str) and info["ID"] else None


def tofu_lock(*, name: str, body: str) -> Answer:
    """Take the lock with the LockInfo in `body`; 409 with the holder's LockInfo when another holds it."""
    info = _lock_info(body)
    if info is None:
        return Answer(400, json.dumps({"detail": "the body must be OpenTofu's LockInfo with its ID"}))
    with transaction.atomic():
        state = TofuState.objects.select_for_update().get(name=name)
        if state.lock_id and state.lock_id != info["ID"]:
            return Answer(409, _lock_body(state))
        state.lock_id, state.lock_info, state.locked_at = info["ID"][:128], info, timezone.now()
        state.save(update_fields=["lock_id", "lock_info", "locked_at", "updated_at"])
    return Answer(200)


def tofu_unlock(*, name: str, body: str) -> Answer:
    """Release the lock whose ID `body` names. `tofu force-unlock` (no LockInfo) is refused: a stuck lock is
    released by an admin (tofu_release_lock), with an Event saying who."""
    info = _lock_info(body)
    with transaction.atomic():
        state = TofuState.objects.select_for_update().get(name=name)
        if not state.lock_id:
            return Answer(200)
        if info is None or info["ID"] != state.lock_id:
            return Answer(409, _lock_body(state))
        state.lock_id, state.lock_info, state.locked_at = "", {}, None
        state.save(update_fields=["lock_id", "lock_info", "locked_at", "updated_at"])
    return Answer(200)


class NotLocked(Exception):
    pass


def tofu_release_lock(*, name: str, actor: str) -> TofuState:
    """An admin releases a stuck lock (its run crashed or was killed holding it). The Event keeps who did and the
    LockInfo removed; a run still holding it finds its next write refused (tofu_put)."""
    with transaction.atomic():
        state = TofuState.objects.select_for_update(of=("self",)).select_related("provider").get(name=name)
        if not state.lock_id:
            raise NotLocked(f"OpenTofu state {name} is not locked")
        removed = {"ID": state.lock_id, **(state.lock_info or {})}
        locked_at = state.locked_at
        state.lock_id, state.lock_info, state.locked_at = "", {}, None
        state.save(update_fields=["lock_id", "lock_info", "locked_at", "updated_at"])
        # NODE_CLAIM.PROJECT.node: a project is a DNS label, so the claim's name is all before the last two dots.
        machine = (Machine.objects.filter(kind=ProviderKind.TERRAFORM, claim__name=name.rsplit(".", 2)[0])
                   .select_related("claim__tenant").first())
        claim = machine.claim if machine else None
        event_record(kind=EventKind.ACTION, object_type=ObjectType.NODEPROVIDER,
                     object_name=state.provider.name if state.provider else name, actor=actor,
                     step="tofu-lock-released", claim=claim, tenant=claim.tenant if claim else None,
                     message=f"OpenTofu state {name}: lock {removed['ID']} released by {actor} "
                             f"(held by {removed.get('Who') or 'unknown'} for {removed.get('Operation') or '?'} "
                             f"since {locked_at.isoformat() if locked_at else '?'})",
                     data={"workspace": name, "lock": removed})
    return state
