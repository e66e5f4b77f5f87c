"""Pages of what can be ordered and who orders it: providers, NodeTypes, NodeEnvironments, OS images and
tenants (lists, create / edit forms), the tenant's self-service page, and the YAML apply page."""
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Q, Sum
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST

from access.sessions import fresh_sign_in_refusal
from autonodes.selectors import pool_status
from claims import presenters as claim_presenters
from claims.choices import ClaimPhase
from claims.ipam import environments_usage
from claims.lifecycle import LIVE
from claims.models import ClaimGroup, NodeClaim
from claims.power import POWER_ACTIONS, claim_power_allowed
from claims.providers import machines_of
from claims.tenant_check import tenant_api_console_check, tenant_api_server_check
from core import scoping
from core.actors import actor
from core.views import STAFF, console_view, is_htmx, list_filter, page, role_of
from events.choices import EventKind, ObjectType
from events.services import event_record
from events.views import live_cursor
from hosts.capacity import capacity_columns
from hosts.models import BareMetalHost
from hosts.preflight import environment_hosts_q, preflight_summary
from manifests.apply import Fields, apply_files
from manifests.source import ManifestError
from pools.capacity import capacity_shown
from pools.choices import PoolKind
from pools.filtersets import (
    NodeEnvironmentFilterSet,
    NodeProviderFilterSet,
    NodeTypeFilterSet,
    OSImageFilterSet,
    TenantFilterSet,
)
from pools.models import (
    NodeEnvironment,
    NodePool,
    NodeProvider,
    NodeType,
    OSImage,
    Tenant,
)
from pools.selectors import tenants_visible
from pools.services import StaleVersion, pool_update, tenant_quota_warning

from . import forms

# --- the tenant's page --------------------------------------------------------------------------------

SHOWN_PHASES = [p for p in ClaimPhase.values if p != ClaimPhase.RELEASED]


def tenant_for(user, name: str) -> Tenant:
    """A tenant in the user's scope, else 404: a member of another tenant learns nothing, not even that
    it exists."""
    tenant = tenants_visible(user).filter(name=name).first()
    if tenant is None:
        raise Http404("no such tenant")
    return tenant


def tenant_context(user, tenant: Tenant) -> dict:
    """Pools with their claims by phase, live claims with progress, nodes, quota, fabric partitions, the tenant
    API check. A fixed number of queries."""
    pools = list(tenant.pools.select_related("provider", "roll").order_by("name"))  # roll: a static pool's drift
    counts = {}
    for row in (NodeClaim.objects.filter(tenant=tenant).exclude(phase=ClaimPhase.RELEASED).order_by()
                .values("pool_id", "phase").annotate(n=Count("pk"))):
        counts.setdefault(row["pool_id"], {})[row["phase"]] = row["n"]
    for pool in pools:
        by_phase = counts.get(pool.pk, {})
        pool.phase_counts = [(p, by_phase[p], ClaimPhase.colour(p)) for p in SHOWN_PHASES if by_phase.get(p)]
        pool.live = sum(n for p, n in by_phase.items() if p in LIVE)
    claims = list(claim_presenters.claims_rows_queryset(
        NodeClaim.objects.filter(tenant=tenant).exclude(phase=ClaimPhase.RELEASED)).order_by("-created_at", "-pk")[:200])
    claim_presenters.with_progress(claims)
    may_power = claim_power_allowed(user, tenant)
    if may_power:  # each row's power state beside its buttons: the machine's, or the host's (one query for all)
        machines = machines_of([c.pk for c in claims if not c.host_id])
        for c in claims:
            machine = machines.get(c.pk)
            c.power_shown = (machine["power"] if machine else c.host.power_state if c.host else "") or "unknown"
    nodes = [c for c in claims if c.phase == ClaimPhase.AVAILABLE]
    used = sum(p.quantity or 0 for p in pools if p.kind == PoolKind.STATIC)
    return {"tenant": tenant, "pools": pools, "claims": claims, "nodes": nodes, "quota_used": used,
            "fabric_partitions": list(tenant.fabric_partitions.order_by("kind")),
            "may_change": scoping.may_change_tenant(user, tenant), "errors_for": {}, "may_power": may_power,
            "power_actions": POWER_ACTIONS.items(),
            "api_server_check": tenant_api_server_check(tenant)}


