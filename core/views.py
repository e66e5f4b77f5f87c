"""The console's view helpers: roles (asked of core.scoping), the layout's context, filters and paging."""
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import JsonResponse
from django.shortcuts import render

from core import scoping


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


def permission_denied(request, exception=None):
    """The 403 page (handler403): the layout with the role's navigation, and what was refused."""
    return page(request, "403.html", {"exception": str(exception or "")}, status=403)


def page_not_found(request, exception=None):
    """The 404 page (handler404): the layout with the role's navigation; under /api/ the API's own answer, JSON
    as its schema documents (a path that no route matches, e.g. an id that is not a number)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page(request, "404.html", status=404)


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
