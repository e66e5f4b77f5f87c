"""One NodeProvider's page for the platform's roles: its kind, its configuration (never a secret), its NodeTypes with
their capacity, the machines it made and, for kind terraform, its OpenTofu workspaces with their locks; an admin
releases a stuck lock here (machines.tofu.backend.tofu_release_lock, as the API does)."""
import re

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from core import scoping
from core.actors import actor
from core.views import console_view, page, role_of
from events.views import live_cursor
from hosts.capacity import node_type_capacity
from machines.kinds.terraform import UNTESTED
from machines.models import TofuState
from machines.selectors import lock_timeout_s, machine_capacity, provider_machines, provider_workspaces
from machines.tofu.backend import NotLocked, tofu_release_lock
from pools.choices import ProviderKind
from pools.models import NodeProvider

# A configuration key whose value is never shown: it may be, or carry, a secret.
SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|private|key$|auth|userdata|kubeconfig|cert",
                        re.IGNORECASE)
URL_USER = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)
SHOWN_CHARS = 120


def config_summary(config, prefix: str = "") -> list[tuple[str, str]]:
    """The provider's configuration as (key, what it is) rows, nested keys dotted: a value under a key that may hold
    a secret is hidden, a template only counted, a URL's user and password removed, long text cut."""
    rows = []
    for key, value in (config or {}).items() if isinstance(config, dict) else []:
        name = f"{prefix}{key}"
        if SECRET_KEY.search(str(key)):
            rows.append((name, "(hidden)"))
        elif key == "inline" and isinstance(value, str):
            rows.append((name, f"an inline template, {len(value.splitlines())} lines (not shown)"))
        elif isinstance(value, dict):
            rows += config_summary(value, f"{name}.") if prefix.count(".") < 3 else [(name, f"{len(value)} keys")]
        elif isinstance(value, list):
            rows.append((name, f"{len(value)} item{'s' if len(value) != 1 else ''}"))
        else:
            text = URL_USER.sub(r"\g<scheme>****@", str(value))
            rows.append((name, text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"))
    return rows


def provider_for(user, name: str) -> NodeProvider:
    """A provider, for the roles that see the providers' list (admins, operators, auditors); anyone else is told
    there is no such page, as for another tenant's objects."""
    provider = NodeProvider.objects.filter(name=name).first() if scoping.sees_everything(user) else None
    if provider is None:
        raise Http404("no such provider")
    return provider


@console_view()
def provider_detail(request, name: str):
    provider = provider_for(request.user, name)
    node_types = list(provider.node_types.order_by("name"))
    if provider.external:  # the kind's capacity: network I/O for some kinds, asked here outside any transaction
        capacity = machine_capacity(node_types)
    else:  # the console's own hosts, counted as /node-types/ counts them
        capacity = {pk: {"hosts": c} for pk, c in node_type_capacity(node_types).items()}
    for node_type in node_types:
        node_type.capacity_shown = capacity.get(node_type.pk, {})
    terraform = provider.kind == ProviderKind.TERRAFORM
    timeout_s, timeout_problem = lock_timeout_s(provider) if terraform else (None, "")
    return page(request, "pools/provider.html", {
        "cursor": live_cursor(), "provider": provider, "config_rows": config_summary(provider.config),
        "node_types": node_types, "machines": provider_machines(provider), "terraform": terraform,
        "workspaces": provider_workspaces(provider), "lock_timeout_s": timeout_s,
        "lock_timeout_problem": timeout_problem, "untested": UNTESTED if terraform else "",
        "may_release_locks": role_of(request) == scoping.ADMIN, "nav": "providers"})


@console_view()
@require_http_methods(["GET", "POST"])
def provider_release_lock(request, name: str, workspace: str):
    """GET: the confirmation, with the lock and who holds it; POST: the lock released (an admin's), recorded as an
    Event (who, the workspace, the lock; never the state). A workspace that is not locked is said so."""
    provider = provider_for(request.user, name)
    state = (TofuState.objects.filter(provider=provider, name=workspace).defer("tofu_state", "password_hash")
             .first())
    if state is None or provider.kind != ProviderKind.TERRAFORM:
        raise Http404("no such workspace")
    if not scoping.is_admin(request.user):
        raise PermissionDenied("releasing an OpenTofu lock is the platform admin's")
    back = redirect("provider", name=provider.name)
    if request.method == "GET":
        info = state.lock_info or {}
        return page(request, "pools/confirm_release_lock.html", {
            "provider": provider, "state": state, "lock_who": info.get("Who", ""),
            "lock_operation": info.get("Operation", ""), "cancel_url": reverse("provider", args=[provider.name]),
            "nav": "providers"})
    try:
        tofu_release_lock(name=state.name, actor=actor(request))
    except NotLocked as exc:
        messages.warning(request, f"{exc}: nothing to release")
    else:
        messages.success(request, f"OpenTofu state {state.name}: lock {state.lock_id} released; a run still "
                                  "holding it will have its next write refused")
    return back
