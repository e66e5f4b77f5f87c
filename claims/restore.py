"""The world reconcile after a restore, and adopt: the console reads what the servers and the tenants really run before
it acts on a host, and takes in a server that already serves a tenant without re-imaging it."""
# After a restore every host is held (hosts/restore.py). The reconcile reads, outside any transaction, each held host's
# power state from its BMC and every tenant's nodes from its API, then decides per host, from what the restored database
# said (`held_from`) and what the world is:
#
#   the host serves a node (a node named as the host, in some tenant):
#     its database claim is of that tenant (and the node's vmetal.dev/claim label, if any, names it)
#                                                 → provisioned, the claim Available ("left alone" / "adopted")
#     the node's vmetal.dev/claim label names a claim of that tenant waiting for a host
#                                                 → provisioned, bound to that claim ("adopted")
#     the database was releasing it, for that claim → deprovisioning: the release goes on (drain, delete, erase)
#     otherwise                                   → maintenance, with the reason ("adopted: in maintenance")
#   it serves no node, and the database had it provisioning or provisioned
#                                                 → deprovisioning: released through the gate (erase, certificate,
#                                                   health); its claim takes another host
#   it serves no node, and the database had it servicing (a firmware update)
#                                                 → maintenance: the update is not resumed, a person checks
#   it serves no node otherwise                   → back to the state the database gave it (an idle check: available)
#   its BMC or a tenant's API did not answer      → still held; tried again after RESTORE_RETRY_S
#
# No power action is sent by the reconcile; the one the gate sends comes after the read, by the host's flow.
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from hosts.bmc.client import BMCError
from hosts.bmc.factory import host_bmc
from hosts.choices import HostState as S
from hosts.gate.archive import certificates_reimport
from hosts.lifecycle import CLAIMED, ConcurrentTransition
from hosts.models import BareMetalHost
from hosts.restore import epoch_settle, reconcile_request, world_check
from hosts.services import host_create, host_transition
from pools.models import Tenant

from .choices import ClaimPhase as P
from .models import NodeClaim
from .phases import claims_transition
from .tenant_api import TenantAPI, TenantAPIError

log = logging.getLogger(__name__)

ACTOR = "system:restore"
CLAIM_LABEL = "vmetal.dev/claim"
WAITING = (P.PENDING, P.PROVISIONING, P.JOINING)  # a claim that may take a host that already serves it


@dataclass
class World:
    """What the servers and the tenants really run, as read now."""
    power: dict[int, str] = field(default_factory=dict)  # host id → on / off
    power_errors: dict[int, str] = field(default_factory=dict)
    nodes: dict[str, tuple[Tenant, dict]] = field(default_factory=dict)  # node name → (its tenant, its labels)
    unread: dict[str, str] = field(default_factory=dict)  # tenant name → why its API was not read
    # Node names that more than one tenant shows: a tenant names its own nodes, so at most one of them is true.
    contested: dict[str, list[str]] = field(default_factory=dict)  # node name → the tenants that show it


@dataclass
class Decision:
    host: str
    database: str  # the state the restored database gave it
    power: str
    node: str  # "tenant/node", or ""
    verdict: str  # left alone, adopted, released through the gate, still held, in maintenance
    to_state: str | None  # None: still held
    reason: str
    bind: NodeClaim | None = None


def tenants_nodes(tenants: list[Tenant]) -> tuple[dict[str, tuple[Tenant, dict]], dict[str, str],
                                                  dict[str, list[str]]]:
    nodes, unread, shown_by = {}, {}, {}
    for tenant in tenants:
        if not tenant.kubeconfig:
            continue
        try:
            found = TenantAPI(tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S).list_nodes()
        except TenantAPIError as exc:
            unread[tenant.name] = str(exc)
            continue
        for name, labels in found.items():
            nodes.setdefault(name, (tenant, labels))
            shown_by.setdefault(name, []).append(tenant.name)
    return nodes, unread, {name: by for name, by in shown_by.items() if len(by) > 1}


