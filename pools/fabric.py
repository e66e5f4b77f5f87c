"""Fabric partitions: each tenant's VLAN id or InfiniBand partition key, from its environment's (or provider's)
range, taken when its first node is provisioned and kept until the tenant is deleted."""
# Fabric partitions: each tenant's VLAN id or InfiniBand partition key, taken from the range its NodeEnvironment
# (or, where the environment says nothing, its NodeProvider) configures, when its first node is provisioned, and
# kept until the tenant is deleted (the row goes with it). The console records, shows and exports them
# (`manage.py export`, the API); the network side's tool configures the switches.
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from events.choices import EventKind, ObjectType
from events.services import event_record

from .choices import FabricKind
from .models import FabricPartition, NodeEnvironment, NodeProvider, Tenant
from .validators import (
    FABRIC_RANGE_PROPERTIES,
    fabric_value_text,
    parse_fabric_range,
    parse_fabric_value,
)

# pg_advisory_xact_lock(FABRIC_LOCK, kind): one assignment at a time per kind, so that concurrent first nodes of
# different tenants do not all pick the same "lowest free" value (the unique constraint stays the guard).
FABRIC_LOCK = 0x66616272  # "fabr"
KIND_LOCK = {FabricKind.VLAN: 1, FabricKind.IB_PKEY: 2}
NOUN = {FabricKind.VLAN: "VLAN", FabricKind.IB_PKEY: "P_Key"}


class FabricRangeFull(Exception):
    """Every value of the configured range is another tenant's."""


@dataclass(frozen=True)
class FabricRange:
    kind: str
    first: int
    last: int
    source: str  # "NodeEnvironment p-default/servers"

    def __str__(self) -> str:
        return (f"{NOUN[self.kind]} range {fabric_value_text(self.kind, self.first)}-"
                f"{fabric_value_text(self.kind, self.last)} of {self.source}")

    def values(self) -> Iterable[int]:
        for value in range(self.first, self.last + 1):
            if self.kind != FabricKind.IB_PKEY or value & 0x7fff not in (0, 0x7fff):
                yield value


def fabric_environment(*, tenant_id: int, provider_id: int | None) -> NodeEnvironment | None:
    """The tenant's NodeEnvironment, else its provider's shared one: the environment that gives its nodes their
    addresses (claims.steps) gives them their fabric partition too."""
    return (NodeEnvironment.objects.filter(tenant_id=tenant_id).first()
            or NodeEnvironment.objects.filter(tenant__isnull=True, provider_id=provider_id).first())


def fabric_ranges(*, tenant_id: int, provider_id: int | None) -> list[FabricRange]:
    """The ranges a tenant's nodes take their partitions from (none configured: none, and nothing changes)."""
    env = fabric_environment(tenant_id=tenant_id, provider_id=provider_id)
    provider = NodeProvider.objects.filter(pk=provider_id).first() if provider_id else None
    ranges = []
    for kind, key in FABRIC_RANGE_PROPERTIES.items():
        if env is not None and env.properties.get(key):
            text, source = env.properties[key], f"NodeEnvironment {env}"
        elif provider is not None and provider.properties.get(key):
            text, source = provider.properties[key], f"NodeProvider {provider.name}"
        else:
            continue
        first, last = parse_fabric_range(kind, text)  # validated when saved
        ranges.append(FabricRange(kind=kind, first=first, last=last, source=source))
    return ranges


def _any_range_configured() -> bool:
    keys = list(FABRIC_RANGE_PROPERTIES.values())
    return (NodeEnvironment.objects.filter(properties__has_any_keys=keys).exists()
            or NodeProvider.objects.filter(properties__has_any_keys=keys).exists())


def _full_message(tenant_name: str, fabric_range: FabricRange, used: int) -> str:
    return (f"no free {NOUN[fabric_range.kind]} for tenant {tenant_name}: the {fabric_range} is full "
            f"({used} assigned to other tenants)")


def _free_value(fabric_range: FabricRange) -> tuple[int | None, int]:
    used = set(FabricPartition.objects.filter(kind=fabric_range.kind,
                                              value__range=(fabric_range.first, fabric_range.last))
               .values_list("value", flat=True))
    return next((v for v in fabric_range.values() if v not in used), None), len(used)


def fabric_partitions_assign(*, tenant: Tenant, provider_id: int | None, actor: str) -> list[FabricPartition]:
    """The tenant's partitions, one per configured range, taken now where it holds none (the lowest free
    value; an Event says which). Idempotent. Raises FabricRangeFull when a range has no value left."""
    partitions = []
    for fabric_range in fabric_ranges(tenant_id=tenant.pk, provider_id=provider_id):
        partitions.append(_assign(tenant, fabric_range, actor))
    return partitions