def render_tenant_live(user, tenant: Tenant) -> list[str]:
    ctx = {**tenant_context(user, tenant), "oob": True}
    parts = [render_to_string("pools/partials/pool_claims.html", {**ctx, "pool": pool}) for pool in ctx["pools"]]
    # Quantities changed elsewhere (another page, the API, apply); live.js keeps a box the user is editing.
    parts += [render_to_string("pools/partials/pool_quantity.html", {**ctx, "pool": pool, "form": None})
              for pool in ctx["pools"]]
    parts.append(render_to_string("pools/partials/tenant_quota.html", ctx))
    parts.append(render_to_string("pools/partials/tenant_fabric.html", ctx))
    parts.append(render_to_string("pools/partials/tenant_claims.html", ctx))
    parts.append(render_to_string("pools/partials/tenant_nodes.html", ctx))
    return parts


@login_required
def home(request):
    role = role_of(request)
    if role in STAFF:
        return redirect("fleet")
    if role == scoping.MEMBER:
        names = list(tenants_visible(request.user).values_list("name", flat=True)[:2])
        if len(names) == 1:
            return redirect("tenant", name=names[0])
        return redirect("tenants")
    raise PermissionDenied("your account belongs to no tenant; ask a platform admin")



@console_view()
def tenant_page(request, name: str):
    cursor = live_cursor()
    tenant = tenant_for(request.user, name)
    # The hosts serving the tenant, by their last preflight (hosts/preflight.py); reasons for staff only.
    preflight = preflight_summary(BareMetalHost.objects.filter(claim__tenant=tenant))
    return page(request, "pools/tenant.html", {"cursor": cursor, **tenant_context(request.user, tenant),
                                               "preflight": preflight, "ws_url": f"/ws/tenants/{tenant.pk}/",
                                               "nav": "tenants"})


@console_view()
def tenant_api_check(request, name: str):
    """Does the tenant API answer from the console (TCP, TLS with the tenant's CA)? Checked when the page asks,
    with a short timeout and outside any transaction; reused for TENANT_API_CONSOLE_CHECK_TTL_S."""
    tenant = tenant_for(request.user, name)
    return HttpResponse(render_to_string("pools/partials/tenant_api_check.html", {
        "tenant": tenant, "console_check": tenant_api_console_check(tenant)}, request=request))


def pool_for(user, tenant_name: str, pool_name: str) -> NodePool:
    """A pool of a tenant in the user's scope, else 404 (as tenant_for)."""
    tenant = tenant_for(user, tenant_name)
    pool = NodePool.objects.select_related("tenant", "provider").filter(tenant=tenant, name=pool_name).first()
    if pool is None:
        raise Http404("no such pool")
    return pool


def pool_context(user, pool: NodePool) -> dict:
    """A pool's page: for a dynamic pool its watcher, demand, decisions, nodes, limits and budgets
    (autonodes.selectors.pool_status); for a static one its quantity and live claims. A fixed number of queries."""
    status = pool_status(pool)
    claim_presenters.with_progress(status.listed)
    live = NodeClaim.objects.filter(pool=pool, group__isnull=False).exclude(phase=ClaimPhase.RELEASED)
    groups = claim_presenters.claim_groups_rows(ClaimGroup.objects.filter(pk__in=live.values("group_id"))
                                                .order_by("created_at", "pk"))
    return {"tenant": pool.tenant, "pool": pool, "status": status, "groups": groups}


def render_pool_live(user, pool: NodePool) -> list[str]:
    return [render_to_string("pools/partials/pool_sections.html", pool_context(user, pool))]


@console_view()
def pool_page(request, name: str, pool: str):
    cursor = live_cursor()
    target = pool_for(request.user, name, pool)
    return page(request, "pools/pool.html", {"cursor": cursor, **pool_context(request.user, target),
                                             "ws_url": f"/ws/pools/{target.pk}/", "nav": "tenants"})


