"""Live views of a tenant's self-service page (its pools' claims by phase, its claims with progress, its nodes) and
of one pool's page (Auto Nodes: demand, decisions, nodes and their use)."""
import time

from autonodes.selectors import demand_signature
from claims.choices import ClaimPhase
from claims.lifecycle import LIVE
from claims.models import NodeClaim
from core.live_views import RESYNC, Need
from hosts.consumers import HostAwareConsumer
from pools.models import NodePool
from pools.selectors import pools_visible, tenants_visible


# The claims whose hosts a tenant's or a pool's page follows: every claim it lists (all but the Released).
FOLLOWED = [*LIVE, ClaimPhase.RELEASING]


class TenantConsumer(HostAwareConsumer):
    async def connect(self):
        self.tenant_id = int(self.scope["url_route"]["kwargs"]["tenant_id"])
        self.host_ids: set[int] = set()
        await super().connect()

    def authorize(self) -> bool:
        return tenants_visible(self.user).filter(pk=self.tenant_id).exists()

    def wanted_groups(self) -> set[str]:
        # Image write progress is published to each host's group: follow the hosts of the live claims.
        # Releasing claims' too: their drain, erase and checks show until they are Released.
        self.host_ids = set(NodeClaim.objects.filter(tenant_id=self.tenant_id, phase__in=FOLLOWED,
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


class PoolConsumer(HostAwareConsumer):
    """Live view of one pool's page: its decisions (Events of the tenant), its claims, its demand and its nodes'
    use (autonodes.live.demand_changed messages; PendingPod and NodeUsage rows carry no Event, so each re-sync
    also compares autonodes.selectors.demand_signature: the in-memory mode, and a message the layer dropped)."""

    async def connect(self):
        self.pool_id = int(self.scope["url_route"]["kwargs"]["pool_id"])
        self.tenant_id: int | None = None
        self.host_ids: set[int] = set()
        self.demand_seen = None
        await super().connect()

    def _pool(self):
        return pools_visible(self.user, NodePool.objects.select_related("tenant", "provider")).filter(
            pk=self.pool_id).first()

    def authorize(self) -> bool:
        pool = self._pool()
        if pool is None:
            return False
        self.tenant_id = pool.tenant_id
        return True

    def wanted_groups(self) -> set[str]:
        self.host_ids = set(NodeClaim.objects.filter(pool_id=self.pool_id, phase__in=FOLLOWED,
                                                     host__isnull=False).values_list("host_id", flat=True)[:500])
        return {f"tenant-{self.tenant_id}", *(f"host-{h}" for h in self.host_ids)}

    def keys_for_message(self, message: dict) -> set:
        kind = message.get("object")
        if kind == "claim":
            return {("pool",), RESYNC}  # a claim may have a new host to follow
        if kind == "pool":  # a decision, or the pool's settings changed
            return {("pool",)}
        if kind == "demand":  # the page shows the tenant's pods not yet given a pool too: any pool's change counts
            return {("pool",)}
        if kind == "host" and self.host_ids.intersection(message.get("ids", ())):
            return {("pool",)}
        return set()

    def events_in_scope(self, events):
        return events.filter(tenant_id=self.tenant_id)

    def keys_for_events(self, rows: list[dict]) -> set:
        return {("pool",)}

    def all_keys(self) -> set:
        return {("pool",)}

    def followed_hosts(self) -> set[int]:
        return self.host_ids

    def _frame(self, keys: dict, resync: bool):
        if resync:
            pool = self._pool()
            if pool is not None:
                signature = demand_signature(pool)
                if signature != self.demand_seen:  # the first re-sync too: a change since the page was read
                    keys.setdefault(("pool",), Need()).since = time.monotonic()
                self.demand_seen = signature
        return super()._frame(keys, resync)

    def render(self, keys: set) -> list[str]:
        from .views import render_pool_live

        pool = self._pool()
        if pool is None or ("pool",) not in keys:
            return []
        return render_pool_live(self.user, pool)
