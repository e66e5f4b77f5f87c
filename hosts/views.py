"""Host pages: the fleet board, one host, its actions (behind a confirmation) and the repair pool."""
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from access.sessions import fresh_sign_in_refusal
from core import scoping
from core.actors import actor
from core.views import STAFF, console_view, list_filter, page, paging_query
from events.selectors import security_events_needing_attention
from events.views import live_cursor
from hosts.bmc.client import is_ipmi
from hosts.selectors import (
    attention_explain,
    health_runs_visible,
    hosts_needing_attention,
    hosts_visible,
    repair_stats,
)
from pools.choices import FailureKind
from pools.models import NodeType, Tenant

from . import presenters, services
from .capacity import fleet_capacity
from .choices import HostState
from .filtersets import HostFilterSet, without_state
from .lifecycle import ConcurrentTransition, IllegalTransition
from .models import BareMetalHost, EraseCertificate, HealthCheckRun
from .preflight import preflight_request

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
    filters = list_filter(request, HostFilterSet, BareMetalHost.objects.all())
    counted = HostFilterSet(without_state(request.GET), queryset=BareMetalHost.objects.all(), request=request)
    node_types = presenters.node_types_by_selector()
    hosts = filters.qs if filters.qs.query.order_by else filters.qs.order_by("name")
    pager = Paginator(presenters.row_queryset(hosts), page_size(request))
    current = pager.get_page(request.GET.get("page"))
    rows = presenters.decorate_rows(list(current.object_list), node_types)
    query = without_state(request.GET)
    return page(request, "hosts/fleet.html", {
        "cursor": cursor, "counts": presenters.state_counts(counted.qs), "page_obj": current, "rows": rows,
        "capacity": fleet_capacity(node_types),
        "filters": filters,
        "node_types": node_types, "tenants": list(Tenant.objects.values_list("name", flat=True)),
        "states": HostState.choices, "selected_states": request.GET.getlist("state"),
        "f": {k: request.GET.get(k, "") for k in ("q", "node_type", "label", "rack", "rail_group", "tenant", "sort")},
        "per_page": page_size(request), "page_sizes": PAGE_SIZES,
        "query": query.urlencode() if hasattr(query, "urlencode") else "",
        "ws_url": f"/ws/fleet/?{request.GET.urlencode()}", "nav": "fleet",
        "paging_query": paging_query(request), "columns": presenters.sort_columns(request.GET),
        "bulk_actions": [(slug, label) for slug, label in presenters.BULK_ACTIONS
                         if scoping.is_admin(request.user) or slug not in presenters.ADMIN_ONLY_ACTIONS],
        "export_query": paging_query(request),
        # Refused agent lookups and boot scripts asked for twice (hosts/boot/ramdisk.py) that a person must look at: someone
        # may be after an agent. Routine ones (a host's own agent lingering after a retest) are in the log only.
        "security_events": security_events_needing_attention(since=timezone.now() - timedelta(hours=24)),
        **presenters.attention_board(acts_on_hosts=scoping.acts_on_hosts(request.user)),
    })


@console_view()
def host_detail(request, name: str):
    cursor = live_cursor()
    host = presenters.host_for_page(request.user, name)
    if host is None:
        raise Http404("no such host")
    node_types = presenters.node_types_by_selector()
    presenters.decorate_rows([host], node_types)
    context = presenters.host_summary_context(request.user, host)
    context.update({
        "cursor": cursor, "events": presenters.host_events(request.user, host),
        **presenters.host_records(request.user, host),  # live too (render_host_live)
        "ws_url": f"/ws/hosts/{host.pk}/", "nav": "fleet",
        "cleaning": presenters.cleaning_shown(host), "bmc_tls": presenters.bmc_tls_shown(host),
        "preflight": presenters.preflight_shown(host), "sku": presenters.sku_shown(host),
        "inspection": presenters.inspection_shown(host),
        "firmware": presenters.firmware_shown(host),
        "may_update_firmware": scoping.is_admin(request.user) and host.state == HostState.AVAILABLE
        and not is_ipmi(host.bmc_address),
    })
    if scoping.may_see_bmc(request.user):  # the BMC's web interface: staff only
        context.update(bmc_web_url=presenters.bmc_web_url(host.bmc_address))
    return page(request, "hosts/host.html", context)