@console_view()
@require_POST
def pool_quantity(request, name: str, pool: str):
    """Change a static pool's quantity, within the tenant's quota; a refusal changes nothing."""
    tenant = tenant_for(request.user, name)
    if not scoping.may_change_tenant(request.user, tenant):
        raise Http404("no such tenant") if not scoping.may_see_tenant(request.user, tenant) else \
            _forbidden("your role reads this tenant but changes nothing")
    target = get_object_or_404(NodePool, tenant=tenant, name=pool)
    form = forms.QuantityForm(request.POST)
    saved = None
    if target.kind != PoolKind.STATIC:
        form.is_valid()
        form.add_error(None, "a dynamic pool has limits, not a quantity")
    elif form.is_valid():
        before = target.quantity
        try:
            target = pool_update(pool=target, values={"quantity": form.cleaned_data["quantity"]},
                                 actor=actor(request), expected_version=form.cleaned_data.get("version"))
        except ValidationError as exc:
            for message in exc.message_dict.get("quantity", exc.messages) if hasattr(exc, "error_dict") else exc.messages:
                form.add_error("quantity", message)
        except StaleVersion:
            target.refresh_from_db()
            form.add_error("quantity", f"pool {target.name} was changed meanwhile (it is now {target.quantity}); "
                                       "look again and retry")
        else:
            saved = f"{target.name}: {before} → {target.quantity}"
    target.refresh_from_db()
    ok = saved is not None
    if is_htmx(request):
        html = render_to_string("pools/partials/pool_quantity.html",
                                {"pool": target, "form": None if ok else form, "saved": saved, "may_change": True,
                                 "tenant": tenant}, request=request)
        return HttpResponse(html)
    if ok:
        messages.success(request, f"quantity of {saved}")
        return redirect("tenant", name=tenant.name)
    context = tenant_context(request.user, tenant)
    context["errors_for"] = {target.pk: form}
    return page(request, "pools/tenant.html", {"cursor": live_cursor(), **context, "nav": "tenants",
                                               "ws_url": f"/ws/tenants/{tenant.pk}/"}, status=400)


def _forbidden(message: str):
    from django.core.exceptions import PermissionDenied

    raise PermissionDenied(message)


@console_view()
@require_POST
def join_command(request, name: str):
    """'Join Node…': the command that joins a machine by hand, with the person's live join token for the tenant
    or, when none, a new one from the tenant's API (claims.join_tokens). Network I/O on an explicit POST, outside
    any transaction; the token shows in this response only, and showing it is on the record."""
    tenant = tenant_for(request.user, name)
    if not scoping.may_change_tenant(request.user, tenant):
        _forbidden("your role reads this tenant but changes nothing")
    result = {"tenant": tenant}
    fresh_refusal = fresh_sign_in_refusal(request)  # a join command holds a secret: a recent sign-in shows one
    if fresh_refusal:
        result.update(fresh_refusal=fresh_refusal, fresh_next=reverse("tenant", args=[tenant.name]),
                      error=f"No join command yet: {fresh_refusal}.")
    elif not tenant.kubeconfig:
        result["error"] = (f"Tenant {tenant.name} has no API credentials (kubeconfig) yet, so no join token can be "
                           "made. A platform admin adds them on the tenant's edit page or with apply.")
    else:
        from claims.join_tokens import join_command_shown, join_token_for, tenant_api
        from claims.tenant_api import TenantAPIError

        try:
            api = tenant_api(tenant)
            refusal = api.join_refusal(tenant.join_mode)
            if refusal:  # asked before a token is made: a refused join leaves no token behind
                result["error"] = f"No join command for tenant {tenant.name}: {refusal}."
            else:
                token, reused = join_token_for(api, tenant, request.user, actor(request))
                endpoint = tenant.api_endpoint or api.server.split("://", 1)[-1]
                result["command"], result["note"] = api.join(tenant.join_mode, endpoint, token.token)
                result["expires_at"], result["reused"], result["token_id"] = token.expires_at, reused, token.id
                join_command_shown(tenant, token.id, reused=reused, actor=actor(request))
        except (TenantAPIError, ValueError) as exc:
            result["error"] = f"The tenant API did not give a join token: {exc}"
    if is_htmx(request):
        return HttpResponse(render_to_string("pools/partials/join_command.html", result, request=request))
    context = tenant_context(request.user, tenant)
    return page(request, "pools/tenant.html", {"cursor": live_cursor(), **context, "join": result, "nav": "tenants",
                                               "ws_url": f"/ws/tenants/{tenant.pk}/"},
                status=200 if "command" in result else 400)


