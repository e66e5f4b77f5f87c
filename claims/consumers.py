"""Live views of claims: the claims list (phases) and one claim's page (phase, step timeline, progress)."""
from django.http import QueryDict

from claims.selectors import claims_visible
from core import scoping
from core.live_views import RESYNC, group_rule
from events.choices import ObjectType
from events.selectors import events_visible
from hosts.consumers import HostAwareConsumer

from . import presenters
from .filtersets import NodeClaimFilterSet
from .models import NodeClaim

group_rule("claim", lambda user, pk: claims_visible(user).filter(pk=pk).exists())


class ClaimListConsumer(HostAwareConsumer):
    """The rows the page shows, and new claims that match the page's filters (added at the top of the first
    page). Admins and auditors listen to every claim; members to their tenants'."""

    def authorize(self) -> bool:
        return scoping.role(self.user) != scoping.NOBODY

    def wanted_groups(self) -> set[str]:
        ids = scoping.tenant_ids(self.user)
        return {"claims"} if ids is None else {f"tenant-{t}" for t in ids}

    def keys_for_message(self, message: dict) -> set:
        if message.get("object") == "claim":
            ids = message.get("ids", ())
            # A claim in an all-or-nothing group changes its group's row too (which group: read when rendering).
            return {self._key(i) for i in ids} | {("group-of", i) for i in ids}
        return set()

    def _key(self, claim_id: int) -> tuple:
        # A claim the page does not show may be new: whether it matches the filters is read when it renders.
        return ("claim", claim_id) if claim_id in self.visible else ("new", claim_id)

    def events_in_scope(self, events):
        if self.query.get("page", "1") != "1":  # a later page gets no new rows: newest first, they go on page 1
            return events.filter(claim_id__in=self.visible)
        return events_visible(self.user, events.filter(claim_id__isnull=False, object_type=ObjectType.CLAIM))

    def keys_for_events(self, rows: list[dict]) -> set:
        return {k for r in rows if r["claim_id"] for k in (self._key(r["claim_id"]), ("group-of", r["claim_id"]))}

    def all_keys(self) -> set:
        return {("claim", i) for i in self.visible} | {("groups",)}

    def render(self, keys: set) -> list[str]:
        ids = [k[1] for k in keys if k[0] == "claim"]
        tenants = scoping.tenant_ids(self.user)
        show_tenant = tenants is None or len(tenants) != 1
        claims = list(presenters.claims_rows_queryset(claims_visible(self.user).filter(pk__in=ids)))
        parts = presenters.render_claim_rows(presenters.with_progress(claims), show_tenant=show_tenant)
        members = [k[1] for k in keys if k[0] == "group-of"]
        if ("groups",) in keys or (members and claims_visible(self.user).filter(
                pk__in=members, group__isnull=False).exists()):
            # The group table whole (at most 50 rows): new groups appear, released ones go, each row's state moves.
            parts.append(presenters.render_claim_groups_section(self.user))
        new = [k[1] for k in keys if k[0] == "new" and k[1] not in self.visible]
        if new and self.query.get("page", "1") == "1":
            data = QueryDict(mutable=True)
            data.update(self.query)
            # The page's own filters, on the claims this user may see: a claim that does not match stays off.
            matching = NodeClaimFilterSet(data, queryset=claims_visible(self.user).filter(pk__in=new)).qs
            added = list(presenters.claims_rows_queryset(matching).order_by("-created_at", "-pk"))
            if added:
                self.visible.update(c.pk for c in added)
                rows = "".join(presenters.render_claim_rows(presenters.with_progress(added), show_tenant=show_tenant))
                parts += ['<tr id="claims-empty" hx-swap-oob="delete"></tr>',
                          f'<tbody hx-swap-oob="afterbegin:#claims-rows">{rows}</tbody>']
        return parts


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