@console_view()
def health_run_detail(request, pk: int):
    """One health-check run as the gate recorded it: the verdict, the tool's reasons in its own words, each GPU's
    tests, the thresholds it was judged against, the command and its raw output. Seen by whoever the API shows
    it to (core.scoping.health_runs); the host's page is linked only for those who may see it."""
    run = health_runs_visible(request.user).filter(pk=pk).first()
    if run is None:
        raise Http404("no such health run")
    host_visible = run.host_id is not None and hosts_visible(request.user).filter(pk=run.host_id).exists()
    gpus = sorted(run.gpus.items(), key=lambda item: (len(item[0]), item[0])) if isinstance(run.gpus, dict) else []
    return page(request, "hosts/health_run.html", {
        "run": run, "gpus": gpus, "host_visible": host_visible,
        "thresholds": sorted(run.thresholds.items()) if isinstance(run.thresholds, dict) else [],
        "nav": "repair" if scoping.sees_everything(request.user) else "tenants"})


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
    "power-on": ("Power on", "Switch {host} on through its BMC (nothing happens if it is on). A worker sends the "
                             "request; the BMC's answer appears in the timeline. " + POWER_CYCLE_RULE),
    "power-off": ("Power off", "Switch {host} off through its BMC, at once (a forced off, not a shutdown). "
                               "Whatever runs on it stops. A worker sends the request; the BMC's answer appears in "
                               "the timeline. " + POWER_CYCLE_RULE),
    "return-to-service": ("Return to service", "Put {host} back in the pool of available hosts."),
    "retire": ("Retire", "Take {host} out of the fleet for good: it is never allocated again and no action brings it "
                         "back. The reason is required and goes in the Event log."),
}
ACTIONS["preflight"] = ("Run preflight", "Check {host}'s BMC network (Redfish or IPMI with its credentials, TLS, "
                                          "the system and its boot MAC) and provisioning network (its DHCP/boot entry, the boot "
                                          "route, the ramdisk) now. Nothing on the host changes; a worker runs it and "
                                          "the result appears on this page. A red preflight keeps the host from "
                                          "being allocated.")
ACTIONS["delete"] = ("Delete", "Delete {host} for good: it leaves the fleet and its row is removed. Its erase "
                               "certificates, health runs and Events are kept. Only a host that serves no claim and "
                               "that no flow drives (available, in maintenance, error, repair or retired) may go.")
ACTIONS["end-hold"] = ("End the hold", "{host} keeps data disks of the pool it was re-imaged for, and only that "
                                       "pool's claims may have it. End the hold: every disk of {host} is erased at "
                                       "the strongest level now, the kept data is gone, and any tenant may have it "
                                       "next. The reason is required and goes in the Event log.")
REASON_REQUIRED = {"retire", "end-hold"}


@console_view(scoping.ADMIN, scoping.OPERATOR)
@require_http_methods(["GET", "POST"])
def host_action(request, name: str, action: str):
    """GET: the confirmation; POST: do it through hosts.services, then back to the host page (or the repair
    pool, when it was asked from there). Refusals of the services show as messages; nothing changes then."""
    host = BareMetalHost.objects.defer(*presenters.SECRETS).select_related("claim__tenant").filter(name=name).first()
    if host is None or action not in ACTIONS:
        raise Http404("no such host or action")
    if action in presenters.ADMIN_ONLY_ACTIONS and not scoping.is_admin(request.user):
        raise PermissionDenied(f"{ACTIONS[action][0]} is the platform admin's")
    label, warning = ACTIONS[action]
    back = "repair" if request.GET.get("next", request.POST.get("next")) == "repair" else ""
    # Powering a host off and retiring it are destructive: they want a recent sign-in.
    fresh_refusal = fresh_sign_in_refusal(request) if action in presenters.DANGEROUS_ACTIONS else ""
    if request.method == "GET":
        return page(request, "hosts/confirm_action.html", {
            "host": host, "action": action, "label": label, "warning": warning.format(host=host.name),
            "danger": action in presenters.DANGEROUS_ACTIONS, "reason_required": action in REASON_REQUIRED,
            "next": back, "fresh_refusal": fresh_refusal, "fresh_next": request.get_full_path(),
            **_confirmation(host, action)})
    if fresh_refusal:
        messages.error(request, f"{label}: {fresh_refusal}")
        return redirect(request.get_full_path())
    who = actor(request)
    reason = request.POST.get("reason", "").strip()[:500]
    if "\x00" in reason:  # no browser sends one; PostgreSQL would refuse it in the Event
        return HttpResponseBadRequest("reason: contains a NUL character")
    try:
        done = action_run(host=host, action=action, actor=who, reason=reason,
                          override=request.POST.get("override") == "on")
    except (IllegalTransition, ConcurrentTransition) as exc:
        messages.error(request, f"{label}: {exc}")
    else:
        messages.success(request, done)
        if action == "delete":
            return redirect("fleet")  # its page is gone
    return redirect("repair") if back else redirect("host", name=host.name)


