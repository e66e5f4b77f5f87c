"""The console's view helpers: roles (asked of core.scoping), the layout's context, filters and paging."""
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import render
from django.views import defaults

from core import scoping
from core.outage import outage_now, unavailable, wants_json


def role_of(request) -> str:
    """The user's role, asked once per request (scoping.role may query the role groups)."""
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


STAFF = scoping.STAFF  # platform admins, operators and auditors: the fleet-wide pages


def page(request, template: str, context: dict | None = None, *, status: int = 200):
    """Render a console page with what the layout needs: the role for the navigation."""
    role = role_of(request)
    ctx = {
        "role": role,
        "is_admin": role == scoping.ADMIN,
        "acts_on_hosts": role in (scoping.ADMIN, scoping.OPERATOR),
        "sees_everything": role in STAFF,
        "may_see_bmc": role in STAFF,
        **(context or {}),
    }
    return render(request, template, ctx, status=status)


def permission_denied(request, exception=None):
    """The 403 page (handler403): the layout with the role's navigation, and what was refused."""
    return page(request, "403.html", {"exception": str(exception or "")}, status=403)


def page_not_found(request, exception=None):
    """The 404 page (handler404): the layout with the role's navigation; under /api/ the API's own answer, JSON
    as its schema documents (a path that no route matches, e.g. an id that is not a number)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page(request, "404.html", status=404)


def server_error(request):
    """The 500 answer (handler500): 503 with Retry-After while the database or Redis is away (core/outage.py);
    else Django's own plain page, which needs neither."""
    if outage_now():
        return unavailable(request, json=wants_json(request))
    return defaults.server_error(request)


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


def sort_headers(query, columns) -> list[dict]:
    """A sortable list's column headers (templates/sort_headers.html), the fleet board's convention on every list:
    `columns` holds each column's parts as (label, the name ?sort= knows it by, or "" for none). A part that sorts
    links to the list sorted by it, the other way round when it sorts by it now, keeping the filters and the page
    size; the page starts again at 1."""
    current = query.get("sort", "")
    headers = []
    for parts in columns:
        links = []
        for label, key in parts:
            link = {"label": label, "url": "", "arrow": ""}
            if key:
                params = query.copy()
                params.pop("page", None)
                params["sort"] = f"-{key}" if current == key else key
                link["url"] = "?" + params.urlencode()
                link["arrow"] = "▲" if current == key else "▼" if current == f"-{key}" else ""
            links.append(link)
        headers.append({"links": links})
    return headers
