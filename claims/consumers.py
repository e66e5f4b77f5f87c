"""Live views of claims: the claims list (phases) and one claim's page (phase, step timeline, progress)."""
from claims.selectors import claims_visible
from core import scoping
from core.live_views import RESYNC, group_rule
from hosts.consumers import HostAwareConsumer

from . import presenters
from .models import NodeClaim

group_rule("claim", lambda user, pk: claims_visible(user).filter(pk=pk).exists())


class ClaimListConsumer(HostAwareConsumer):
    """The rows the page shows. Admins and auditors listen to every claim; members to their tenants'."""

    def authorize(self) -> bool:
        return scoping.role(self.user) != scoping.NOBODY

    def wanted_groups(self) -> set[str]:
        ids = scoping.tenant_ids(self.user)
        return {"claims"} if ids is None else {f"tenant-{t}" for t in ids}

    def keys_for_message(self, message: dict) -> set:
        if message.get("object") == "claim":
            return {("claim", i) for i in message.get("ids", ()) if i in self.visible}
        return set()

    def events_in_scope(self, events):
        return events.filter(claim_id__in=self.visible)

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("claim", r["claim_id"]) for r in rows if r["claim_id"] in self.visible}

    def all_keys(self) -> set:
        return {("claim", i) for i in self.visible}

    def render(self, keys: set) -> list[str]:
        ids = [k[1] for k in keys if k[0] == "claim"]
        claims = list(presenters.claims_rows_queryset(claims_visible(self.user).filter(pk__in=ids)))
        return presenters.render_claim_rows(presenters.with_progress(claims), show_tenant=scoping.tenant_ids(self.user) is None
                                        or len(scoping.tenant_ids(self.user)) != 1)


class ClaimConsumer(HostAwareConsumer):
    """One claim: its tenant's group (phase changes) and its current host's (steps, image write %)."""

    async def connect(self):
        self.claim_id = int(self.scope["url_route"]["kwargs"]["claim_id"])
        await super().connect()

    def authorize(self) -> bool:
        return claims_visible(self.user).filter(pk=self.claim_id).exists()

    def wanted_groups(self) -> set[str]:
        row = NodeClaim.objects.filter(pk=self.claim_id).values("tenant_id", "host_id").first()
        if row is None:
            return set()
        self.host_id = row["host_id"]
        groups = {f"tenant-{row['tenant_id']}"}
        if row["host_id"]:
            groups.add(f"host-{row['host_id']}")
        return groups

    def keys_for_message(self, message: dict) -> set:
        ids = message.get("ids", ())
        if message.get("object") == "claim" and self.claim_id in ids:
            return {("claim",), RESYNC}  # it may have another host now: follow it
        if message.get("object") == "host" and getattr(self, "host_id", None) in ids:
            return {("claim",)}
        return set()

    def events_in_scope(self, events):
        return events.filter(claim_id=self.claim_id)

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("claim",)}

    def all_keys(self) -> set:
        return {("claim",)}

    def followed_hosts(self) -> set[int]:
        return {self.host_id} if getattr(self, "host_id", None) else set()

    def render(self, keys: set) -> list[str]:
        from django.http import Http404
        from django.template.loader import render_to_string

        from .views import claim_context

        try:
            from .views import claim_for_page

            claim = claim_for_page(self.user, NodeClaim.objects.filter(pk=self.claim_id)
                                   .values_list("name", flat=True).first() or "")
        except Http404:
            return []
        ctx = {**claim_context(self.user, claim), "oob": True}
        return [render_to_string("claims/partials/claim_summary.html", ctx),
                render_to_string("claims/partials/claim_steps.html", ctx),
                render_to_string("claims/partials/claim_transitions.html", ctx)]