@console_view(scoping.ADMIN)
@require_http_methods(["GET", "POST"])
def host_firmware_update(request, name: str):
    """The platform admin's servicing action: update one firmware component of an available host from an image URL
    (hosts.services.host_firmware_update). A refusal (a host that serves a tenant, a bad URL) shows on the form with
    its reason, and nothing changes."""
    host = BareMetalHost.objects.defer(*presenters.SECRETS).select_related("claim__tenant").filter(name=name).first()
    if host is None:
        raise Http404("no such host")
    context = {"host": host, "components": presenters.firmware_shown(host)["components"],
               "component": request.POST.get("component", ""), "image_url": request.POST.get("image_url", ""),
               # Flashing firmware is as destructive as a power-off: it wants a recent sign-in.
               "fresh_refusal": fresh_sign_in_refusal(request), "fresh_next": request.get_full_path()}
    if request.method == "POST" and context["fresh_refusal"]:
        return page(request, "hosts/firmware_update.html", context, status=403)
    if request.method == "GET":
        if host.state != HostState.AVAILABLE:
            context["refusal"] = (f"{host.name} is {host.get_state_display().lower()}: firmware is updated only on an "
                                  "available host" + ("; release its claim first" if host.state in
                                                      (HostState.PROVISIONING, HostState.PROVISIONED) else ""))
        return page(request, "hosts/firmware_update.html", context)
    try:
        services.host_firmware_update(host=host, component=context["component"], image_url=context["image_url"],
                                      actor=actor(request))
    except (IllegalTransition, ConcurrentTransition, services.FirmwareRequestInvalid) as exc:
        context["error"] = str(exc)
        status = 400 if isinstance(exc, services.FirmwareRequestInvalid) else 409
        return page(request, "hosts/firmware_update.html", context, status=status)
    messages.success(request, f"Firmware update of {context['component']} on {host.name} started; it is serviced "
                              "until the update is done")
    return redirect("host", name=host.name)


def action_run(*, host: BareMetalHost, action: str, actor: str, reason: str = "", override: bool = False) -> str:
    """One of ACTIONS on one host, through hosts.services: what it did, in words. Raises IllegalTransition or
    ConcurrentTransition when refused (nothing changed then). The host page and the fleet board's bulk actions
    (console.fleet_actions) both call this."""
    label = ACTIONS[action][0]
    if action == "maintenance-on":
        services.host_set_maintenance(host=host, on=True, actor=actor, reason=reason)
    elif action == "maintenance-off":
        services.host_set_maintenance(host=host, on=False, actor=actor, reason=reason)
    elif action == "retry":
        services.host_retry(host=host, actor=actor, reason=reason)
    elif action == "retest":
        services.host_retest(host=host, actor=actor, reason=reason)
        return f"{label}: {host.name} is being cleaned and checked again"
    elif action == "return-to-service":
        # The reason counts as an override only when the admin ticked it: a note typed on the way is not one.
        passed = services.host_last_repair_verdict(host=host).get("retest") == "passed"
        services.host_return_to_service(host=host, actor=actor,
                                        override_reason=reason if (override or passed) else "")
    elif action == "retire":
        services.host_retire(host=host, actor=actor, reason=reason)
    elif action == "preflight":
        preflight_request(host_ids=[host.pk], actor=actor)
        return f"{label}: asked for {host.name}; the result will appear on its page"
    elif action == "end-hold":
        if not reason.strip():
            raise IllegalTransition(f"ending the hold on {host.name}'s kept data disks needs a reason")
        if not services.hosts_kept_release(ended={host.pk: f"ended by {actor}: {reason}"}, actor=actor):
            raise IllegalTransition(f"{host.name} holds no kept data disks now (only a free host on hold does)")
        return f"{label}: every disk of {host.name} is being erased; then it serves any tenant"
    elif action == "delete":
        services.host_delete(host=host, actor=actor)
        return f"{label}: {host.name} deleted; its certificates, health runs and Events are kept"
    elif action in services.POWER_STEPS:
        services.host_power_request(host=host, action=action, actor=actor, reason=reason)
        return f"{label}: asked for {host.name}; the BMC's answer will appear in the timeline"
    else:
        raise ValueError(f"unknown action {action!r}")
    return f"{label}: done for {host.name}"