@console_view()
def join_tokens(request, name: str):
    """The tenant's join tokens the console made for people, with whether a node used them (asked of the
    tenant's API with the short check timeout, when the page asks)."""
    from claims.join_tokens import join_tokens_of, join_tokens_use_refresh

    tenant = tenant_for(request.user, name)
    tokens = join_tokens_of(tenant)
    problem = join_tokens_use_refresh(tenant, tokens)
    return HttpResponse(render_to_string("pools/partials/join_tokens.html", {
        "tenant": tenant, "join_tokens": tokens, "join_tokens_problem": problem,
        "may_change": scoping.may_change_tenant(request.user, tenant)}, request=request))


@console_view()
@require_POST
def join_token_revoke(request, name: str, pk: int):
    """Revoke one of the tenant's join tokens: deleted in the tenant's API first; a refusal there changes nothing."""
    from claims.join_tokens import join_token_revoke_manual
    from claims.models import JoinToken
    from claims.tenant_api import TenantAPIError

    tenant = tenant_for(request.user, name)
    if not scoping.may_change_tenant(request.user, tenant):
        _forbidden("auditors see tenants but change nothing")
    token = get_object_or_404(JoinToken.objects.select_related("tenant"), tenant=tenant, pk=pk,
                              revoked_at__isnull=True)
    try:
        join_token_revoke_manual(token, actor(request))
    except (TenantAPIError, ValueError) as exc:
        messages.error(request, f"join token {token.token_id} not revoked: {exc}")
    else:
        messages.success(request, f"join token {token.token_id} revoked")
    return redirect("tenant", name=tenant.name)


# --- lists and forms of the catalogue -----------------------------------------------------------------

KINDS = {
    "providers": {"model": NodeProvider, "form": forms.NodeProviderForm, "title": "Node providers",
                  "noun": "NodeProvider"},
    "node-types": {"model": NodeType, "form": forms.NodeTypeForm, "title": "Node types", "noun": "NodeType"},
    "environments": {"model": NodeEnvironment, "form": forms.NodeEnvironmentForm, "title": "Node environments",
                     "noun": "NodeEnvironment"},
    "images": {"model": OSImage, "form": forms.OSImageForm, "title": "OS images", "noun": "OSImage"},
    "tenants": {"model": Tenant, "form": forms.TenantForm, "title": "Tenants", "noun": "Tenant"},
}


# Each list filters as its /api/v1/ endpoint does, through the same FilterSet (pools.filtersets).

@console_view(*STAFF)
def provider_list(request):
    filters = list_filter(request, NodeProviderFilterSet, NodeProvider.objects.all())
    providers = list(filters.qs.annotate(types=Count("node_types", distinct=True),
                                         pools_n=Count("pools", distinct=True)))
    return page(request, "pools/provider_list.html", {"cursor": live_cursor(), "live_topic": "/ws/lists/catalogue/", "objects": providers, "filters": filters, "kind": "providers",
                                                       **_kind("providers")})


@console_view(*STAFF)
def node_type_list(request):
    filters = list_filter(request, NodeTypeFilterSet, NodeType.objects.select_related("provider"))
    types = list(filters.qs)
    capacity = capacity_shown(types)  # an external provider's types: as its kind says (network I/O, no transaction)
    for t in types:
        t.capacity = capacity[t.pk]
        t.cost_shown = t.effective_cost()
        t.verify_shown = "every byte" if t.erase_verify_full else f"{t.erase_verify_share * 100:g}% sampled"
    return page(request, "pools/node_type_list.html", {"cursor": live_cursor(), "live_topic": "/ws/lists/catalogue/", "objects": types, "filters": filters, "kind": "node-types",
                                                        "capacity_columns": capacity_columns(), **_kind("node-types")})


