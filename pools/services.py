"""Every write to tenants, their members and their pools. Pool changes trigger a reconcile on commit."""
from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from core.errors import InUse, StaleVersion
from core.transactions import retry_on_deadlock
from events.choices import EventKind, ObjectType
from events.services import event_record, object_delete, object_update

from .choices import PoolKind
from .models import NodePool, NodeProvider, NodeType, Tenant, TenantMembership
from .usage import claims_unreleased


@dataclass
class PoolSpec:
    """One pool as a tenant's vcluster.yaml declares it."""

    name: str
    provider: NodeProvider
    kind: str = PoolKind.STATIC
    values: dict = field(default_factory=dict)  # model field → value


@dataclass
class PrivateNodesResult:
    pools: dict[str, tuple[bool, dict]] = field(default_factory=dict)  # name → (created, changes)
    deleted: list[str] = field(default_factory=list)


def tenant_check_quota(*, tenant: Tenant, quantities: dict[str, int]) -> None:
    """Static quantities may not add up past the tenant's node quota; but a change that does not add to what
    the tenant's static pools ask for now is always allowed: one that moves toward a quota lowered below use
    (3 → 1 while 3 are used: 2 → 1 is allowed, 2 → 3 is not). `quantities`: every static pool as it would be;
    what is asked for now is read from the database (the caller holds the tenant's lock)."""
    if tenant.quota_nodes is None:
        return
    total = sum(quantities.values())
    if total <= tenant.quota_nodes:
        return
    if tenant.pk and total <= sum(tenant_static_quantities(tenant=tenant).values()):
        return
    raise ValidationError(
        {"quantity": f"tenant {tenant.name} may have at most {tenant.quota_nodes} node(s); "
                     f"these pools ask for {total}"})


def tenant_quota_warning(*, tenant: Tenant, quota: int | None) -> str:
    """For the admin who sets a tenant's quota: "" when its static pools fit, else what a quota below current
    use means. Such a quota is saved (nothing is released); the pools may then shrink, not grow."""
    if quota is None or not tenant.pk:
        return ""
    used = sum(tenant_static_quantities(tenant=tenant).values())
    if used <= quota:
        return ""
    return (f"tenant {tenant.name}'s pools ask for {used} node(s), more than its new quota of {quota}: nothing is "
            f"released; its pools may shrink, but not grow, until they fit")


@retry_on_deadlock()
@transaction.atomic
def tenant_private_nodes_apply(*, tenant: Tenant, enabled: bool, provider_properties: dict[str, dict],
                               pools: list[PoolSpec], actor: str) -> PrivateNodesResult:
    """Make the tenant's pools exactly those declared (its vcluster.yaml is the whole list):
    create and update pools, delete the ones no longer declared (their claims are released)."""
    result = PrivateNodesResult()
    # The lock order (vmetal_console/transactions.py): the tenant, then its pools by id.
    Tenant.objects.select_for_update(no_key=True).filter(pk=tenant.pk).first()
    existing = {p.name: p for p in tenant.pools.select_for_update(no_key=True, of=("self",))
                .select_related("provider").order_by("pk")}
    for pool in existing.values():
        pool.tenant = tenant
    inherited = {name: pool.properties for name, pool in existing.items()}  # what their claims are made from
    object_update(tenant, {"private_nodes_enabled": enabled, "provider_properties": provider_properties},
                  actor=actor, object_type=ObjectType.TENANT, tenant=tenant)
    declared = {spec.name for spec in pools}
    tenant_check_quota(tenant=tenant, quantities={s.name: s.values.get("quantity") or 0 for s in pools
                                                  if s.kind == PoolKind.STATIC})
    changed_ids = []
    for spec in pools:
        pool = existing.get(spec.name) or NodePool(tenant=tenant, name=spec.name)
        values = {"provider": spec.provider, "kind": spec.kind, **_pool_defaults(), **spec.values}
        created, changes = object_update(pool, values, actor=actor, object_type=ObjectType.POOL, tenant=tenant)
        if not created and spec.name in inherited and inherited[spec.name] != pool.properties:
            # Its autoNodes entry's properties flow into its claims (the OS image): a change of the pool.
            before, after = inherited[spec.name], pool.properties
            event_record(kind=EventKind.CHANGE, object_type=ObjectType.POOL, object_name=str(pool), actor=actor,
                         tenant=tenant, message=f"properties: {before} → {after}",
                         data={"properties": [before, after]})
            changes = {**changes, "properties": (before, after)}
        result.pools[spec.name] = (created, changes)
        if changes and not created:
            NodePool.objects.filter(pk=pool.pk).update(version=F("version") + 1)
        if created or changes:
            changed_ids.append(pool.pk)
    for name, pool in existing.items():
        if name not in declared:
            pool_delete(pool=pool, actor=actor)
            result.deleted.append(name)
    if changed_ids:
        pools_changed(pool_ids=changed_ids)
    return result


