"""The audit trail: the Event log's rows that people made (in the console, through the API, in the admin, with
manage.py) and the security events, as rows of one documented, stable schema (docs/audit.md) for an auditor:
who (the actor, how signed in, through which role), from where (the client's address), what (the object and
the change, before → after, secrets redacted as the log keeps them), when. Kept as long as AUDIT_RETENTION_DAYS
says (audit_prune); erase certificates are rows of their own (hosts), never pruned with these."""
import csv
import io
import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from .choices import EventKind
from .models import Event

SCHEMA_VERSION = 1
# The columns, in this order, in every format; a later version only adds columns at the end.
COLUMNS = ("id", "at", "actor", "via", "role", "address", "kind", "object_type", "object", "tenant", "message",
           "before", "after", "schema")


PEOPLE = Q(actor__startswith="user:") | Q(actor__startswith="cli:") | Q(kind=EventKind.SECURITY)


def audit_events() -> QuerySet:
    """People's events (actor user: or cli:) and security events, oldest first."""
    return Event.objects.filter(PEOPLE).select_related("tenant").order_by("created_at", "id")


def parse_moment(text: str) -> datetime:
    """An ISO 8601 date or date and time (2026-12-01, 2026-12-01T08:00:00Z); without a zone, UTC. ValueError in
    words otherwise."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a date or a date and time (ISO 8601: 2026-12-01, "
                         "2026-12-01T08:00:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def audit_between(since: datetime | None = None, until: datetime | None = None) -> QuerySet:
    events = audit_events()
    if since is not None:
        events = events.filter(created_at__gte=since)
    if until is not None:
        events = events.filter(created_at__lt=until)
    return events


def before_after(event: Event) -> tuple[dict, dict]:
    """What changed, as two dicts: a change's fields ({field: [old, new]} in the log), a relation's added and
    removed members, or the before/after an action wrote itself (an API token made or revoked)."""
    data = event.data or {}
    if "before" in data or "after" in data:
        return dict(data.get("before") or {}), dict(data.get("after") or {})
    if event.kind != EventKind.CHANGE:
        return {}, {}
    before, after = {}, {}
    for name, value in data.items():
        if isinstance(value, list) and len(value) == 2:
            before[name], after[name] = value
        elif isinstance(value, dict) and set(value) == {"added", "removed"}:
            before[name], after[name] = {"removed": value["removed"]}, {"added": value["added"]}
    if event.from_state or event.to_state:
        before.setdefault("state", event.from_state)
        after.setdefault("state", event.to_state)
    return before, after


def audit_row(event: Event) -> dict:
    before, after = before_after(event)
    return {
        "id": event.pk,
        "at": event.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "actor": event.actor,
        "via": event.via,
        "role": event.role,
        "address": event.address or "",
        "kind": event.kind,
        "object_type": event.object_type,
        "object": event.object_name,
        "tenant": event.tenant.name if event.tenant_id and event.tenant else "",
        "message": event.message,
        "before": before,
        "after": after,
        "schema": SCHEMA_VERSION,
    }


def audit_rows(events: Iterable[Event]) -> Iterator[dict]:
    for event in events:
        yield audit_row(event)


def audit_text(rows: Iterable[dict], fmt: str) -> Iterator[str]:
    """jsonl: one JSON object a line; csv: a header line, then before and after as JSON text in their cells."""
    if fmt == "jsonl":
        for row in rows:
            yield json.dumps(row, ensure_ascii=False, sort_keys=False, default=str) + "\n"
        return
    if fmt != "csv":
        raise ValueError(f"format {fmt!r}: jsonl or csv")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([json.dumps(row[c], ensure_ascii=False, default=str) if c in ("before", "after") else row[c]
                         for c in COLUMNS])
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
    yield buffer.getvalue()


def audit_prune(now: datetime | None = None) -> int:
    """Delete audit rows older than AUDIT_RETENTION_DAYS (0: none); the count. The console's own events (the
    hosts' and claims' timelines) are not audit rows and stay."""
    days = settings.AUDIT_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=days)
    deleted, _ = Event.objects.filter(PEOPLE, created_at__lt=cutoff).delete()  # bulk: no Event.delete() per row
    return deleted
