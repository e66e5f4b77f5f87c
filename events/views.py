"""Console-wide view helpers (roles, the layout's context, the live cursor) and the Event log page."""
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse

from vmetal_console import scoping

from .consumers import latest_event_id


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
        names = list(scoping.tenants(request.user).values_list("name", flat=True)[:2])
        if len(names) == 1:
            return redirect("tenant", name=names[0])
        return redirect("tenants")
    raise PermissionDenied("your account belongs to no tenant; ask a platform admin")


@console_view()
def event_log(request):
    """The audit log, newest first, in the user's scope."""
    events = scoping.events(request.user).order_by("-pk")
    object_type = request.GET.get("object_type", "")
    if object_type:
        events = events.filter(object_type=object_type)
    actor = request.GET.get("actor", "")
    if actor:
        events = events.filter(actor__icontains=actor)
    pager = Paginator(events, 100).get_page(request.GET.get("page"))
    return page(request, "events/event_log.html", {
        "events": pager, "object_type": object_type, "actor": actor,
        "object_types": ["host", "claim", "pool", "tenant", "nodetype", "nodeprovider", "nodeenvironment", "osimage"],
        "event_log_url": reverse("events"),
    })