def _pool_defaults() -> dict:
    return {"quantity": None, "node_type_selector": [], "node_labels": {}, "taints": [],
            "termination_grace_period": "", "profile": "", "limits": {}, "disruption": {},
            "expire_after": "", "weight": None, "topology": {}, "group": {}}


# One way to create and to change a pool, for the admin, the API and the console. The lock order
# (core/transactions.py): the tenant FOR NO KEY UPDATE, then the pool. The tenant first: two pools of one
# tenant changed at once must not both pass the quota check. FOR NO KEY UPDATE: a reconcile that holds the
# pool still inserts the tenant's claims (its foreign key check takes FOR KEY SHARE), so it finishes instead
# of waiting for us while we wait for it.

@retry_on_deadlock()
@transaction.atomic
def pool_create(*, tenant: Tenant, values: dict, actor: str) -> NodePool:
    """A new pool of `tenant` (values: its model fields). Validated by NodePool.clean(); a static quantity stays
    within the tenant's quota; recorded in the Event log and reconciled on commit."""
    tenant = Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
    values = {name: value for name, value in values.items() if name != "tenant"}
    pool = NodePool(tenant=tenant)
    if values.get("kind", PoolKind.STATIC) == PoolKind.STATIC and isinstance(values.get("quantity"), int):
        others = tenant_static_quantities(tenant=tenant)
        tenant_check_quota(tenant=tenant, quantities={**others, values.get("name", ""): values["quantity"]})
    object_update(pool, values, actor=actor, object_type=ObjectType.POOL, tenant=tenant)
    pools_changed(pool_ids=[pool.pk])
    return pool


@retry_on_deadlock()
@transaction.atomic
def pool_update(*, pool: NodePool, values: dict, actor: str, expected_version: int | None = None) -> NodePool:
    """Change a pool's fields (quantity included). A stale `expected_version` raises StaleVersion; a change
    of quantity or kind is checked against the tenant's quota (ValidationError on "quantity"); a change bumps
    the version, is recorded in the Event log and reconciled on commit. Nothing changes on a refusal."""
    tenant = Tenant.objects.select_for_update(no_key=True).get(pk=pool.tenant_id)
    locked = (NodePool.objects.select_for_update(no_key=True, of=("self",)).select_related("provider")
              .get(pk=pool.pk))
    locked.tenant = tenant
    if expected_version is not None and locked.version != expected_version:
        raise StaleVersion(f"pool {locked} changed meanwhile (version {locked.version}, not {expected_version})")
    if not values:
        return locked
    kind, quantity = values.get("kind", locked.kind), values.get("quantity", locked.quantity)
    if kind == PoolKind.STATIC and (kind != locked.kind or quantity != locked.quantity) and isinstance(quantity, int):
        others = tenant_static_quantities(tenant=tenant, exclude=locked.pk)
        tenant_check_quota(tenant=tenant, quantities={**others, locked.name: quantity})
    _, changes = object_update(locked, values, actor=actor, object_type=ObjectType.POOL, tenant=tenant)
    if changes:
        NodePool.objects.filter(pk=locked.pk).update(version=F("version") + 1)
        locked.version += 1
        pools_changed(pool_ids=[locked.pk])
    return locked


