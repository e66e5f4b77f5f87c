"""A claim's phase changes: the one transition service, release, a lost host, and what ends with them (a
group's member, a tenant being deleted, a pool that goes)."""
import copy
from collections import defaultdict
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from core.tasks import task_send_on_commit
from core.transitions import swap
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import events_record, object_delete, seconds_since
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import hosts_transition_batch
from pools.choices import GroupFailurePolicy
from pools.fabric import fabric_partitions_release
from pools.models import NodePool, Tenant
from pools.services import pools_changed

from . import task_names
from .choices import ClaimPhase as P
from .choices import ReleasePurpose
from .ipam import HOLDS_NO_HOST, addresses_free
from .lifecycle import LIVE, check_phase_change
from .models import ClaimGroup, NodeClaim
from .providers import MACHINE_HOLDERS
from .selectors import domain_name
from .tenant_check import WAIT_REASON as TENANT_API_WAIT

# Timestamps a phase sets (and, going back to Pending, clears).
PHASE_TIMESTAMPS = {P.PROVISIONING: ("scheduled_at",), P.JOINING: ("provisioned_at",),
                    P.AVAILABLE: ("joined_at", "available_at"), P.RELEASED: ("released_at",)}


# Who hears that claims ended (Failed or Released), inside the transaction that ends them: apps built on claims
# register at start (autonodes: the Pending pods a dynamic pool's claim was launched for go back to its demand);
# claims know nothing of them. fn(claims=[NodeClaim], to_phase=, actor=).
CLAIM_END_RECEIVERS: list = []
ENDED = frozenset({P.FAILED, P.RELEASED})


def on_claim_end(receiver) -> None:
    if receiver not in CLAIM_END_RECEIVERS:
        CLAIM_END_RECEIVERS.append(receiver)


@transaction.atomic
def claims_transition(*, claims: Iterable[NodeClaim], to_phase: str, actor: str, reason: str = "",
                      message: str | None = "", step: str = "", fields: dict | None = None,
                      event_messages: dict[int, str] | None = None) -> list[NodeClaim]:
    """Move claims that share one phase to `to_phase` (compare-and-swap), with one Event each.
    `message=None` keeps each claim's own message (set beforehand); `event_messages` words each Event."""
    claims = list(claims)
    if not claims:
        return claims
    from_phase = claims[0].phase
    if any(c.phase != from_phase for c in claims):
        raise ValueError("claims_transition moves claims that share one phase")
    for claim in claims:
        check_phase_change(from_phase, to_phase, claim.name)
    now = timezone.now()
    values = {"phase": to_phase, "phase_changed_at": now, "reason": reason, **(fields or {})}
    if message is not None:
        values["message"] = message
    for stamp in PHASE_TIMESTAMPS.get(to_phase, ()):
        values[stamp] = now
    if to_phase == P.PENDING:
        values.update(scheduled_at=None, provisioned_at=None, joined_at=None, available_at=None)
    ids = [c.pk for c in claims]
    swap(NodeClaim, ids=ids, field="phase", expected=from_phase, values=values, what="claim")
    if to_phase in HOLDS_NO_HOST:  # the binding ends: its address goes back, in this transaction (claims.ipam)
        addresses_free(claim_ids=ids)
    # Published on commit to "claims" and each claim's, tenant's and host's group: {"object": "claim",
    # "ids": [...], "from_state": ..., "to_state": ...}.
    events_record([
        Event(kind=EventKind.TRANSITION, object_type=ObjectType.CLAIM, object_name=c.name, claim_id=c.pk,
              tenant_id=c.tenant_id, host_id=c.host_id, from_state=from_phase, to_state=to_phase, step=step,
              message=(event_messages or {}).get(c.pk) or message or c.message or reason,
              duration_s=seconds_since(c.phase_changed_at, now), actor=actor)
        for c in claims
    ])
    for claim in claims:
        for key, value in values.items():
            if not hasattr(value, "resolve_expression"):  # F() expressions were applied in the database
                setattr(claim, key, value)
    if to_phase in ENDED:
        for receiver in CLAIM_END_RECEIVERS:
            receiver(claims=claims, to_phase=to_phase, actor=actor)
    tenants = sorted({c.tenant_id for c in claims})
    if to_phase == P.RELEASED:
        deleting = list(Tenant.objects.filter(pk__in=tenants, deleting_since__isnull=False).values_list("pk", flat=True))
        if deleting:  # a tenant being deleted goes once its last claim is released
            transaction.on_commit(lambda: tenants_finalize(tenant_ids=deleting, actor=actor))
    return claims


