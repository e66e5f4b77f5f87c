"""The Event log page, and the live cursor every live page reads first."""
from django.core.paginator import Paginator
from django.urls import reverse

from core.views import console_view, list_filter, page, paging_query

from .choices import EventKind, ObjectType
from .filtersets import EventFilterSet
from .selectors import events_visible, latest_event_id


def live_cursor() -> int:
    """Read before a page's data: the page reflects at least every Event up to this id, and its websocket
    re-syncs from here."""
    return latest_event_id()


@console_view()
def event_log(request):
    """The audit log, newest first, in the user's scope, filtered as /api/v1/events/ is."""
    cursor = live_cursor()
    filters = list_filter(request, EventFilterSet, events_visible(request.user))
    pager = Paginator(filters.qs.order_by("-pk"), 100).get_page(request.GET.get("page"))
    return page(request, "events/event_log.html", {
        "events": pager, "filters": filters, "kinds": EventKind.choices,
        **{name: request.GET.get(name, "") for name in ("object_type", "actor", "kind")},
        "object_types": ObjectType.values,
        "event_log_url": reverse("events"), "paging_query": paging_query(request),
        "cursor": cursor, "ws_url": f"/ws/events/?{request.GET.urlencode()}",
    })
