"""Admin for node claims: the reconciler creates them and the services move their phase; here an
admin reads them, fixes node details, and releases claims through claims.phases."""
from django.contrib import admin, messages
from django.db.models import Count, Q
from django.urls import reverse
from django.utils.html import format_html

from core.transitions import ConcurrentTransition, IllegalTransition
from events.admin import (
    ReadOnlyAdmin,
    RecordedAdmin,
    admin_actor,
    badge,
    brief,
    event_log_link,
)
from events.choices import ObjectType
from pools.admin import NodePoolAdmin, TenantAdmin
from pools.models import NodePool, Tenant

from .lifecycle import LIVE
from .models import AddressAllocation, ClaimGroup, NodeClaim
from .phases import claims_release

EDITABLE = ("node_name", "node_labels", "taints")


@admin.register(ClaimGroup)
class ClaimGroupAdmin(ReadOnlyAdmin):
    """All-or-nothing groups: read only (the reconciler makes them, the allocator places them whole)."""

    list_display = ("name", "tenant", "pool_name", "size", "on_member_failure", "rack", "rail_group", "placed_at",
                    "placements", "reason", "message")
    list_filter = ("on_member_failure", "reason", "tenant")
    search_fields = ("name", "pool_name", "tenant__name", "rail_group", "rack")
    list_select_related = ("tenant",)


@admin.register(NodeClaim)
class NodeClaimAdmin(RecordedAdmin):
    event_object_type = ObjectType.CLAIM
    event_self_link = "claim"
    list_display = ("name", "tenant", "pool_name", "phase_badge", "host_link", "node_type", "node_name", "reason",
                    "message_text", "created_at")
    list_filter = ("phase", "reason", "tenant", "node_type", "provider")
    search_fields = ("name", "pool_name", "host_name", "node_name", "tenant__name", "message")
    list_select_related = ("tenant", "node_type")
    actions = ("release",)
    readonly_fields = ("name", "namespace", "tenant", "pool", "pool_name", "provider", "node_type", "host",
                       "host_name", "phase", "phase_changed_at", "reason", "message", "attempts", "conditions_text",
                       "requirements", "properties", "created_at", "scheduled_at", "provisioned_at", "joined_at",
                       "available_at", "released_at", "event_log")
    fieldsets = (
        (None, {"fields": ("name", "namespace", "tenant", "pool", "pool_name", "provider")}),
        ("Phase (changed only by the services)", {
            "fields": ("phase", "phase_changed_at", "reason", "message", "attempts", "conditions_text",
                       "event_log")}),
        ("Node", {"fields": ("node_type", "host", "host_name", *EDITABLE)}),
        ("Asked for (a snapshot of the pool)", {"fields": ("requirements", "properties")}),
        ("Times", {"fields": ("created_at", "scheduled_at", "provisioned_at", "joined_at", "available_at",
                              "released_at")}),
    )

    def event_links(self, claim):
        return {"tenant": claim.tenant, "host": claim.host}

    def has_add_permission(self, request):
        return False  # the pool reconciler creates claims

    def has_delete_permission(self, request, obj=None):
        # A claim without a host may go (a Failed one, so that its pool tries again); one with a host
        # is released instead, so that the host is cleaned and returned.
        if obj is not None and obj.host_id is not None:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # bulk delete would skip the per-claim check above
        return actions

    @admin.display(description="phase", ordering="phase")
    def phase_badge(self, claim):
        return badge(claim.phase, claim.phase_colour)

    @admin.display(description="host", ordering="host_name")
    def host_link(self, claim):
        if not claim.host_id:
            return claim.host_name or "-"
        url = reverse("admin:hosts_baremetalhost_change", args=[claim.host_id])
        return format_html('<a href="{}">{}</a>', url, claim.host_name or claim.host_id)

    @admin.display(description="message")
    def message_text(self, claim):
        return brief(claim.message, 60)

    @admin.display(description="conditions")
    def conditions_text(self, claim):
        return ", ".join(f"{c['type']}={c['status']}" for c in claim.conditions())

    @admin.display(description="events")
    def event_log(self, claim):
        return event_log_link(claim__id__exact=claim.pk) if claim.pk else "-"

    @admin.action(description="Release", permissions=["change"])
    def release(self, request, queryset):
        actor = admin_actor(request)
        done = []
        for claim in queryset.order_by("name"):
            if claim.phase not in LIVE:
                self.message_user(request, f"Release: {claim.name} is {claim.phase} already", messages.WARNING)
                continue
            try:
                claims_release(claims=[claim], actor=actor, reason="released by admin")
            except (IllegalTransition, ConcurrentTransition) as exc:
                self.message_user(request, f"Release: {exc}", messages.WARNING)
            else:
                done.append(f"{claim.name} → {claim.phase}")
        if done:
            self.message_user(request, f"Release: {', '.join(done)}. Their pools get new claims at the next "
                                       "reconcile unless their quantity is lowered.", messages.SUCCESS)


# --- the pools admin, with each tenant's and pool's live claims (pools know nothing of claims) --------------

def _with_live_claims(base, position: int):
    class WithLiveClaims(base):
        list_display = (*base.list_display[:position], "live_claims", *base.list_display[position:])

        def get_queryset(self, request):
            return super().get_queryset(request).annotate(
                live_claim_total=Count("claims", filter=Q(claims__phase__in=list(LIVE)), distinct=True))

        @admin.display(description="live claims", ordering="live_claim_total")
        def live_claims(self, obj):
            return obj.live_claim_total

    WithLiveClaims.__name__ = WithLiveClaims.__qualname__ = base.__name__
    return WithLiveClaims


for _model, _base, _position in ((Tenant, TenantAdmin, 7), (NodePool, NodePoolAdmin, 5)):
    admin.site.unregister(_model)
    admin.site.register(_model, _with_live_claims(_base, _position))


@admin.register(AddressAllocation)
class AddressAllocationAdmin(ReadOnlyAdmin):
    """IPAM's record (claims/ipam.py): read here; taken and freed only with claims' hosts, leaks by the check."""

    list_display = ("address", "environment", "claim_name", "host_name", "tenant", "since")
    list_filter = ("environment",)
    search_fields = ("address", "claim_name", "host_name", "tenant__name")