@transaction.atomic
def claims_release(*, claims: list[NodeClaim], actor: str, reason: str,
                   purpose: str = ReleasePurpose.FREE) -> None:
    """Give claims back. A claim without a host is released at once; one with a host goes to
    Releasing and its host to deprovisioning (drain, clean and return to the pool); one with an external provider's
    machine goes to Releasing and its machine is released (MACHINE_HOLDERS). `purpose` (ReleasePurpose) is kept on
    each claim for the release gate."""
    if purpose:
        NodeClaim.objects.filter(pk__in=[c.pk for c in claims]).update(release_purpose=purpose)
        for claim in claims:
            claim.release_purpose = purpose
    held = set().union(*(holders([c for c in claims if c.host_id is None]) for holders in MACHINE_HOLDERS))
    by_phase = defaultdict(list)
    for claim in claims:
        by_phase[(claim.phase, "host" if claim.host_id else "machine" if claim.pk in held else "")].append(claim)
    for (phase, holds), group in by_phase.items():
        if holds == "machine":
            claims_transition(claims=group, to_phase=P.RELEASING, actor=actor, reason="Releasing", message=reason)
            continue
        if not holds:
            claims_transition(claims=group, to_phase=P.RELEASED, actor=actor, reason="Released", message=reason)
            continue
        # The lock order (vmetal_console/transactions.py): hosts, by id, before their claims.
        hosts = list(BareMetalHost.objects.filter(pk__in=[c.host_id for c in group]).order_by("pk")
                     .select_for_update(no_key=True))
        claims_transition(claims=group, to_phase=P.RELEASING, actor=actor, reason="Releasing", message=reason)
        hosts_by_state = defaultdict(list)
        for host in hosts:
            hosts_by_state[host.state].append(host)
        tenant_of = {c.host_id: c.tenant_id for c in group}
        for state, same in hosts_by_state.items():
            if state in (HostState.PROVISIONING, HostState.PROVISIONED):
                hosts_transition_batch(hosts=same, to_state=HostState.DEPROVISIONING, actor=actor,
                                 reason=f"released by its claim: {reason}", tenant_ids=tenant_of)


@transaction.atomic
def claim_host_lost(*, claim: NodeClaim, reason: str, actor: str, claim_reason: str = "",
                    counted: bool = True) -> NodeClaim:
    """The claim's host failed (error, deadline): free the claim and try another host, until CLAIM_MAX_ATTEMPTS
    distinct hosts failed it. `claim_reason`: the claim itself caused the failure (its image): it fails with
    that reason, and the host is not counted against it. Its join token, if any, is deleted by a task."""
    cap = settings.CLAIM_MAX_ATTEMPTS
    # Not counted: the host failed its handover health check before anything was written (it is in repair); the
    # claim takes another host at once, without spending one of its CLAIM_MAX_ATTEMPTS.
    blamed = claim.host_name and not claim_reason and counted
    failed = [*claim.failed_hosts, claim.host_name] if blamed else claim.failed_hosts
    fields = {"host": None, "ip_address": None, "node_name": "", "failed_hosts": failed, "bootstrap_token_id": ""}
    if claim.phase == P.RELEASING:
        claims_transition(claims=[claim], to_phase=P.RELEASED, actor=actor, reason="Released",
                          message=f"released; its host failed: {reason}", fields=fields)
    elif claim_reason == TENANT_API_WAIT:
        # The tenant's API VIP is not reachable from the server's network: no host is blamed and no try is
        # spent; the claim waits (claims_allocate holds it) until the tenant fixes its endpoint or CA.
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason=claim_reason, message=reason,
                          fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    elif claim_reason:
        claims_transition(claims=[claim], to_phase=P.FAILED, actor=actor, reason=claim_reason, message=reason,
                          fields=fields)
    elif not counted:
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason="HostUnhealthy",
                          message=f"{reason}; trying another host", fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    elif len(set(failed)) >= cap:
        claims_transition(claims=[claim], to_phase=P.FAILED, actor=actor, reason="RetriesExhausted",
                          message=f"gave up after {claim.attempts} attempt(s); last: {reason}", fields=fields)
    else:
        claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason="HostFailed",
                          message=f"{reason}; trying another host ({len(set(failed))} of {cap} failed it)",
                          fields=fields)
        pools_changed(pool_ids=[claim.pool_id] if claim.pool_id else [])
    if claim.group_id and not claim_reason and claim.phase != P.RELEASED:
        _group_member_lost(claim, reason)
    token_id = claim.bootstrap_token_id
    if token_id:  # network I/O: after commit, in a worker
        task_send_on_commit(task_names.REVOKE_JOIN_TOKEN, claim_id=claim.pk, token_id=token_id)
    claim.host = None
    return claim


