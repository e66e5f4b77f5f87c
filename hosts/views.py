"""Host pages: the fleet board, one host, its actions (behind a confirmation) and the repair pool."""
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.http import Http404
from django.shortcuts import redirect
from django.views.decorators.http import require_http_methods

from events.models import Event
from events.views import STAFF, console_view, live_cursor, page
from pools.models import Tenant
from vmetal_console import scoping

from . import services, tables
from .choices import HostState
from .filtersets import HostFilterSet, without_state
from .lifecycle import ConcurrentTransition, IllegalTransition
from .models import BareMetalHost

PAGE_SIZES = (25, 50, 100, 200)


def page_size(request) -> int:
    try:
        size = int(request.GET.get("per_page", settings.CONSOLE_PAGE_SIZE))
    except ValueError:
        size = settings.CONSOLE_PAGE_SIZE
    return size if size in PAGE_SIZES else settings.CONSOLE_PAGE_SIZE


@console_view(*STAFF)
def fleet(request):
    """Hosts by state: counts, filters, a paginated table; live over /ws/fleet/. A constant number of
    queries whatever the fleet's size: one count, one page, one aggregate, the NodeTypes, the tenants."""
    cursor = live_cursor()
    filters = HostFilterSet(request.GET, queryset=BareMetalHost.objects.all())
    counted = HostFilterSet(without_state(request.GET), queryset=BareMetalHost.objects.all())
    node_types = tables.node_types_by_selector()
    pager = Paginator(tables.row_queryset(filters.qs).order_by("name"), page_size(request))
    current = pager.get_page(request.GET.get("page"))
    rows = tables.decorate_rows(list(current.object_list), node_types)
    query = without_state(request.GET)
    return page(request, "hosts/fleet.html", {
        "cursor": cursor, "counts": tables.state_counts(counted.qs), "page_obj": current, "rows": rows,
        "node_types": node_types, "tenants": list(Tenant.objects.values_list("name", flat=True)),
        "states": HostState.choices, "selected_states": request.GET.getlist("state"),
        "f": {k: request.GET.get(k, "") for k in ("q", "node_type", "label", "tenant")},
        "per_page": page_size(request), "page_sizes": PAGE_SIZES,
        "query": query.urlencode() if hasattr(query, "urlencode") else "",
        "ws_url": f"/ws/fleet/?{request.GET.urlencode()}", "nav": "fleet",
        "paging_query": _without_page(request),
    })


def _without_page(request) -> str:
    params = request.GET.copy()
    params.pop("page", None)
    return params.urlencode()


@console_view()
def host_detail(request, name: str):
    cursor = live_cursor()
    host = tables.host_for_page(request.user, name)
    if host is None:
        raise Http404("no such host")
    node_types = tables.node_types_by_selector()
    tables.decorate_rows([host], node_types)
    context = tables.host_summary_context(request.user, host)
    erase_model, health_model = tables.optional_model("EraseCertificate"), tables.optional_model("HealthCheckRun")
    context.update({
        "cursor": cursor, "inventory": tables.inventory_view(host.inventory),
        "events": tables.host_events(request.user, host),
        # Evidence of earlier tenants' use (their names): platform staff only.
        "erase_certificates": _certificates(erase_model, host) if erase_model and context["sees_everything"] else None,
        "health_runs": (list(health_model.objects.filter(host=host).defer("raw_output", "raw_json", "parsed", "gpus")
                             .order_by("-pk")[:20]) if health_model and context["sees_everything"] else None),
        "ws_url": f"/ws/hosts/{host.pk}/", "nav": "fleet",
    })
    return page(request, "hosts/host.html", context)


def _certificates(model, host) -> list:
    from django.urls import NoReverseMatch, reverse

    certificates = list(model.objects.filter(host=host).defer("document").order_by("-pk")[:20])
    for cert in certificates:
        try:
            cert.url = reverse("certificate", args=[cert.pk])
        except NoReverseMatch:
            cert.url = ""
    return certificates


# --- actions ------------------------------------------------------------------------------------------

POWER_CYCLE_RULE = ("Allowed when the host is available, provisioned, in error, in repair or in maintenance; refused "
                    "while a flow drives its power (registering, inspecting, provisioning, deprovisioning, "
                    "retesting) and once it is retired.")
ACTIONS = {
    "maintenance-on": ("Maintenance on", "Take {host} out of service. It will not be allocated until maintenance is "
                                         "turned off."),
    "maintenance-off": ("Maintenance off", "Give {host} back: it registers again (BMC and credentials are checked "
                                           "anew) and is inspected before it joins the pool."),
    "retry": ("Retry", "Try {host} again from the start: register, inspect, clean."),
    "power-cycle": ("Power cycle", "Reset {host} through its BMC (or power it on, if it is off). Whatever runs on it "
                                   "now stops at once. A worker sends the reset; the BMC's answer appears in the "
                                   "timeline. " + POWER_CYCLE_RULE),
    "retest": ("Retest", "Clean and check {host} again: power cycle into the agent, erase, verify, GPU reset, health "
                         "suite. It comes back to repair with the verdict; only a passing retest lets it return to "
                         "service."),
    "return-to-service": ("Return to service", "Put {host} back in the pool of available hosts."),
    "retire": ("Retire", "Take {host} out of the fleet for good: it is never allocated again and no action brings it "
                         "back. The reason is required and goes in the Event log."),
}
REASON_REQUIRED = {"retire"}


