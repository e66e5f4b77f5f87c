"""The fleet board acting on many hosts: bulk actions on the selected hosts (behind one confirmation, each host
through the same service the host page uses) and the CSV export of the board's current view."""
import csv

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import (
    Http404,
    HttpResponseBadRequest,
    QueryDict,
    StreamingHttpResponse,
)
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from access.sessions import fresh_sign_in_refusal
from claims.lifecycle import LIVE
from claims.phases import claims_release
from core import scoping
from core.actors import actor
from core.views import STAFF, console_view, list_filter, page
from events.choices import ObjectType
from events.services import object_update
from hosts import presenters, services
from hosts.filtersets import HostFilterSet
from hosts.lifecycle import ConcurrentTransition, IllegalTransition
from hosts.models import BareMetalHost
from hosts.views import ACTIONS, action_run

from . import forms

# What the board's selection may do, in the order its menu shows them. Release is the claim's (claims.phases):
# the host page has no such action, a host serving a tenant is freed by releasing its claim.
BULK_ACTIONS = tuple(slug for slug, _ in presenters.BULK_ACTIONS)
RELEASE = ("Release", ("Release the claims these hosts serve: each node is drained and deleted from its tenant's "
                       "cluster, the host is erased and checked, then returns to the pool. The pools ask for new "
                       "nodes at the next reconcile unless their quantity is lowered."))
EDIT = ("Edit", "Set the BMC credentials or labels of each selected host, checked and saved host by host (the same "
                "checks as one host's edit, apply and the API); the credentials are never shown back.")
BULK_LIMIT = 500  # hosts per request: the largest page (200) with room to spare


def bulk_label(action: str) -> tuple[str, str]:
    return {"release": RELEASE, "edit": EDIT}.get(action) or ACTIONS[action]


def _fleet_url(query: str) -> str:
    """The board with the query it was opened with, parsed and encoded again: nothing but a query string."""
    query = QueryDict(query).urlencode()
    return reverse("fleet") + (f"?{query}" if query else "")


def _release_refusal(host: BareMetalHost) -> str:
    claim = getattr(host, "claim", None)
    if claim is None:
        return f"{host.name} serves no claim: nothing to release"
    if claim.phase not in LIVE:
        return f"{host.name}'s claim {claim.name} is {claim.phase} already"
    return ""


def _refusal(host: BareMetalHost, action: str) -> str:
    """What the confirmation can tell before anything runs (the services check again, under their locks)."""
    if action == "edit":
        return ""  # checked host by host when saved
    if action == "release":
        return _release_refusal(host)
    if action in services.POWER_STEPS:
        why = services.power_cycle_refusal(host.state)
        return f"{host.name}: {why}" if why else ""
    return presenters.action_refusal(host, action)


def _edit(host: BareMetalHost, form: forms.HostBulkEditForm, who: str) -> None:
    """One host of a bulk edit: checked by BareMetalHost.clean() and saved with its Event (credentials masked)."""
    with transaction.atomic():
        fresh = BareMetalHost.objects.select_for_update(of=("self",)).get(pk=host.pk)
        try:
            object_update(fresh, form.values_for(fresh), actor=who, object_type=ObjectType.HOST, self_link="host")
        except ValidationError as exc:
            words = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()) \
                if hasattr(exc, "error_dict") else " ".join(exc.messages)
            raise IllegalTransition(f"{host.name}: {words}") from None


def _run(host: BareMetalHost, action: str, who: str, reason: str) -> str:
    if action != "release":
        return action_run(host=host, action=action, actor=who, reason=reason)
    refusal = _release_refusal(host)
    if refusal:
        raise IllegalTransition(refusal)
    claims_release(claims=[host.claim], actor=who, reason=reason or "released from the fleet board")
    return f"Release: {host.claim.name} released, {host.name} is drained and cleaned"


