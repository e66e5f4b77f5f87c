"""Claim pages: the list with phases, one claim's step timeline and power actions, and the fleet's timings."""
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q, Value
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from access.sessions import fresh_sign_in_refusal
from claims.selectors import claims_visible
from core.actors import actor
from core.transitions import ConcurrentTransition, IllegalTransition
from core.views import STAFF, console_view, list_filter, page, paging_query, sort_headers
from events.choices import EventKind, ObjectType
from events.models import Event
from events.selectors import events_visible
from events.views import live_cursor
from pools.models import NodePool, NodeType, Tenant
from pools.selectors import tenants_visible

from .providers import claim_proof, claims_extras
from . import charts, presenters
from .power import POWER_ACTIONS, claim_power, claim_power_allowed, claim_power_refusal
from .choices import ClaimPhase
from .filtersets import NodeClaimFilterSet
from .models import NodeClaim


def filter_options(user) -> tuple[list[str], list[str], list[str]]:
    """The filters' options, in one query however many claims and pools: the user's tenants, their pools' names,
    the NodeTypes."""
    visible = tenants_visible(user, Tenant.objects.all()).order_by()
    rows = visible.annotate(k=Value("t")).values_list("k", "name").union(
        NodePool.objects.filter(tenant__in=visible.values("pk")).order_by().annotate(k=Value("p"))
        .values_list("k", "name"),
        NodeType.objects.order_by().annotate(k=Value("n")).values_list("k", "name"), all=True)
    found = {"t": set(), "p": set(), "n": set()}
    for kind, name in rows:
        found[kind].add(name)
    return sorted(found["t"]), sorted(found["p"]), sorted(found["n"])


def claim_columns(show_tenant: bool) -> tuple:
    """The claims list's columns: (label, the name ?sort= knows it by, or "" for none)."""
    return ((("Claim", "name"),), *(((("Tenant", "tenant"),),) if show_tenant else ()), (("Pool", "pool"),),
            (("Phase", "phase"),), (("NodeType", "node_type"),), (("Host", "host"), ("node", "")),
            (("Progress", ""),), (("Message", ""),), (("Created", "created"),))


@console_view()
def claim_list(request):
    """Claims in the user's scope, newest first, filtered as /api/v1/claims/ is (phase, tenant, name...);
    rows update live."""
    cursor = live_cursor()
    filters = list_filter(request, NodeClaimFilterSet, claims_visible(request.user))
    rows_qs = presenters.claims_rows_queryset(filters.qs)
    if not filters.qs.query.order_by:  # no ?sort=: newest first
        rows_qs = rows_qs.order_by("-created_at", "-pk")
    pager = Paginator(rows_qs, 50)
    current = pager.get_page(request.GET.get("page"))
    rows = presenters.with_progress(list(current.object_list))
    tenants, pools, node_types = filter_options(request.user)
    # All-or-nothing groups with a member not released, each shown once as a unit above the claims (live too).
    groups = presenters.live_claim_groups(request.user)
    return page(request, "claims/claim_list.html", {"groups": groups,
        "cursor": cursor, "page_obj": current, "rows": rows, "filters": filters, "phases": ClaimPhase.choices,
        "phase": request.GET.get("phase", ""), "tenant": request.GET.get("tenant", ""),
        "q": request.GET.get("q", ""), "tenants": tenants, "show_tenant": len(tenants) != 1,
        "pools": pools, "node_types": node_types, "pool": request.GET.get("pool", ""),
        "node_type": request.GET.get("node_type", ""), "sort": request.GET.get("sort", ""),
        "columns": sort_headers(request.GET, claim_columns(len(tenants) != 1)),
        "paging_query": paging_query(request), "ws_url": f"/ws/claims/?{request.GET.urlencode()}", "nav": "claims"})


def claim_for_page(user, name: str) -> NodeClaim:
    claim = (claims_visible(user).select_related("tenant", "pool", "node_type", "host", "provider", "environment")
             .defer("host__bmc_username", "host__bmc_password").filter(name=name).first())
    if claim is None:
        raise Http404("no such claim")
    return claim


