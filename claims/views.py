"""Claim pages: the list with phases, one claim's step timeline, and the fleet's timings."""
from django.core.paginator import Paginator
from django.db.models import Value
from django.http import Http404

from claims.selectors import claims_visible
from core.views import STAFF, console_view, list_filter, page, paging_query, sort_headers
from events.choices import ObjectType
from events.selectors import events_visible
from events.views import live_cursor
from pools.models import NodePool, NodeType, Tenant
from pools.selectors import tenants_visible

from .providers import claim_proof, claims_extras
from . import charts, presenters
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
    from events.models import Event

    transitions = list(events_visible(user, Event.objects.filter(claim_id=claim.pk, object_type=ObjectType.CLAIM))
                       .order_by("-pk")[:50])
    extras = claims_extras([claim])
    machine = extras["machines"][claim.pk]
    return {"claim": claim, "timeline": presenters.claim_timeline(claim), "transitions": transitions,
            "total_s": presenters.claim_total(claim), "may_see_host": claim.host is not None, "machine": machine,
            "proof": claim_proof(claim, machine, extras["certificates"].get(claim.name, []))}


@console_view()
def claim_detail(request, name: str):
    cursor = live_cursor()
    claim = claim_for_page(request.user, name)
    return page(request, "claims/claim.html", {"cursor": cursor, **claim_context(request.user, claim),
                                               "ws_url": f"/ws/claims/{claim.pk}/", "nav": "claims"})


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
