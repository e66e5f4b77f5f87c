"""Writing to the Event log."""
import getpass
from datetime import datetime

from .models import Event


def cli_actor() -> str:
    """The actor of a change made with manage.py: the login name of whoever ran it."""
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:
        return "cli:unknown"


def event_record(*, kind: str, object_type: str, object_name: str, actor: str, message: str = "",
                 host=None, claim=None, tenant=None, from_state: str = "", to_state: str = "",
                 step: str = "", duration_s: float | None = None, data: dict | None = None) -> Event:
    return Event.objects.create(
        kind=kind, object_type=object_type, object_name=object_name, actor=actor, message=message,
        host=host, claim=claim, tenant=tenant, from_state=from_state, to_state=to_state, step=step,
        duration_s=duration_s, data=data or {},
    )


def seconds_since(moment: datetime | None, now: datetime) -> float | None:
    return None if moment is None else max(0.0, (now - moment).total_seconds())


SECRET_FIELDS = frozenset({"bmc_username", "bmc_password", "kubeconfig", "password"})  # password: a user's hash


def _shown(field: str, value):
    if field in SECRET_FIELDS:
        return "(set)" if value else "(empty)"
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)


def object_update(obj, values: dict, *, actor: str, object_type: str, tenant=None, host=None,
                  self_link: str = "") -> tuple[bool, dict]:
    """Set `values` on a model instance, validate it, save it only if something changed, and record
    the change (secrets masked) in the Event log. `self_link` names the Event link the object itself
    fills ("tenant", "host"). Returns (created, {field: (old, new)})."""
    created = obj.pk is None
    changes = {}
    for name, new in values.items():
        attname = obj._meta.get_field(name).attname
        new_raw = getattr(new, "pk", new) if attname.endswith("_id") else new
        old = getattr(obj, attname)
        if created or old != new_raw:
            changes[name] = (_shown(name, old), _shown(name, new_raw if not attname.endswith("_id") else str(new)))
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
    Event.objects.create(kind="change", object_type=object_type, object_name=str(obj), actor=actor, message=message,
                         **links, data={} if created else {k: list(v) for k, v in changes.items()})
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
        event_record(kind="change", object_type=object_type, object_name=str(obj), actor=actor, message=message,
                     tenant=tenant, host=host, data=changes)
    return changes


def object_delete(obj, *, actor: str, object_type: str, tenant=None) -> None:
    name = str(obj)
    obj.delete()
    Event.objects.create(kind="change", object_type=object_type, object_name=name, actor=actor, message="deleted",
                         tenant=tenant)


def _brief(value) -> str:
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."
