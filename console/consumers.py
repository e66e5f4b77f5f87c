"""Live view of a tenant's self-service page: its pools' claims by phase, its claims with progress, its nodes."""
from claims.lifecycle import LIVE
from claims.models import NodeClaim
from core.live_views import RESYNC
from hosts.consumers import HostAwareConsumer
from pools.selectors import tenants_visible


class TenantConsumer(HostAwareConsumer):
    async def connect(self):
        self.tenant_id = int(self.scope["url_route"]["kwargs"]["tenant_id"])
        self.host_ids: set[int] = set()
        await super().connect()

    def authorize(self) -> bool:
        return tenants_visible(self.user).filter(pk=self.tenant_id).exists()

    def wanted_groups(self) -> set[str]:
        # Image write progress is published to each host's group: follow the hosts of the live claims.
        self.host_ids = set(NodeClaim.objects.filter(tenant_id=self.tenant_id, phase__in=list(LIVE),
                                                     host__isnull=False).values_list("host_id", flat=True)[:500])
        return {f"tenant-{self.tenant_id}", *(f"host-{h}" for h in self.host_ids)}

    def keys_for_message(self, message: dict) -> set:
        if message.get("object") == "claim":
            return {("tenant",), RESYNC}  # a claim may have a new host to follow
        if message.get("object") == "pool":  # a quantity changed elsewhere
            return {("tenant",)}
        if message.get("object") == "host" and self.host_ids.intersection(message.get("ids", ())):
            return {("tenant",)}
        return set()

    def events_in_scope(self, events):
        return events.filter(tenant_id=self.tenant_id)

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("tenant",)}

    def all_keys(self) -> set:
        return {("tenant",)}

    def followed_hosts(self) -> set[int]:
        return self.host_ids

    def render(self, keys: set) -> list[str]:
        from .views import render_tenant_live

        tenant = tenants_visible(self.user).filter(pk=self.tenant_id).first()
        if tenant is None:
            return []
        return render_tenant_live(self.user, tenant)