@console_view(scoping.ADMIN, scoping.OPERATOR)
@require_http_methods(["GET", "POST"])
def fleet_bulk(request):
    """GET: the confirmation for the selected hosts (`host`, repeated) and `action`, with what will be refused;
    POST: the action on each host, one by one, each through its service (one Event per host); each refusal is
    reported with its host, the others go ahead. Back to the board with its filters (`next`)."""
    data = request.POST if request.method == "POST" else request.GET
    action = data.get("action", "")
    if action not in BULK_ACTIONS:
        raise Http404("no such action")
    if action in presenters.ADMIN_ONLY_ACTIONS and not scoping.is_admin(request.user):
        raise PermissionDenied(f"{bulk_label(action)[0]} is the platform admin's")
    names = list(dict.fromkeys(n for n in data.getlist("host") if n and "\x00" not in n))
    back = data.get("next", "")
    if "\x00" in back:
        return HttpResponseBadRequest("next: contains a NUL character")
    if not names:
        messages.warning(request, "Select at least one host first.")
        return redirect(_fleet_url(back))
    if len(names) > BULK_LIMIT:
        return HttpResponseBadRequest(f"at most {BULK_LIMIT} hosts at once")
    hosts = list(BareMetalHost.objects.defer(*presenters.SECRETS).select_related("claim__tenant")
                 .filter(name__in=names).order_by("name"))
    label, warning = bulk_label(action)
    # Powering hosts off, deleting them and releasing their claims are destructive: they want a recent sign-in.
    danger = action in presenters.DANGEROUS_ACTIONS or action == "release"
    fresh_refusal = fresh_sign_in_refusal(request) if danger else ""
    edit_form = None
    if action == "edit":
        edit_form = forms.HostBulkEditForm(request.POST if request.method == "POST" else None)
    if request.method == "GET" or (edit_form is not None and not edit_form.is_valid()):
        rows = [{"host": h, "refusal": _refusal(h, action)} for h in hosts]
        return page(request, "hosts/confirm_bulk.html", {
            "action": action, "label": label, "warning": warning.format(host="each selected host"), "rows": rows,
            "will_run": sum(1 for r in rows if not r["refusal"]),
            "missing": sorted(set(names) - {h.name for h in hosts}),
            "danger": danger, "next": back, "fresh_refusal": fresh_refusal, "fresh_next": request.get_full_path(),
            "fleet_url": _fleet_url(back), "nav": "fleet", "edit_form": edit_form},
            status=200 if request.method == "GET" else 400)
    if fresh_refusal:
        messages.error(request, f"{label}: {fresh_refusal}; nothing was done")
        return redirect(_fleet_url(back))
    who = actor(request)
    reason = data.get("reason", "").strip()[:500]
    if "\x00" in reason:
        return HttpResponseBadRequest("reason: contains a NUL character")
    done, refused = [], []
    for host in hosts:  # each on its own: one refusal does not undo the others
        try:
            if edit_form is not None:
                _edit(host, edit_form, who)
            else:
                _run(host, action, who, reason)
        except (IllegalTransition, ConcurrentTransition) as exc:
            refused.append(f"{label}: {exc}")
        else:
            done.append(host.name)
    for name in sorted(set(names) - {h.name for h in hosts}):
        refused.append(f"{label}: {name} no longer exists")
    if done:
        messages.success(request, f"{label}: done for {len(done)} host{'s' if len(done) != 1 else ''} "
                                  f"({', '.join(done)})")
    for message in refused:
        messages.error(request, message)
    return redirect(_fleet_url(back))


# --- the CSV export -----------------------------------------------------------------------------------------

CSV_COLUMNS = ("name", "state", "power", "node_type", "labels", "claim", "tenant", "since", "deadline", "error",
               "boot_mac", "bmc_address", "online", "rack", "rail_group")


class _Echo:
    def write(self, value):
        return value


@console_view(*STAFF)
def fleet_export(request):
    """The board's current view as CSV: its filters and its sort (the same FilterSet), every page of it. Staff
    only (members never see the fleet); no credentials in it (the BMC address is what the host page shows)."""
    if not scoping.may_see_bmc(request.user):  # console_view already says so; the export holds BMC addresses
        raise PermissionDenied("this page is not for your role")
    filters = list_filter(request, HostFilterSet, BareMetalHost.objects.all())
    qs = filters.qs if filters.qs.query.order_by else filters.qs.order_by("name")
    node_types = presenters.node_types_by_selector()

    def lines():
        writer = csv.writer(_Echo())
        yield writer.writerow(CSV_COLUMNS)
        batch = []
        for host in presenters.row_queryset(qs).iterator(chunk_size=500):
            batch.append(host)
            if len(batch) == 500:
                yield from _csv_rows(writer, batch, node_types)
                batch = []
        yield from _csv_rows(writer, batch, node_types)

    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="fleet-{stamp}.csv"'
    return response


def _csv_rows(writer, hosts: list, node_types: list):
    presenters.decorate_rows(hosts, node_types)
    for h in hosts:
        claim = getattr(h, "claim", None)
        yield writer.writerow([
            h.name, h.state, h.power_state, h.node_type_name or "",
            _csv_safe(",".join(f"{k}={v}" for k, v in sorted((h.labels or {}).items()))),
            claim.name if claim else "", claim.tenant.name if claim else "",
            h.state_changed_at.isoformat() if h.state_changed_at else "",
            h.deadline_at.isoformat() if h.deadline_at else "", _csv_safe(h.error_message),
            h.boot_mac, h.bmc_address, "true" if h.online else "false",
            _csv_safe(h.topology.rack), _csv_safe(h.topology.rail_group)])


def _csv_safe(text: str) -> str:
    """A cell a spreadsheet would run as a formula (=, +, -, @ first) is quoted as text."""
    text = text or ""
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") else text

