"""Writing to the Event log: `events_record` is the one function that writes Event rows, and the one that
tells the live views (the groups each event's links name, on commit)."""
import getpass
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models, transaction
from django.utils import timezone

from core import live, scoping
from core.origin import current_request, request_origin
from core.rows import rows_insert
from core.crypto import EncryptedTextField

from .choices import EventKind, ObjectType
from .models import Event


def cli_actor() -> str:
    """The actor of a change made with manage.py: the login name of whoever ran it."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


def event_record(*, kind: str, object_type: str, object_name: str, actor: str, message: str = "",
                 host=None, claim=None, tenant=None, host_id: int | None = None, claim_id: int | None = None,
                 tenant_id: int | None = None, from_state: str = "", to_state: str = "", step: str = "",
                 duration_s: float | None = None, data: dict | None = None) -> Event:
    """Record one event (links as objects or as ids) and publish it to its live groups on commit."""
    links = {"host": host, "claim": claim, "tenant": tenant}
    ids = {"host_id": host_id, "claim_id": claim_id, "tenant_id": tenant_id}
    event = Event(kind=kind, object_type=object_type, object_name=object_name, actor=actor, message=message,
                  from_state=from_state, to_state=to_state, step=step, duration_s=duration_s, data=data or {},
                  **{k: v for k, v in links.items() if v is not None},
                  **{k: v for k, v in ids.items() if v is not None})
    return events_record([event])[0]


REPEAT_ADDRESSES = 10  # distinct addresses a repeated event keeps (the first ones)


def event_record_repeated(*, key: str, window_s: float, kind: str, object_type: str, object_name: str, actor: str,
                          message: str = "", host=None, data: dict | None = None) -> tuple[Event, bool]:
    """Record an event once per `key` (of the host) and window: a repeat within `window_s` of that row's first
    record is counted into its data ("count", "last_at", "last_message", up to REPEAT_ADDRESSES "addresses")
    instead of a new row, so that a flood is one line with a number. Returns (the row, whether it is new).

    The one exception to the log's append-only rule, and only for those counters; the caller serialises
    concurrent first records (hosts.boot.ramdisk.security_event locks the host row) or accepts a rare second row."""
    now = timezone.now()
    data = dict(data or {})
    with transaction.atomic():
        earlier = (Event.objects.select_for_update()
                   .filter(kind=kind, host=host, data__repeat_key=key, created_at__gte=now - timedelta(seconds=window_s))
                   .order_by("-created_at", "-id").first())
        if earlier is None:
            address = data.get("address")
            data.update(repeat_key=key, count=1)
            data.setdefault("addresses", [address] if address else [])
            return event_record(kind=kind, object_type=object_type, object_name=object_name, actor=actor,
                                message=message, host=host, data=data), True
        counted = dict(earlier.data)
        counted["count"] = int(counted.get("count") or 1) + 1
        counted.update(last_at=now.isoformat(), last_message=message)
        addresses = list(counted.get("addresses") or [])
        if data.get("address") and data["address"] not in addresses and len(addresses) < REPEAT_ADDRESSES:
            counted["addresses"] = [*addresses, data["address"]]
        Event.objects.filter(pk=earlier.pk).update(data=counted)
        earlier.data = counted
        return earlier, False


def events_record(events: Sequence[Event]) -> list[Event]:
    """Write events (one insert) and, once the transaction commits, publish one message per object type to
    the live groups the events' links name (`live_groups`): {"object": type, "ids": [the objects' own ids]},
    with the state change or the step the events share. Kinds and object types must be declared choices."""
    events = list(events)
    if not events:
        return events
    for event in events:  # ValueError: not a declared choice
        EventKind(event.kind)
        ObjectType(event.object_type)
    _stamp_origin(events)
    if len(events) == 1:
        events[0].save()
    else:
        rows_insert(events)
    by_type: dict[str, list[Event]] = {}
    for event in events:
        by_type.setdefault(event.object_type, []).append(event)
    for batch in by_type.values():
        groups, message = live_groups(batch), live_message(batch)
        transaction.on_commit(lambda groups=groups, message=message: live.publish(groups, message))
    return events


def _stamp_origin(events: Sequence[Event]) -> None:
    """The audit columns of a person's events: within a request, the client's address, how its user is signed in
    and through which role (a member: its membership of the event's tenant); from manage.py, "manage.py". The
    console's own work (system:, agent:) carries none, even when a request set it off."""
    request = current_request()
    origin = request_origin(request) if request is not None else None
    for event in events:
        if event.via:
            continue
        if event.actor.startswith("cli:"):
            event.via = "manage.py"
        elif origin and origin["via"] and event.actor == f"user:{origin['user'].get_username()}":
            event.address, event.via = origin["address"], origin["via"]
            event.role = scoping.role(origin["user"])
            if event.role == scoping.MEMBER and event.tenant_id is not None:
                tenant = Event._meta.get_field("tenant").related_model.objects.filter(pk=event.tenant_id).first()
                event.role = f"member of {tenant.name}" if tenant else scoping.MEMBER


# An object's own link: the id its live message carries.
OWN_LINK = {ObjectType.HOST: "host_id", ObjectType.CLAIM: "claim_id", ObjectType.TENANT: "tenant_id"}
# The fleet-wide group of each kind of object (core.live_views.FLEET_GROUPS).
FLEET_GROUP = {ObjectType.HOST: "fleet", ObjectType.CLAIM: "claims"}


def live_groups(events: Sequence[Event]) -> list[str]:
    """The live groups that events of one object type reach: the fleet-wide group of their kind of object
    ("fleet" for hosts, "claims" for claims), and the group of each host, claim and tenant they link."""
    groups = [FLEET_GROUP[events[0].object_type]] if events[0].object_type in FLEET_GROUP else []
    for prefix in ("host", "claim", "tenant"):
        ids = sorted({getattr(e, f"{prefix}_id") for e in events} - {None})
        groups += [f"{prefix}-{i}" for i in ids]
    return groups


def live_message(events: Sequence[Event]) -> dict:
    """What the consumers read (keys_for_message): the object, its ids, and to_state when the state changed
    (the fleet board recounts); from_state and step ride along where the events share them."""
    object_type = events[0].object_type
    own = OWN_LINK.get(object_type)
    ids = dict.fromkeys(getattr(e, own) for e in events) if own else {}
    message = {"object": str(object_type), "ids": [i for i in ids if i is not None]}
    for name in ("from_state", "to_state", "step"):
        values = {getattr(e, name) for e in events}
        if len(values) == 1 and (value := values.pop()):
            message[name] = value
    return message


def seconds_since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max(0.0, (now - moment).total_seconds())


def is_secret(field: models.Field) -> bool:
    """A secret at rest (core.crypto's encrypted field, on any model) or a user's password hash (Django's own
    field): the Event log says only whether one is set."""
    return isinstance(field, EncryptedTextField) or (issubclass(field.model, AbstractBaseUser)
                                                     and field.name == "password")


def _recorded_value(field: models.Field, value):
    """A value as the Event log keeps it: a secret masked, anything else as JSON can hold it."""
    if is_secret(field):
        return "(set)" if value else "(empty)"
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)