@console_view(*STAFF)
def environment_list(request):
    environments = NodeEnvironment.objects.select_related("provider", "tenant")
    filters = list_filter(request, NodeEnvironmentFilterSet, environments)
    envs = list(filters.qs)
    usage = environments_usage(envs)  # IPAM: used / free / leaked addresses (claims.ipam)
    for env in envs:
        env.usage = usage.get(env.pk)
        env.cidr = env.properties.get(NodeEnvironment.CIDR, "")
        env.ip_range = env.properties.get(NodeEnvironment.IP_RANGE, "")
        env.dns = env.properties.get(NodeEnvironment.DNS, "")
        env.preflight = preflight_summary(BareMetalHost.objects.filter(environment_hosts_q(env)))
    return page(request, "pools/environment_list.html", {"cursor": live_cursor(), "live_topic": "/ws/lists/catalogue/", "objects": envs, "filters": filters, "kind": "environments",
                                                          **_kind("environments")})


@console_view(*STAFF)
def image_list(request):
    filters = list_filter(request, OSImageFilterSet, OSImage.objects.all())
    return page(request, "pools/image_list.html", {"cursor": live_cursor(), "live_topic": "/ws/lists/catalogue/", "objects": list(filters.qs), "filters": filters, "kind": "images",
                                                    **_kind("images")})


@console_view()
def tenant_list(request):
    filters = list_filter(request, TenantFilterSet, tenants_visible(request.user))
    tenants = list(filters.qs.annotate(
        pools_n=Count("pools", distinct=True),
        quantity=Sum("pools__quantity", filter=Q(pools__kind=PoolKind.STATIC)),
        members=Count("memberships", distinct=True)))
    live = dict(NodeClaim.objects.filter(tenant__in=tenants).exclude(phase=ClaimPhase.RELEASED).order_by()
                .values("tenant_id").annotate(n=Count("pk")).values_list("tenant_id", "n"))
    for t in tenants:
        t.live_claims = live.get(t.pk, 0)
    return page(request, "pools/tenant_list.html", {"cursor": live_cursor(), "live_topic": "/ws/lists/tenants/", "objects": tenants, "filters": filters, "kind": "tenants",
                                                     **_kind("tenants")})


def _kind(kind: str) -> dict:
    spec = KINDS[kind]
    return {"title": spec["title"], "noun": spec["noun"], "create_url": reverse("catalogue-create", args=[kind]),
            "list_url": reverse(kind), "nav": kind}


def _lookup(kind: str, key: str, namespace: str | None = None):
    """The object an edit URL names: by name (a NodeEnvironment by namespace and name)."""
    model = KINDS[kind]["model"]
    if model is NodeEnvironment:
        if namespace is None:
            raise Http404("no such object")
        return get_object_or_404(model, namespace=namespace, name=key)
    if namespace is not None:
        raise Http404("no such object")
    return get_object_or_404(model, name=key)


def _edit_url(kind: str, instance) -> str:
    if isinstance(instance, NodeEnvironment):
        return reverse("catalogue-edit-namespaced", args=[kind, instance.namespace, instance.name])
    return reverse("catalogue-edit", args=[kind, instance.name])