def world_read(hosts: list[BareMetalHost]) -> World:
    world = World()
    world.nodes, world.unread, world.contested = tenants_nodes(list(Tenant.objects.order_by("name")))

    def power(host):
        try:
            with host_bmc(host, timeout=settings.BMC_CHECK_TIMEOUT_S, retries=0) as bmc:
                return bmc.power_state(), ""
        except BMCError as exc:
            return None, exc.message

    with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
        for host, (state, error) in zip(hosts, pool.map(power, hosts)):
            if state in ("on", "off"):
                world.power[host.pk] = state
            else:
                world.power_errors[host.pk] = error or f"the BMC reported power {state!r}"
    return world


def decide(host: BareMetalHost, world: World, claim: NodeClaim | None) -> Decision:
    """Where a held host goes, from what the database said and what the world is (the table above)."""
    was = host.held_from or S.AVAILABLE
    power = world.power.get(host.pk)
    found = world.nodes.get(host.name)
    node = f"{found[0].name}/{host.name}" if found else ""
    base = {"host": host.name, "database": was, "power": power or "unread", "node": node}
    if power is None:
        return Decision(**base, verdict="still held", to_state=None,
                        reason=f"its BMC did not answer: {world.power_errors.get(host.pk, '')}")
    if host.name in world.contested:
        return Decision(**base, verdict="adopted: in maintenance", to_state=S.MAINTENANCE,
                        reason=f"tenants {', '.join(world.contested[host.name])} each show a node {host.name}: at "
                               "most one of them is true; not powered, not re-imaged, bound to no claim; a person "
                               "decides")
    if found:
        tenant, labels = found
        named = labels.get(CLAIM_LABEL, "")
        # Its database claim's node: that tenant's, and not labelled for another claim (then it is not this claim's).
        own = claim is not None and claim.tenant_id == tenant.pk and named in ("", claim.name)
        if own and (was == S.DEPROVISIONING or claim.phase == P.RELEASING):
            return Decision(**base, verdict="release resumed", to_state=S.DEPROVISIONING,
                            reason=f"the database was releasing it and its claim {claim.name}; it still serves that "
                                   f"claim's node {node}")
        if own and claim.phase != P.RELEASED:
            verdict = "left alone" if was == S.PROVISIONED and claim.phase == P.AVAILABLE else "adopted"
            return Decision(**base, verdict=verdict, to_state=S.PROVISIONED,
                            reason=f"it serves node {node}, of its claim {claim.name}: not powered, not re-imaged")
        waiting = (NodeClaim.objects.filter(tenant=tenant, name=named, phase__in=WAITING)
                   .filter(host__isnull=True).first() if named else None)
        if waiting is not None and claim is None:
            return Decision(**base, verdict="adopted", to_state=S.PROVISIONED, bind=waiting,
                            reason=f"it serves node {node}, labelled for claim {named}: bound to it, not powered, "
                                   "not re-imaged")
        return Decision(**base, verdict="adopted: in maintenance", to_state=S.MAINTENANCE,
                        reason=f"it serves node {node} ({CLAIM_LABEL}={named or 'none'}), which no claim of the "
                               "restored database waiting for a host matches: not powered, not re-imaged; a person "
                               "decides (release the node, or adopt it with a claim)")
    if world.unread:
        unread = ", ".join(f"{name}: {why}" for name, why in sorted(world.unread.items()))
        return Decision(**base, verdict="still held", to_state=None,
                        reason=f"a tenant's API did not answer, and the host may serve a node there ({unread})")
    if was in CLAIMED:
        return Decision(**base, verdict="released through the gate", to_state=S.DEPROVISIONING,
                        reason=f"the database had it {was}, but it is {power} and serves no node: erased and checked "
                               "by the release gate before it is used again")
    if was == S.SERVICING:  # a firmware update is never resumed blindly: it may have flashed, or half
        return Decision(**base, verdict="left alone: in maintenance", to_state=S.MAINTENANCE,
                        reason="the database had a firmware update under way on it; not resumed: a person checks its "
                               "firmware, then turns maintenance off")
    back = S.AVAILABLE if was == S.CHECKING else was
    return Decision(**base, verdict="left alone", to_state=back,
                    reason=f"it serves no node, as the database says ({was}); power {power}")