def pool_set_quantity(*, pool: NodePool, quantity: int, actor: str, expected_version: int | None = None) -> NodePool:
    """A static pool's quantity: pool_update of that one field."""
    return pool_update(pool=pool, values={"quantity": quantity}, actor=actor, expected_version=expected_version)


def tenant_static_quantities(*, tenant: Tenant, exclude: int | None = None) -> dict[str, int]:
    """{pool name: quantity} of the tenant's static pools (but `exclude`, a pool id): what its quota counts."""
    pools = tenant.pools.filter(kind=PoolKind.STATIC)
    if exclude is not None:
        pools = pools.exclude(pk=exclude)
    return {name: quantity or 0 for name, quantity in pools.values_list("name", "quantity")}


# What the apps built on pools do when a pool or a tenant goes. They register at start (claims: release a
# pool's claims before it goes; finish a tenant's deletion once every claim of it is released); pools know
# nothing of them. Both are called inside the deleting transaction.
POOL_DELETE_RECEIVERS: list[Callable[..., None]] = []  # fn(pool=, actor=), before the pool's row goes
TENANT_FINALIZERS: list[Callable[..., list[str]]] = []  # fn(tenant_ids=, actor=) → names of the tenants gone


def on_pool_delete(receiver: Callable[..., None]) -> None:
    if receiver not in POOL_DELETE_RECEIVERS:
        POOL_DELETE_RECEIVERS.append(receiver)


def on_tenant_finalize(finalizer: Callable[..., list[str]]) -> None:
    if finalizer not in TENANT_FINALIZERS:
        TENANT_FINALIZERS.append(finalizer)


@retry_on_deadlock()
@transaction.atomic
def pool_delete(*, pool: NodePool, actor: str) -> None:
    NodePool.objects.select_for_update().filter(pk=pool.pk).first()  # the pool before its claims' hosts
    for receiver in POOL_DELETE_RECEIVERS:
        receiver(pool=pool, actor=actor)
    object_delete(pool, actor=actor, object_type=ObjectType.POOL, tenant=pool.tenant)


def node_type_use(node_type: NodeType) -> str:
    """What still uses a NodeType ("" when nothing): the claims of it that are not yet released."""
    names, total = claims_unreleased(node_type=node_type, first=4)
    if not names:
        return ""
    more = total - len(names)
    return (f"node type {node_type.name} is in use by claim(s) {', '.join(names)}" + (f" and {more} more" if more else "")
            + ": release them (shrink or delete their pools) first")


@transaction.atomic
def node_type_delete(*, node_type: NodeType, actor: str) -> None:
    """Delete a NodeType (the API, `manage.py delete -f`, apply's stale types and the admin call this). Refused
    with InUse while a claim that is not released was made for it; its row is locked while that is checked."""
    locked = NodeType.objects.select_for_update().filter(pk=node_type.pk).first()
    if locked is None:
        return
    use = node_type_use(locked)
    if use:
        raise InUse(use)
    object_delete(locked, actor=actor, object_type=ObjectType.NODETYPE)


@transaction.atomic
def tenant_set_api(*, tenant: Tenant, api_endpoint: str, kubeconfig: str, actor: str) -> Tenant:
    """Record where the tenant's Kubernetes API is and how to reach it (the kubeconfig is encrypted)."""
    _, changes = object_update(tenant, {"api_endpoint": api_endpoint, "kubeconfig": kubeconfig}, actor=actor,
                               object_type=ObjectType.TENANT, tenant=tenant if tenant.pk else None, self_link="tenant")
    if changes:  # claims waiting for a reachable tenant API try again now (claims.tenant_check)
        tenant_api_changed(tenant=tenant)
    return tenant