def recorded_values(obj, names) -> dict:
    """The fields `names` of a model instance as the Event log keeps them (secrets masked): what an object was
    made with, the "after" of its creation in the audit trail."""
    fields = [obj._meta.get_field(name) for name in names]
    return {f.name: _recorded_value(f, str(getattr(obj, f.attname)) if f.attname.endswith("_id")
                                    and getattr(obj, f.attname) is not None else getattr(obj, f.attname))
            for f in fields}


def object_update(obj, values: dict, *, actor: str, object_type: str, tenant=None, host=None,
                  self_link: str = "") -> tuple[bool, dict]:
    """Set `values` on a model instance, validate it, save it only if something changed, and record
    the change (secrets masked) in the Event log. `self_link` names the Event link the object itself
    fills ("tenant", "host"). Returns (created, {field: (old, new)})."""
    created = obj.pk is None
    changes = {}
    for name, new in values.items():
        field = obj._meta.get_field(name)
        attname = field.attname
        new_raw = getattr(new, "pk", new) if attname.endswith("_id") else new
        old = getattr(obj, attname)
        if created or old != new_raw:
            changes[name] = (_recorded_value(field, old),
                             _recorded_value(field, new_raw if not attname.endswith("_id") else str(new)))
        setattr(obj, name, new)
    obj.full_clean()
    if not (created or changes):
        return False, {}
    if created:
        obj.save()
    else:
        # Only what changed: a full save would write back every other column as it was read, undoing what
        # a worker wrote meanwhile (a host's state, its flow, its drive lease).
        stamps = [f.name for f in obj._meta.concrete_fields if getattr(f, "auto_now", False)]
        obj.save(update_fields=[*changes, *stamps])
    links = {"tenant": tenant, "host": host}
    if self_link:
        links[self_link] = obj
    message = "created" if created else "; ".join(f"{k}: {_brief(o)} → {_brief(n)}" for k, (o, n) in changes.items())
    event_record(kind=EventKind.CHANGE, object_type=object_type, object_name=str(obj), actor=actor, message=message,
                 **links, data={"before": {}, "after": {k: n for k, (o, n) in changes.items()}} if created
                 else {k: list(v) for k, v in changes.items()})
    return created, changes


def object_relations_set(obj, relations: dict, *, actor: str, object_type: str, tenant=None, host=None) -> dict:
    """Set many-to-many relations ({"groups": [...]}) of a saved object and record what was added and
    removed in the Event log. Returns {name: {"added": [...], "removed": [...]}} for those that changed."""
    changes = {}
    for name, values in relations.items():
        manager = getattr(obj, name)
        old, new = set(manager.all()), set(values)
        if old != new:
            manager.set(new)
            changes[name] = {"added": sorted(map(str, new - old)), "removed": sorted(map(str, old - new))}
    if changes:
        message = "; ".join(f"{name}: " + ", ".join([*(f"+{v}" for v in c["added"]), *(f"-{v}" for v in c["removed"])])
                            for name, c in changes.items())
        event_record(kind=EventKind.CHANGE, object_type=object_type, object_name=str(obj), actor=actor,
                     message=message, tenant=tenant, host=host, data=changes)
    return changes


def object_delete(obj, *, actor: str, object_type: str, tenant=None) -> None:
    name = str(obj)
    obj.delete()
    event_record(kind=EventKind.CHANGE, object_type=object_type, object_name=name, actor=actor, message="deleted",
                 tenant=tenant)


def _brief(value) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
