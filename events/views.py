"""Console-wide view helpers (roles, the layout's context, the live cursor) and the Event log page."""
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse

from core import scoping
from events.selectors import events_visible
from pools.selectors import tenants_visible

from .choices import EventKind
from .consumers import latest_event_id
from .filtersets import EventFilterSet


def role_of(request) -> str:
    """The user's role, asked once per request (scoping.role may query the auditors group)."""
    if not hasattr(request, "_console_role"):
        request._console_role = scoping.role(request.user)
    return request._console_role


def console_view(*roles: str):
    """Log in first; then only these roles (none given: any signed-in role but `nobody`)."""

    def decorate(view):
        @wraps(view)
        @login_required
        def wrapped(request, *args, **kwargs):
            role = role_of(request)
            if role == scoping.NOBODY or (roles and role not in roles):
                raise PermissionDenied("this page is not for your role")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


STAFF = (scoping.ADMIN, scoping.AUDITOR)  # platform admins and auditors: the fleet-wide pages


def page(request, template: str, context: dict | None = None, *, status: int = 200):
    """Render a console page with what the layout needs: the role for the navigation."""
    role = role_of(request)
    ctx = {
        "role": role,
        "is_admin": role == scoping.ADMIN,
        "sees_everything": role in STAFF,
        "may_see_bmc": role in STAFF,
        **(context or {}),
    }
    return render(request, template, ctx, status=status)


def is_htmx(request) -> bool:
    return request.headers.get("HX-Request") == "true"


def list_filter(request, filterset_class, queryset):
    """A list page's filters: the FilterSet its API endpoint uses, on the page's query. A value the API
    answers 400 to filters nothing here, and the page says so; the other filters still apply."""
    filterset = filterset_class(request.GET, queryset=queryset, request=request)
    if not filterset.is_valid():
        for field, errors in filterset.errors.items():
            messages.warning(request, f"Filter {field} ignored: {' '.join(errors)}")
    return filterset


def paging_query(request) -> str:
    """The page's query without its page number: what the pager's links add theirs to."""
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


def live_cursor() -> int:
    """Read before a page's data: the page reflects at least every Event up to this id, and its websocket
    re-syncs from here."""
    return latest_event_id()


@login_required
def home(request):
    role = role_of(request)
    if role in STAFF:
        return redirect("fleet")
    if role == scoping.MEMBER:
        names = list(tenants_visible(request.user).values_list("name", flat=True)[:2])
        if len(names) == 1:
            return redirect("tenant", name=names[0])
        return redirect("tenants")
    raise PermissionDenied("your account belongs to no tenant; ask a platform admin")


@console_view()
def event_log(request):
    """The audit log, newest first, in the user's scope, filtered as /api/v1/events/ is."""
    filters = list_filter(request, EventFilterSet, events_visible(request.user))
    pager = Paginator(filters.qs.order_by("-pk"), 100).get_page(request.GET.get("page"))
    return page(request, "events/event_log.html", {
        "events": pager, "filters": filters, "kinds": EventKind.choices,
        **{name: request.GET.get(name, "") for name in ("object_type", "actor", "kind")},
        "object_types": ["host", "claim", "pool", "tenant", "nodetype", "nodeprovider", "nodeenvironment", "osimage"],
        "event_log_url": reverse("events"), "paging_query": paging_query(request),
    })
