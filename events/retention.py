"""The Event log's retention: routine step events older than EVENT_RETENTION_DAYS are pruned, in bounded batches.
State transitions, people's changes, security events, decisions, failed steps and the gate's steps that carry its
evidence (certificates, census, verdicts, health runs) stay; erase certificates and health runs are rows of their own
(hosts) and audit rows have their own AUDIT_RETENTION_DAYS (events.audit)."""
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from .choices import EventKind
from .models import Event
from .selectors import FAILED_STEP

# A step event whose data holds one of these is evidence: the release gate's erase (certificate ids), census,
# verdict or health run, or a failure's evidence. Kept whatever its age.
EVIDENCE_KEYS = ("certificates", "census", "verdict", "health_run", "evidence")
KEPT_STEP = FAILED_STEP | Q(*(Q(data__has_key=key) for key in EVIDENCE_KEYS), _connector=Q.OR)


def prunable_events(now: datetime | None = None):
    """The step events EVENT_RETENTION_DAYS allows pruning now; none while it is 0. Never younger than the newest
    window a decision reads step events over (HOST_FAILURE_WINDOW_S: an image's last good write)."""
    days = settings.EVENT_RETENTION_DAYS
    if days <= 0:
        return Event.objects.none()
    now = now or timezone.now()
    cutoff = min(now - timedelta(days=days), now - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S))
    return Event.objects.filter(kind=EventKind.STEP, created_at__lt=cutoff).exclude(KEPT_STEP)


def events_prune(*, now: datetime | None = None, batch: int | None = None) -> int:
    """Delete the prunable step events, EVENT_PRUNE_BATCH at a time, each batch a short statement of its own (no
    single DELETE that holds a year of rows); the count."""
    batch = batch or settings.EVENT_PRUNE_BATCH
    prunable = prunable_events(now).order_by("pk")
    deleted, after = 0, 0
    while True:
        # From where the last batch ended: the old rows kept for ever are read past once, not at every batch.
        ids = list(prunable.filter(pk__gt=after).values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        count, _ = Event.objects.filter(pk__in=ids).delete()  # bulk: no Event.delete() per row
        deleted, after = deleted + count, ids[-1]
