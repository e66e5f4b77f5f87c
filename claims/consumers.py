"""Live views of claims: the claims list (phases) and one claim's page (phase, step timeline, progress)."""
import time

from django.http import QueryDict

from claims.selectors import claims_visible
from core import scoping
from core.live_views import RESYNC, FragmentCache, Need, group_rule, scope_key, scope_tenants
from events.choices import ObjectType
from events.selectors import events_visible, latest_event_id
from hosts.consumers import HostAwareConsumer

from . import presenters
from .filtersets import NodeClaimFilterSet
from .models import NodeClaim

group_rule("claim", lambda user, pk: claims_visible(user).filter(pk=pk).exists())


ROWS = FragmentCache()  # claim rows and group tables, keyed by the scope that sees them (core.live_views.scope_key)


def in_scope(scope: tuple, claims):
    """The claims a scope sees: a shared fragment is read for its key's scope, whoever reads it."""
    tenants = scope_tenants(scope)
    return claims if tenants is None else claims.filter(tenant_id__in=tenants)


class ClaimListConsumer(HostAwareConsumer):
    """The rows the page shows, and new claims that match the page's filters (added at the top of the first
    page). Admins and auditors listen to every claim; members to their tenants'. Pages of one scope share each
    changed row's read and render (ROWS), as the fleet board's do."""

    scope = scope_key([])  # sees nothing until authorized (wanted_groups sets it, again at each re-sync)

    def authorize(self) -> bool:
        return scoping.role(self.user) != scoping.NOBODY

    def wanted_groups(self) -> set[str]:
        ids = scoping.tenant_ids(self.user)
        self.scope = scope_key(ids)
        return {"claims"} if ids is None else {f"tenant-{t}" for t in ids}

    def keys_for_message(self, message: dict) -> set:
        if message.get("object") == "claim":
            ids = message.get("ids", ())
            ROWS.want([("claim", *self.scope, i) for i in ids], time.monotonic())
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

    def render(self, keys: dict) -> list[str]:
        scope = self.scope
        tenants = scope_tenants(scope)
        show_tenant = tenants is None or len(tenants) != 1

        def read(ids) -> dict:
            claims = list(presenters.claims_rows_queryset(in_scope(scope, NodeClaim.objects.filter(pk__in=ids))))
            html = presenters.render_claim_rows(presenters.with_progress(claims), show_tenant=show_tenant)
            return {claim.pk: (row, claim.group_id) for claim, row in zip(claims, html)}

        # Every claim a key names is read (its row, and its group: whether the group table changes), once per
        # process and scope for all the pages told of it.
        needs: dict = {}
        for key, need in keys.items():
            if key[0] in ("claim", "new", "group-of"):
                needs[("claim", *scope, key[1])] = needs.get(("claim", *scope, key[1]), Need()) | need
        found = ROWS.rows(needs, read, latest_event_id)

        def row(claim_id: int):
            item = found.get(("claim", *scope, claim_id))
            return None if item is None else item[1]

        parts = []
        for key in keys:
            if key[0] == "claim" and row(key[1]) is not None:  # one gone, or out of scope, sends nothing
                parts.append(row(key[1])[0])
                self.sent[key] = max(self.sent.get(key, 0), found[("claim", *scope, key[1])][0])
        members = [k for k in keys if k[0] == "group-of" and row(k[1]) is not None and row(k[1])[1] is not None]
        if ("groups",) in keys or members:
            # The group table whole (at most 50 rows): new groups appear, released ones go, each row's state moves.
            need = Need()
            for key in [("groups",), *members]:
                need = need | keys.get(key, Need())
            parts.append(ROWS.one(("groups", *scope), need, lambda: presenters.render_claim_groups_section(
                None, claims=in_scope(scope, NodeClaim.objects.all())), latest_event_id)[1])
        new = [k[1] for k in keys if k[0] == "new" and k[1] not in self.visible and row(k[1]) is not None]
        if new and self.query.get("page", "1") == "1":
            data = QueryDict(mutable=True)
            data.update(self.query)
            # The page's own filters, on the claims this scope sees: a claim that does not match stays off.
            matching = NodeClaimFilterSet(data, queryset=in_scope(scope, NodeClaim.objects.filter(pk__in=new))).qs
            added = list(matching.order_by("-created_at", "-pk").values_list("pk", flat=True))
            if added:
                self.visible.update(added)
                rows = "".join(row(pk)[0] for pk in added)
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
