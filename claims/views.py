"""Claim pages: the list with phases, one claim's step timeline, and the fleet's timings."""
from django.core.paginator import Paginator
from django.http import Http404

from claims.selectors import claims_visible
from core.views import STAFF, console_view, list_filter, page, paging_query
from events.choices import ObjectType
from events.selectors import events_visible
from events.views import live_cursor
from pools.models import Tenant
from pools.selectors import tenants_visible

from . import charts, presenters
from .choices import ClaimPhase
from .filtersets import NodeClaimFilterSet
from .models import NodeClaim


@console_view()
def claim_list(request):
    """Claims in the user's scope, newest first, filtered as /api/v1/claims/ is (phase, tenant, name...);
    rows update live."""
    cursor = live_cursor()
    filters = list_filter(request, NodeClaimFilterSet, claims_visible(request.user))
    pager = Paginator(presenters.claims_rows_queryset(filters.qs).order_by("-created_at", "-pk"), 50)
    current = pager.get_page(request.GET.get("page"))
    rows = presenters.with_progress(list(current.object_list))
    tenants = list(tenants_visible(request.user, Tenant.objects.all()).values_list("name", flat=True))
    # All-or-nothing groups with a member not released, each shown once as a unit above the claims (live too).
    groups = presenters.live_claim_groups(request.user)
    return page(request, "claims/claim_list.html", {"groups": groups,
        "cursor": cursor, "page_obj": current, "rows": rows, "filters": filters, "phases": ClaimPhase.choices,
        "phase": request.GET.get("phase", ""), "tenant": request.GET.get("tenant", ""),
        "q": request.GET.get("q", ""), "tenants": tenants, "show_tenant": len(tenants) != 1,
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
    return {"claim": claim, "timeline": presenters.claim_timeline(claim), "transitions": transitions,
            "total_s": presenters.claim_total(claim), "may_see_host": claim.host is not None}


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
