"""Reads of the Event log: what a user may see of it, and its newest id (a live page's cursor)."""
from django.db.models import Max, QuerySet

from core import scoping

from .models import Event

# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def events_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = Event.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def latest_event_id() -> int:
    """The newest Event id: a live page's cursor (it reflects every Event up to it and re-syncs from it)."""
    return Event.objects.aggregate(m=Max("pk"))["m"] or 0