@console_view(scoping.ADMIN)
def catalogue_edit(request, kind: str, key: str | None = None, namespace: str | None = None):
    """Create or edit one object; the model's validation (the same as apply's) shows next to each field."""
    if kind not in KINDS:
        raise Http404("no such kind")
    spec = KINDS[kind]
    if key and key.isdigit() and namespace is None and request.method == "GET":
        # The old edit URLs by id, in bookmarks: to the object's URL by name (a name that is all digits first).
        model = spec["model"]
        if model is NodeEnvironment or not model.objects.filter(name=key).exists():
            return redirect(_edit_url(kind, get_object_or_404(model, pk=int(key))), permanent=True)
    instance = _lookup(kind, key, namespace) if key else None
    form_class = spec["form"]
    if request.method == "POST":
        form = form_class(request.POST, instance=instance)
        if instance is not None and "name" in form.fields:
            form.fields["name"].disabled = True  # names are identities: manifests refer to them
        if form.is_valid():
            saved = form.save_as(actor(request))
            if saved is not None:
                messages.success(request, f"{spec['noun']} {saved} {'saved' if instance else 'created'}")
                if kind == "tenants":
                    if instance is not None and "quota_nodes" in form.changed_data and (
                            warning := tenant_quota_warning(tenant=saved, quota=saved.quota_nodes)):
                        messages.warning(request, warning)  # saved: nothing is released
                    return redirect("tenant", name=saved.name)
                return redirect(f"{kind}")
    else:
        form = form_class(instance=instance)
        if instance is not None and "name" in form.fields:
            form.fields["name"].disabled = True
    return page(request, "pools/catalogue_form.html", {
        "form": form, "instance": instance, "kind": kind, "noun": spec["noun"], "title": spec["title"],
        "list_url": reverse(kind), "nav": kind}, status=400 if request.method == "POST" else 200)


# --- YAML apply ------------------------------------------------------------------------------------------

# Where each applied object's page is: its kind in apply's lines ("nodetype/gpu") and the URL of its name.
APPLIED_PAGES = {"nodeprovider": ("catalogue-edit", "providers"), "nodetype": ("catalogue-edit", "node-types"),
                 "nodeenvironment": ("catalogue-edit-namespaced", "environments"),
                 "osimage": ("catalogue-edit", "images"), "virtualclusterinstance": ("tenant", None),
                 "nodepool": ("pool", None), "baremetalhost": ("host", None)}


def applied_items(result, *, applied: bool) -> list[dict]:
    """apply's result, one entry an object, each with the link to its page (none in a preview of a new one: it
    is not there yet; none for a Secret: it has no page)."""
    items = []
    for item in result.items:
        kind, _, name = item["what"].partition("/")
        url = ""
        if kind in APPLIED_PAGES and (applied or item["verb"] != "created"):
            route, first = APPLIED_PAGES[kind]
            url = reverse(route, args=[*([first] if first else []), *name.split("/")])
        items.append({**item, "kind": kind, "name": name, "url": url})
    return items


# The page's messages name its own fields, not the command's options.
APPLY_FIELDS = Fields(tenant="a tenant name in the Tenant field", create_tenant='"Create tenant"')


@console_view(scoping.ADMIN)
def apply_page(request):
    """Paste or upload manifests. "Preview" runs a dry run and shows what would change; "Apply" applies the
    same text, all or nothing, as `manage.py apply`."""
    result = None
    error = None
    applied = False
    if request.method == "POST":
        form = forms.ApplyForm(request.POST, request.FILES)
        if form.is_valid():
            dry_run = request.POST.get("action") != "apply"
            try:
                result = apply_files([(form.cleaned_data["file_name"], form.cleaned_data["text"])],
                                     actor=actor(request),
                                     tenant=form.cleaned_data.get("tenant") or None, dry_run=dry_run,
                                     create_tenant=form.cleaned_data.get("create_tenant", False),
                                     fields=APPLY_FIELDS)
            except ManifestError as exc:
                error = str(exc)
                form.add_error("text", error.splitlines())  # every error of the document, one a line
            else:
                applied = not dry_run
                if applied:
                    form = forms.ApplyForm(initial={"tenant": form.cleaned_data.get("tenant")})
                else:
                    form = forms.ApplyForm(initial={"text": form.cleaned_data["text"],
                                                    "tenant": form.cleaned_data.get("tenant"),
                                                    "create_tenant": form.cleaned_data.get("create_tenant")})
    else:
        form = forms.ApplyForm()
    items = applied_items(result, applied=applied) if result is not None else []
    return page(request, "pools/apply.html", {"form": form, "result": result, "error": error, "applied": applied,
                                              "items": items, "nav": "apply"},
                status=400 if error else 200)