@dataclass
class Reconcile:
    decisions: list[Decision] = field(default_factory=list)
    held_left: int = 0
    restored: bool = False
    reimported: int = 0
    refused: list[tuple[str, str]] = field(default_factory=list)


def world_reconcile(*, reimport: bool = True) -> Reconcile:
    """Hold every host if the database was restored, re-import the archived certificates, and let each held host go
    where its real state says. Idempotent; what stays held is tried again after RESTORE_RETRY_S."""
    result = Reconcile(restored=not world_check())
    if reimport:
        archive = certificates_reimport()
        result.reimported, result.refused = len(archive.imported), archive.refused
    epoch_settle()  # a first start with an archive: the world takes the database's epoch
    hosts = list(BareMetalHost.objects.filter(state=S.HELD).order_by("name"))
    if not hosts:
        return result
    world = world_read(hosts)
    claims = {c.host_id: c for c in NodeClaim.objects.select_related("tenant").filter(host__in=hosts)}
    for host in hosts:
        decision = decide(host, world, claims.get(host.pk))
        result.decisions.append(decision)
        if decision.to_state is None:
            result.held_left += 1
            continue
        try:
            _apply(host, decision)
        except ConcurrentTransition:
            continue  # another reconcile let it go first
    if result.held_left:
        reconcile_request(countdown=settings.RESTORE_RETRY_S, reimport=False)
    return result


@transaction.atomic
def _apply(host: BareMetalHost, decision: Decision) -> None:
    BareMetalHost.objects.filter(pk=host.pk).update(power_state=decision.power, held_from="")
    if decision.bind is not None:
        claim_bind(claim=decision.bind, host=host, actor=ACTOR, message=decision.reason)
    host_transition(host=host, to_state=decision.to_state, actor=ACTOR,
                    reason=f"reconciled after a restore: {decision.verdict}: {decision.reason}",
                    step="world_reconcile",
                    data={"reconcile": {"verdict": decision.verdict, "database": decision.database,
                                        "power": decision.power, "node": decision.node}})


def claim_bind(*, claim: NodeClaim, host: BareMetalHost, actor: str, message: str) -> None:
    """Bind a claim waiting for a host to a host that already serves its node (Pending → Provisioning); the host's move
    to provisioned then makes it Available (claims.reactions)."""
    if claim.phase == P.PENDING:
        claims_transition(claims=[claim], to_phase=P.PROVISIONING, actor=actor, reason="Adopted", message=message,
                          fields={"host": host, "host_name": host.name, "node_name": host.name,
                                  "attempts": claim.attempts + 1})
    else:
        NodeClaim.objects.filter(pk=claim.pk, host__isnull=True).update(host=host, host_name=host.name,
                                                                        node_name=host.name)


def claims_adopted(*, host_ids: list[int], actor: str, reason: str) -> None:
    """A host found serving its claim's node: the claim walks to Available (its phases, one Event each)."""
    order = [P.PENDING, P.PROVISIONING, P.JOINING, P.AVAILABLE]
    for claim in NodeClaim.objects.filter(host_id__in=host_ids).order_by("pk"):
        for phase in order[1:]:
            if claim.phase in order and order.index(claim.phase) < order.index(phase):
                claims_transition(claims=[claim], to_phase=phase, actor=actor, reason="Adopted",
                                  message=f"node {claim.node_name or claim.host_name} found running: {reason}",
                                  fields={"node_name": claim.node_name or claim.host_name})
                claim.phase = phase


# --- adopt: a server that already runs an OS ------------------------------------------------------------------