def tenant_api_changed(*, tenant: Tenant) -> None:
    """The tenant's API endpoint or credentials changed: its pools are reconciled once the change commits."""
    pools_changed(pool_ids=list(tenant.pools.values_list("pk", flat=True)))


@retry_on_deadlock()
@transaction.atomic
def tenant_delete(*, tenant: Tenant, actor: str) -> bool:
    """Delete a tenant the way Kubernetes deletes an owner: its pools go at once (their claims release:
    drain, delete the Node, clean the host), and the tenant itself once every claim is Released.
    True: the tenant is gone; False: it is being deleted. Asking again changes nothing."""
    locked = Tenant.objects.select_for_update(no_key=True).get(pk=tenant.pk)
    for pool in locked.pools.select_related("tenant", "provider").order_by("pk"):
        pool_delete(pool=pool, actor=actor)
    if locked.deleting_since is None:
        locked.deleting_since = timezone.now()
        locked.save(update_fields=["deleting_since", "updated_at"])
        releasing = claims_unreleased(tenant=locked, first=0)[1]
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.TENANT, object_name=locked.name, tenant=locked,
                     actor=actor, message=f"deletion requested; {releasing} claim(s) to release first" if releasing
                     else "deletion requested")
    gone = [name for finalize in TENANT_FINALIZERS for name in finalize(tenant_ids=[locked.pk], actor=actor)]
    return bool(gone)


@transaction.atomic
def membership_add(*, tenant: Tenant, user, actor: str, role: str = TenantMembership.Role.ADMIN) -> bool:
    """Make a user a member of a tenant: its admin (sees and changes its pools, claims and nodes) or its viewer
    (sees them). A member already with another role gets this one. False: already a member in this role."""
    if role not in TenantMembership.Role.values:
        raise ValidationError({"role": [f"{role!r}: expected one of {', '.join(TenantMembership.Role.values)}"]})
    membership = TenantMembership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    if membership is not None and membership.role == role:
        return False
    object_update(membership or TenantMembership(), {"tenant": tenant, "user": user, "role": role}, actor=actor,
                  object_type=ObjectType.MEMBERSHIP, tenant=tenant)
    return True


@transaction.atomic
def membership_remove(*, tenant: Tenant, user, actor: str) -> bool:
    """End a user's membership of a tenant. False: they were not a member."""
    membership = TenantMembership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    if membership is None:
        return False
    object_delete(membership, actor=actor, object_type=ObjectType.MEMBERSHIP, tenant=tenant)
    return True


# Who reconciles pools that changed: the claims app registers its sender at start (claims.reconcile); pools know
# nothing of claims. fn(pool_ids=[...]), called once the change commits.
POOLS_CHANGED_RECEIVERS: list[Callable[..., None]] = []


def on_pools_changed(receiver: Callable[..., None]) -> None:
    if receiver not in POOLS_CHANGED_RECEIVERS:
        POOLS_CHANGED_RECEIVERS.append(receiver)


def pools_changed(*, pool_ids: list[int]) -> None:
    """Pools changed (apply, console, API, a failed host): reconcile them as soon as the change commits,
    rather than at the next beat. Every change of one transaction goes out as one call of each receiver."""
    connection = transaction.get_connection()  # one per thread: changes of other threads stay apart
    if not hasattr(connection, "vmetal_changed_pools"):
        connection.vmetal_changed_pools = set()
    connection.vmetal_changed_pools.update(pool_ids)
    transaction.on_commit(lambda: _send_changed_pools(connection))


def _send_changed_pools(connection) -> None:
    if not connection.vmetal_changed_pools:
        return  # an earlier callback of the same commit sent them
    pool_ids = sorted(connection.vmetal_changed_pools)
    connection.vmetal_changed_pools.clear()
    for receiver in POOLS_CHANGED_RECEIVERS:
        receiver(pool_ids=pool_ids)