def _confirmation(host: BareMetalHost, action: str) -> dict:
    """What the confirmation page says besides the warning: why it is refused now, what else it affects."""
    notes, refusal, override = [], "", False
    claim = getattr(host, "claim", None)
    if action == "delete":
        refusal = services.host_removal_refusal(host)
    elif action in services.POWER_STEPS:
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
    if not refusal and action not in services.POWER_STEPS and action != "delete":
        # An action its state does not offer (a page left open, a link kept): why not, and what to do instead.
        refusal = presenters.action_refusal(host, action)
    return {"notes": notes, "refusal": refusal, "override": override}


# --- the repair pool ----------------------------------------------------------------------------------

@console_view(*STAFF)
def repair(request):
    """The hosts that need attention (hosts.selectors.hosts_needing_attention): in error, in repair (set aside
    because cleaning, the erase check or the health check failed, with the evidence), or past their deadline;
    each with its reason and the action that fixes it."""
    cursor = live_cursor()
    hosts = hosts_needing_attention(presenters.row_queryset())
    pager = Paginator(hosts, page_size(request)).get_page(request.GET.get("page"))
    rows = presenters.decorate_rows(list(pager.object_list), presenters.node_types_by_selector())
    attention_explain(rows)
    _attach_evidence(rows)
    if scoping.acts_on_hosts(request.user):
        for h in rows:
            h.actions = presenters.host_actions(h, admin=scoping.is_admin(request.user))
    stats = repair_stats(node_type=request.GET.get("node_type", "")[:253], kind=request.GET.get("kind", "")[:16])
    return page(request, "hosts/repair.html", {
        "cursor": cursor, "page_obj": pager, "rows": rows, "nav": "repair", "paging_query": paging_query(request),
        "stats": stats, "stats_tables": [("Fleet", [presenters.repair_figures_shown(stats["fleet"])]),
                                         ("NodeType", map(presenters.repair_figures_shown, stats["by_node_type"])),
                                         ("Failure kind", map(presenters.repair_figures_shown, stats["by_kind"]))],
        "stats_node_types": list(NodeType.objects.order_by("name").values_list("name", flat=True)),
        "failure_kinds": FailureKind.choices})


def _pks(value) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _bmc_events(log, newest: int = 5) -> list[str]:
    """The newest entries of the BMC's event log kept with the move into repair (hosts.flows.steps.bmc_event_log),
    one line each; or why it could not be read."""
    if not isinstance(log, dict):
        return []
    if log.get("error"):
        return [f"not read: {log['error']}"]
    entries = [e for e in log.get("entries") or [] if isinstance(e, dict)][-newest:]
    return [f"{(e.get('time') or '')[:19]} {e.get('sensor_type', '')} #{e.get('sensor')}: {e.get('event', '')} "
            f"({e.get('direction', '')})".strip() for e in entries]


def _attach_evidence(rows: list) -> None:
    """Each row's failing step and links to what failed, from the data of its move into repair
    (hosts.flows.host.host_flow_fail: {"step", "message", "evidence": {"certificates": [pk...], "health_run": pk}}): the failed
    certificates (printable page and signed JSON) and the health run (its row on the host page). Two queries
    for the whole page."""
    wanted = {}
    for h in rows:
        data = h.reason_data if isinstance(h.reason_data, dict) else {}
        evidence = data.get("evidence") if isinstance(data.get("evidence"), dict) else {}
        h.failed_step = h.reason_step or data.get("step") or ""
        h.bmc_events = _bmc_events(data.get("bmc_event_log"))
        wanted[h.pk] = (_pks(evidence.get("certificates")), _pks(evidence.get("health_run")))
    cert_ids = {pk for certs, _ in wanted.values() for pk in certs}
    run_ids = {pk for _, runs in wanted.values() for pk in runs}
    certs = {c.pk: c for c in EraseCertificate.objects.filter(pk__in=cert_ids, result="fail")
             .only("pk", "host_id", "disk", "serial", "result")} if cert_ids else {}
    runs = {r.pk: r for r in HealthCheckRun.objects.filter(pk__in=run_ids).only("pk", "host_id", "suite", "verdict")
            } if run_ids else {}
    for h in rows:
        cert_pks, run_pks = wanted[h.pk]
        h.evidence_links = []
        for pk in run_pks:
            run = runs.get(pk)
            if run is not None and run.host_id == h.pk:
                h.evidence_links.append({"label": f"{run.suite} health run ({run.verdict})",
                                         "url": reverse("health-run", args=[run.pk])})
        for pk in cert_pks:
            cert = certs.get(pk)
            if cert is not None and cert.host_id == h.pk:  # the failed ones: the evidence
                h.evidence_links.append({"label": f"erase certificate {cert.disk} ({cert.result})",
                                         "url": reverse("certificate", args=[cert.pk]),
                                         "json_url": reverse("certificate-json", args=[cert.pk])})

