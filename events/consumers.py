"""The live views' source of changes: the Event log. Every page's consumer builds on EventLogConsumer."""
from django.db.models import Max

from core.live_views import LiveConsumer

from .models import Event
from .selectors import latest_event_id

MAX_REPLAY = 20000  # events one re-sync reads; past that it renders everything the page shows


class EventLogConsumer(LiveConsumer):
    def latest_cursor(self) -> int:
        return latest_event_id()

    def changes_since(self, since: int, upto: int) -> list[dict] | None:
        events = self.events_in_scope(Event.objects.filter(pk__gt=since, pk__lte=upto))
        rows = list(events.order_by().values("host_id", "claim_id", "tenant_id", "object_type")
                    .annotate(last=Max("pk"))[:MAX_REPLAY])
        return None if len(rows) >= MAX_REPLAY else rows
