"""Reads of the Event log: what a user may see of it, and its newest id (a live page's cursor)."""
from django.db.models import Max, Q, QuerySet

from core import scoping

from .choices import EventKind
from .models import Event

# A step that went wrong: failed (its flow goes on to its failure state or retries), or a check that turned red.
# Each key test is guarded by has_key, so that a step without the key is false, not NULL, and ~FAILED_STEP holds it.
FAILED_STEP = (Q(message__startswith="failed") | (Q(data__has_key="ok") & Q(data__ok=False))
               | (Q(data__has_key="bmc_ok") & Q(data__bmc_ok=False)))

# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def events_visible(user, qs: QuerySet | None = None) -> QuerySet:
    qs = Event.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(tenant_id__in=ids)


def latest_event_id() -> int:
    """The newest Event id: a live page's cursor (it reflects every Event up to it and re-syncs from it)."""
    return Event.objects.aggregate(m=Max("pk"))["m"] or 0


def security_events_needing_attention(*, since) -> int:
    """Security events since `since` that a person must look at (the fleet board's alarm). One written before
    events said so (no "attention" in its data) counts: unknown is not routine."""
    return (Event.objects.filter(kind=EventKind.SECURITY, created_at__gte=since)
            .filter(Q(data__attention=True) | ~Q(data__has_key="attention")).count())