def _assign(tenant: Tenant, fabric_range: FabricRange, actor: str) -> FabricPartition:
    for _ in range(10):
        held = FabricPartition.objects.filter(tenant=tenant, kind=fabric_range.kind).first()
        if held is not None:
            return held
        try:
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                                       [FABRIC_LOCK, KIND_LOCK[fabric_range.kind]])
                    held = FabricPartition.objects.filter(tenant=tenant, kind=fabric_range.kind).first()
                    if held is not None:  # another node of this tenant took it while we waited
                        return held
                value, used = _free_value(fabric_range)
                if value is None:
                    raise FabricRangeFull(_full_message(tenant.name, fabric_range, used))
                partition = FabricPartition.objects.create(tenant=tenant, kind=fabric_range.kind, value=value,
                                                           source=str(fabric_range))
                event_record(kind=EventKind.CHANGE, object_type=ObjectType.TENANT, object_name=tenant.name,
                             tenant=tenant, actor=actor,
                             message=f"fabric partition {partition.label} assigned from the {fabric_range}",
                             data={"fabric_partition": {"kind": partition.kind, "value": value}})
                return partition
        except IntegrityError:
            continue  # taken outside the lock (another backend, a restore): look again
    raise FabricRangeFull(f"could not reserve a {NOUN[fabric_range.kind]} for tenant {tenant.name} in the "
                          f"{fabric_range}: too many concurrent assignments")


def fabric_partitions_release(*, tenant: Tenant, actor: str) -> list[str]:
    """The tenant is being deleted with no node left (claims.phases.tenants_finalize): its partitions are
    free again, each with an Event, so the network side can tell when a VLAN stopped being the tenant's."""
    freed = []
    for partition in FabricPartition.objects.filter(tenant=tenant).order_by("kind"):
        partition.delete()
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.TENANT, object_name=tenant.name, tenant=tenant,
                     actor=actor, message=f"fabric partition {partition.label} freed: the tenant is deleted",
                     data={"fabric_partition": {"kind": partition.kind, "value": partition.value}})
        freed.append(partition.label)
    return freed


def fabric_partition_waits(claims: Iterable) -> dict:
    """Claims that cannot be provisioned yet because their tenant holds no partition and the range it would
    take one from is full: {claim: why}. Read-only: the partition is taken by the provision flow."""
    claims = list(claims)
    if not claims or not _any_range_configured():
        return {}
    held = set(FabricPartition.objects.filter(tenant_id__in={c.tenant_id for c in claims})
               .values_list("tenant_id", "kind"))
    blocked = {}
    for tenant_id, provider_id in {(c.tenant_id, c.provider_id) for c in claims}:
        for fabric_range in fabric_ranges(tenant_id=tenant_id, provider_id=provider_id):
            if (tenant_id, fabric_range.kind) in held:
                continue
            value, used = _free_value(fabric_range)
            if value is None:
                name = Tenant.objects.filter(pk=tenant_id).values_list("name", flat=True).first()
                blocked[(tenant_id, provider_id)] = _full_message(name, fabric_range, used)
                break
    return {c: blocked[(c.tenant_id, c.provider_id)] for c in claims if (c.tenant_id, c.provider_id) in blocked}


# --- as export writes them and apply reads them back (manifests) --------------------------------------------

def fabric_partitions_text(partitions: Iterable[FabricPartition]) -> str:
    """`vlan=100,ib-pkey=0x8001`: a tenant's partitions in one annotation value, in a stable order."""
    return ",".join(f"{p.kind}={p.value_text}" for p in sorted(partitions, key=lambda p: p.kind))


def parse_fabric_partitions(text: str) -> dict[str, int]:
    wanted: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, sep, value = item.partition("=")
        kind = kind.strip()
        if not sep or kind not in FabricKind.values:
            raise ValidationError(f"{item!r}: expected kind=value with kind one of {', '.join(FabricKind.values)}, "
                                  "e.g. vlan=100,ib-pkey=0x8001")
        if kind in wanted:
            raise ValidationError(f"{kind} given twice")
        wanted[kind] = parse_fabric_value(kind, value)
    return wanted


def fabric_partitions_restore(*, tenant: Tenant, wanted: dict[str, int], actor: str) -> list[str]:
    """Apply's side (a restore of an export): the tenant holds these values. Missing ones are recorded; one it
    holds already is unchanged; a different value, or a value another tenant holds, is refused (a partition
    the switches carry does not move by apply). Returns kubectl-style lines."""
    lines = []
    for kind, value in sorted(wanted.items()):
        what = f"fabricpartition/{tenant.name}/{kind}"
        text = fabric_value_text(kind, value)
        held = FabricPartition.objects.filter(tenant=tenant, kind=kind).first()
        if held is not None:
            if held.value != value:
                raise ValidationError(f"tenant {tenant.name} holds {held.label}, not {text}: a tenant's fabric "
                                      "partition is not changed by apply (it is freed when the tenant is deleted)")
            lines.append(f"{what} unchanged")
            continue
        other = FabricPartition.objects.filter(kind=kind, value=value).select_related("tenant").first()
        if other is not None:
            raise ValidationError(f"{NOUN[kind]} {text} is tenant {other.tenant.name}'s")
        partition = FabricPartition.objects.create(tenant=tenant, kind=kind, value=value, source="apply")
        event_record(kind=EventKind.CHANGE, object_type=ObjectType.TENANT, object_name=tenant.name, tenant=tenant,
                     actor=actor, message=f"fabric partition {partition.label} recorded by apply",
                     data={"fabric_partition": {"kind": kind, "value": value}})
        lines.append(f"{what} created")
    return lines