@console_view(scoping.ADMIN)
@require_http_methods(["GET", "POST"])
def host_action(request, name: str, action: str):
    """GET: the confirmation; POST: do it through hosts.services, then back to the host page (or the repair
    pool, when it was asked from there). Refusals of the services show as messages; nothing changes then."""
    host = BareMetalHost.objects.defer(*tables.SECRETS).select_related("claim__tenant").filter(name=name).first()
    if host is None or action not in ACTIONS:
        raise Http404("no such host or action")
    label, warning = ACTIONS[action]
    back = "repair" if request.GET.get("next", request.POST.get("next")) == "repair" else ""
    if request.method == "GET":
        return page(request, "hosts/confirm_action.html", {
            "host": host, "action": action, "label": label, "warning": warning.format(host=host.name),
            "danger": action in tables.DANGEROUS_ACTIONS, "reason_required": action in REASON_REQUIRED,
            "next": back, **_confirmation(host, action)})
    actor = f"user:{request.user.get_username()}"
    reason = request.POST.get("reason", "").strip()[:500]
    done = f"{label}: done for {host.name}"
    try:
        if action == "maintenance-on":
            services.host_set_maintenance(host=host, on=True, actor=actor, reason=reason)
        elif action == "maintenance-off":
            services.host_set_maintenance(host=host, on=False, actor=actor, reason=reason)
        elif action == "retry":
            services.host_retry(host=host, actor=actor, reason=reason)
        elif action == "retest":
            services.host_retest(host=host, actor=actor, reason=reason)
            done = f"{label}: {host.name} is being cleaned and checked again"
        elif action == "return-to-service":
            # The reason counts as an override only when the admin ticked it: a note typed on the way is not one.
            override = request.POST.get("override") == "on"
            passed = services.host_last_repair_verdict(host=host).get("retest") == "passed"
            services.host_return_to_service(host=host, actor=actor,
                                            override_reason=reason if (override or passed) else "")
        elif action == "retire":
            services.host_retire(host=host, actor=actor, reason=reason)
        else:
            services.host_power_cycle(host=host, actor=actor, reason=reason)
            done = f"{label}: asked for {host.name}; the BMC's answer will appear in the timeline"
    except (IllegalTransition, ConcurrentTransition) as exc:
        messages.error(request, f"{label}: {exc}")
    else:
        messages.success(request, done)
    return redirect("repair") if back else redirect("host", name=host.name)


def _confirmation(host: BareMetalHost, action: str) -> dict:
    """What the confirmation page says besides the warning: why it is refused now, what else it affects."""
    notes, refusal, override = [], "", False
    claim = getattr(host, "claim", None)
    if action == "power-cycle":
        refusal = services.power_cycle_refusal(host.state)
        if claim is not None and not refusal:
            notes.append(f"It serves claim {claim.name} of tenant {claim.tenant.name}: that node goes down and "
                         "boots again.")
    elif action == "return-to-service" and host.state == HostState.REPAIR:
        verdict = services.host_last_repair_verdict(host=host)
        if verdict.get("retest") == "passed":
            notes.append("It passed its retest: it joins the pool of available hosts.")
        else:
            override = True
            why = verdict.get("message") or "no reason recorded"
            notes.append(f"It has no passing retest since it went to repair ({why}). Returning it anyway is an "
                         "admin override: tick it and say why; both go in the Event log.")
    return {"notes": notes, "refusal": refusal, "override": override}


# --- the repair pool ----------------------------------------------------------------------------------

@console_view(*STAFF)
def repair(request):
    """Hosts set aside because cleaning, the erase check or the health check failed, with the evidence."""
    cursor = live_cursor()
    last_reason = Event.objects.filter(host_id=OuterRef("pk"), to_state=OuterRef("state")).order_by("-pk")
    hosts = (tables.row_queryset(BareMetalHost.objects.filter(state__in=[HostState.REPAIR, HostState.ERROR]))
             .annotate(reason=Subquery(last_reason.values("message")[:1]),
                       reason_actor=Subquery(last_reason.values("actor")[:1]))
             .order_by("state", "-state_changed_at"))
    pager = Paginator(hosts, page_size(request)).get_page(request.GET.get("page"))
    rows = tables.decorate_rows(list(pager.object_list), tables.node_types_by_selector())
    if scoping.is_admin(request.user):
        for h in rows:
            h.actions = tables.host_actions(h)
    return page(request, "hosts/repair.html", {"cursor": cursor, "page_obj": pager, "rows": rows, "nav": "repair",
                                               "paging_query": _without_page(request)})