def _group_member_lost(claim: NodeClaim, reason: str) -> None:
    """A member of a placed group lost its host: its group's policy decides. Replace: the member waits for a
    host of the group's rail group (the allocator). ReleaseGroup: a task releases every member and places the
    group again (after this commit: it locks the group, then its hosts; this transaction holds one of them)."""
    group = ClaimGroup.objects.filter(pk=claim.group_id, placed_at__isnull=False).first()
    if group is None:
        return
    where = domain_name(tuple(group.shares), group.domain())
    if claim.phase == P.FAILED:  # too many hosts failed it: nothing replaces it (delete it to try again)
        message = f"member {claim.name} failed for good ({reason}); the rest of the group stays"
    elif group.on_member_failure == GroupFailurePolicy.RELEASE_GROUP:
        message = f"member {claim.name} failed ({reason}): the group is released and placed again"
        task_send_on_commit(task_names.PLACE_GROUP_AGAIN, group_id=group.pk, placements=group.placements)
    else:
        message = f"member {claim.name} failed ({reason}): replacing it from {where}"
    # After commit: this runs under the failing host's lock, and whoever releases the group (ReleaseGroup)
    # locks the group before its hosts.
    transaction.on_commit(lambda: ClaimGroup.objects.filter(pk=group.pk).update(reason="MemberFailed",
                                                                                message=message))


# --- what claims do when pools and tenants go (registered with pools.services when the app starts) ----------

def pool_claims_release(*, pool: NodePool, actor: str) -> None:
    """A pool goes: its live claims are released (drain, delete the Node, erase the host)."""
    claims_release(claims=list(pool.claims.filter(phase__in=list(LIVE))), actor=actor,
                   reason=f"pool {pool.name} deleted")


def tenants_finalize(*, tenant_ids: list[int] | None = None, actor: str = "system:reconciler") -> list[str]:
    """Delete the tenants being deleted whose claims are all Released (the claims go with them; the Event
    log keeps their story). Locked rows are skipped: whoever holds them finalises."""
    deleting = Tenant.objects.filter(deleting_since__isnull=False)
    if tenant_ids is not None:
        deleting = deleting.filter(pk__in=tenant_ids)
    if not deleting.exists():  # the common case: one cheap query
        return []
    holding = NodeClaim.objects.filter(tenant=OuterRef("pk")).exclude(phase=P.RELEASED)
    with transaction.atomic():
        gone = []
        for tenant in deleting.exclude(Exists(holding)).select_for_update(skip_locked=True):
            fabric_partitions_release(tenant=tenant, actor=actor)
            tenant.claims.all().delete()
            link = copy.copy(tenant)  # the Event names the tenant by id once the row is gone
            object_delete(tenant, actor=actor, object_type=ObjectType.TENANT, tenant=link)
            gone.append(link.name)
        return gone