class AdoptRefused(Exception):
    """A server that cannot be adopted as asked; nothing was changed."""


def host_adopt(*, values: dict, actor: str, tenant: str = "", claim: str = "") -> BareMetalHost:
    """Register a server that already runs an OS (installed outside the console) as provisioned, without powering or
    re-imaging it, bound to the claim of the tenant node it serves (Ironic's adopt). Its BMC must answer with these
    credentials, show the boot MAC and the server on; a node named as the host must run in `tenant` (or in exactly one
    tenant, when none is named), and a claim of that tenant waiting for a host (`claim`, or the one the node's
    vmetal.dev/claim label names) takes it. Raises AdoptRefused or ValidationError; then nothing was changed. Its
    first release goes through the full release gate (erase, certificates, health)."""
    host = BareMetalHost(**values)
    try:
        host.full_clean()
    except ValidationError:
        raise
    try:
        with host_bmc(host, retries=0) as bmc:
            bmc.check(boot_mac=host.boot_mac)
            power = bmc.power_state()
    except BMCError as exc:
        raise AdoptRefused(f"BMC {host.bmc_address}: {exc.message}") from None
    if power != "on":
        raise AdoptRefused(f"{host.name} is powered {power}: nothing runs on it to adopt; register it instead "
                           "(it is inspected and cleaned)")
    tenants = list(Tenant.objects.order_by("name"))
    nodes, unread, contested = tenants_nodes(tenants)
    if host.name in contested:
        raise AdoptRefused(f"tenants {', '.join(contested[host.name])} each show a node {host.name}: at most one of "
                           "them runs on this server; the others must delete theirs first")
    found = nodes.get(host.name)
    if found is None and unread:
        raise AdoptRefused("cannot tell which tenant runs node " + host.name + ": "
                           + ", ".join(f"{name}: {why}" for name, why in sorted(unread.items())))
    if found is None:
        raise AdoptRefused(f"no tenant runs a node named {host.name}: a server that serves no tenant is registered "
                           "(apply), not adopted")
    owner, labels = found
    if tenant and owner.name != tenant:
        raise AdoptRefused(f"node {host.name} belongs to tenant {owner.name}, not {tenant}")
    name = claim or labels.get(CLAIM_LABEL, "")
    if not name:
        raise AdoptRefused(f"node {host.name} of tenant {owner.name} names no claim ({CLAIM_LABEL}): name the claim "
                           "it serves (--claim), one of that tenant's claims waiting for a host")
    target = NodeClaim.objects.filter(name=name).select_related("tenant").first()
    if target is None or target.tenant_id != owner.pk:
        raise AdoptRefused(f"claim {name} is not a claim of tenant {owner.name}")
    if target.host_id is not None or target.phase not in WAITING:
        raise AdoptRefused(f"claim {name} is {target.phase}" + (f" on {target.host_name}" if target.host_id else "")
                           + ": only a claim waiting for a host can take an adopted server")
    try:
        return _adopt(values=values, actor=actor, owner=owner, target=target)
    except IntegrityError:  # the same server adopted or registered at the same moment: the other one won
        raise AdoptRefused(f"a host named {host.name}, or with its BMC or boot MAC, was registered meanwhile") from None


@transaction.atomic
def _adopt(*, values: dict, actor: str, owner: Tenant, target: NodeClaim) -> BareMetalHost:
    name = values["name"]
    adopted = host_create(values=values, actor=actor, adopted=f"already serves node {name} of tenant {owner.name}")
    locked = NodeClaim.objects.select_for_update().get(pk=target.pk)
    if locked.host_id is not None or locked.phase not in WAITING:
        raise AdoptRefused(f"claim {target.name} took another host meanwhile")
    claim_bind(claim=locked, host=adopted, actor=actor, message=f"adopted {name}: its node already runs")
    claims_adopted(host_ids=[adopted.pk], actor=actor, reason=f"{name} adopted by {actor}")
    return adopted