def claim_context(user, claim: NodeClaim) -> dict:
    # Its phase changes and the actions on it, its node's power requests and their answers among them.
    transitions = list(events_visible(user, Event.objects.filter(
        Q(object_type=ObjectType.CLAIM) | Q(kind=EventKind.ACTION), claim_id=claim.pk)).order_by("-pk")[:50])
    extras = claims_extras([claim])
    machine = extras["machines"][claim.pk]
    power_state = machine["power"] if machine else (claim.host.power_state if claim.host else "")
    return {"claim": claim, "timeline": presenters.claim_timeline(claim), "transitions": transitions,
            "total_s": presenters.claim_total(claim), "may_see_host": claim.host is not None, "machine": machine,
            "proof": claim_proof(claim, machine, extras["certificates"].get(claim.name, [])),
            "power_state": power_state or "unknown", "may_power": claim_power_allowed(user, claim.tenant),
            "power_actions": POWER_ACTIONS.items()}


@console_view()
def claim_detail(request, name: str):
    cursor = live_cursor()
    claim = claim_for_page(request.user, name)
    return page(request, "claims/claim.html", {"cursor": cursor, **claim_context(request.user, claim),
                                               "ws_url": f"/ws/claims/{claim.pk}/", "nav": "claims"})


# What each power action does, said on its confirmation.
POWER_WARNINGS = {
    "power-on": "Switch {node} on (nothing happens if it is on).",
    "power-off": "Switch {node} off at once (a forced off, not a shutdown): whatever runs on it stops, and the node "
                 "is NotReady in the tenant's cluster until it is switched on again.",
    "power-cycle": "Reset {node} (or switch it on, if it is off): whatever runs on it stops at once and it boots "
                   "again.",
}


@console_view()
@require_http_methods(["GET", "POST"])
def claim_power_action(request, name: str, action: str):
    """GET: the confirmation; POST: the request through claims.power.claim_power (the same as the API's), then back
    to the claim's page (or the tenant's, `next=tenant`). Who may: claims.power.claim_power_allowed, else 403;
    another tenant's claim is 404. A refusal is a message and nothing is recorded."""
    claim = claim_for_page(request.user, name)
    if action not in POWER_ACTIONS:
        raise Http404("no such action")
    if not claim_power_allowed(request.user, claim.tenant):
        raise PermissionDenied("powering a claim's node is for its tenant's admins and the platform's admins and "
                               "operators")
    label = POWER_ACTIONS[action]
    back = "tenant" if request.GET.get("next", request.POST.get("next")) == "tenant" else ""
    back_url = redirect("tenant", name=claim.tenant.name) if back else redirect("claim", name=claim.name)
    # Switching a node off or resetting it is destructive: it wants a recent sign-in, as on the host's page.
    danger = action != "power-on"
    fresh_refusal = fresh_sign_in_refusal(request) if danger else ""
    if request.method == "GET":
        node = (f"claim {claim.name}'s " + (f"host {claim.host.name}" if claim.host else "machine"))
        return page(request, "claims/confirm_power.html", {
            "claim": claim, "action": action, "label": label, "warning": POWER_WARNINGS[action].format(node=node),
            "refusal": claim_power_refusal(claim), "danger": danger, "next": back, "fresh_refusal": fresh_refusal,
            "fresh_next": request.get_full_path(), "nav": "claims"})
    if fresh_refusal:
        messages.error(request, f"{label}: {fresh_refusal}; nothing was done")
        return back_url
    reason = request.POST.get("reason", "").strip()[:500]
    if "\x00" in reason:  # no browser sends one; PostgreSQL would refuse it in the Event
        return HttpResponseBadRequest("reason: contains a NUL character")
    try:
        done = claim_power(claim=claim, action=action, actor=actor(request),
                           reason=reason or f"asked by {request.user.username} for claim {claim.name}")
    except (IllegalTransition, ConcurrentTransition) as exc:
        messages.error(request, f"{label}: {exc}")
    else:
        messages.success(request, done)
    return back_url


@console_view(*STAFF)
def timing(request):
    """Per step, p50 / p95 across recent provisions and releases; hosts per state over time."""
    try:
        recent = max(10, min(int(request.GET.get("recent", 5000)), 50000))
    except ValueError:
        recent = 5000
    try:
        hours = max(1, min(int(request.GET.get("hours", 24)), 24 * 14))
    except ValueError:
        hours = 24
    timings = charts.step_timings(recent)
    history = charts.state_history(hours=hours)
    return page(request, "claims/timing.html", {
        "timings": timings, "chart": charts.timing_chart(timings), "recent": recent, "hours": hours,
        "tiers": charts.tier_timings(recent),
        "history": charts.history_chart(history), "nav": "timing"})
