"""The Event log page, and the live cursor every live page reads first."""
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import QueryDict
from django.urls import reverse

from core import scoping
from core.views import console_view, page, paging_query

from .choices import EventKind, ObjectType
from .filtersets import STEPS, EventFilterSet
from .links import events_link, names_of
from .selectors import events_visible, latest_event_id

FILTERS = ("object_type", "kind", "name", "actor", "tenant", "since", "until", "steps")


def live_cursor() -> int:
    """Read before a page's data: the page reflects at least every Event up to this id, and its websocket
    re-syncs from here."""
    return latest_event_id()


def log_query(query: QueryDict) -> QueryDict:
    """The page's filters. By default it shows what changed and who did it (state and configuration changes,
    actions, decisions, security events) and the steps that failed, not every step's start and end ("Steps: every
    step" shows them). The API's default stays every event. The live rows read the same (EventLogPageConsumer)."""
    query = query.copy()
    if not query.get("steps"):
        query["steps"] = "failed"
    return query


@console_view()
def event_log(request):
    """The audit log, newest first, in the user's scope, filtered as /api/v1/events/ is."""
    cursor = live_cursor()
    query = log_query(request.GET)
    filters = EventFilterSet(query, queryset=events_visible(request.user), request=request)
    if not filters.is_valid():  # a value the API answers 400 to filters nothing here, and the page says so
        for field, errors in filters.errors.items():
            messages.warning(request, f"Filter {field} ignored: {' '.join(errors)}")
    pager = Paginator(filters.qs.order_by("-pk"), 100).get_page(request.GET.get("page"))
    visible = names_of("tenant", scoping.tenant_ids(request.user))  # the tenant filter's choices, the rows' links
    pager.object_list = events_link(pager.object_list, request.user, tenants=visible)
    tenants = sorted(visible.items(), key=lambda item: item[1])
    return page(request, "events/event_log.html", {
        "events": pager, "filters": filters, "kinds": EventKind.choices, "steps_choices": STEPS,
        **{name: query.get(name, "") for name in FILTERS},
        "object_types": ObjectType.values, "tenants": tenants,
        "event_log_url": reverse("events"), "paging_query": paging_query(request),
        "cursor": cursor, "ws_url": f"/ws/events/?{query.urlencode()}",
    })
