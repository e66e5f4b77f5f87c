"""What a host's move means for the claim it serves: one table of reactions, keyed by (from, to)."""
# What a host's move means for the claim it serves: one table of reactions, keyed by (from, to), called by
# hosts_transition_batch inside the transaction that moves the host (hosts.lifecycle.on_host_transition). Hosts know
# nothing of claims; everything a host's life cycle does to a claim is here.
from core.tasks import task_send_on_commit
from hosts.choices import HostState as S
from hosts.lifecycle import HostsMoved

from . import task_names
from .allocation import allocate_soon
from .choices import ClaimPhase as P
from .models import NodeClaim
from .phases import claim_host_lost, claims_transition
from .restore import claims_adopted

ANY = "*"


def _claims(moved: HostsMoved) -> list[NodeClaim]:
    return list(NodeClaim.objects.select_related("tenant").filter(host_id__in=moved.host_ids).order_by("pk"))


def claim_available(moved: HostsMoved) -> None:
    """The provision flow finished: the node joined and is Ready."""
    for claim in _claims(moved):
        if claim.phase == P.JOINING:
            claims_transition(claims=[claim], to_phase=P.AVAILABLE, actor=moved.actor, reason="Joined",
                              message=f"node {claim.node_name} is Ready in {claim.tenant.name}")


def claim_lost_its_host(moved: HostsMoved) -> None:
    """The host failed while serving the claim (a step, a deadline): the claim takes another host, or fails
    (its own fault: `claim_reason` on the move; too many hosts failed it). A claim being released just
    finishes its release (its host goes on to be erased)."""
    for claim in _claims(moved):
        if claim.phase == P.RELEASED or (claim.phase == P.RELEASING and moved.to_state == S.DEPROVISIONING):
            continue  # a release moved the host on: the deprovision flow's end releases the claim
        # A raced boot (hosts/boot/ramdisk.py) is the network's doing, not the host's: the claim's tries are not spent.
        claim_host_lost(claim=claim, reason=f"host {moved.names[claim.host_id]}: {moved.reason}", actor=moved.actor,
                        claim_reason=moved.data.get("claim_reason") or "", counted=not moved.data.get("boot_raced"))


def claim_host_unhealthy(moved: HostsMoved) -> None:
    """The host failed its handover health check (hosts.flows: to repair with the run as evidence): the claim
    takes another host at once; the failure is the host's, not counted against the claim's tries."""
    for claim in _claims(moved):
        claim_host_lost(claim=claim, reason=f"host {moved.names[claim.host_id]}: {moved.reason}", actor=moved.actor,
                        counted=False)


def claim_released(moved: HostsMoved) -> None:
    """The release is over: the host was erased (and is back in the pool, or in repair with the evidence), or
    it failed on the way (error). The claim is Released; a join token its release could not delete is left to
    a task that retries."""
    for claim in _claims(moved):
        if claim.phase != P.RELEASING:
            continue
        name = moved.names[claim.host_id]
        if moved.to_state == S.AVAILABLE:
            message = f"{name} cleaned and back in the pool"
        elif moved.to_state == S.REPAIR:
            message = f"{name} now in repair: {moved.reason}"
        else:
            message = f"released; its host failed: {moved.reason}"
        token_id = claim.bootstrap_token_id
        claims_transition(claims=[claim], to_phase=P.RELEASED, actor=moved.actor, reason="Released",
                          message=message, fields={"host": None, "ip_address": None, "bootstrap_token_id": ""})
        if token_id:
            task_send_on_commit(task_names.REVOKE_JOIN_TOKEN, claim_id=claim.pk, token_id=token_id)


def claim_found_running(moved: HostsMoved) -> None:
    """The world reconcile after a restore found the host serving its claim's node (claims/restore.py)."""
    claims_adopted(host_ids=moved.host_ids, actor=moved.actor, reason=moved.reason)


def claim_lost_after_restore(moved: HostsMoved) -> None:
    """The world reconcile found the host not serving its claim's node (released through the gate, or in maintenance
    with another node): the claim takes another host, without spending a try. A release goes on."""
    for claim in _claims(moved):
        if claim.phase in (P.RELEASED, P.RELEASING):
            continue
        reason = f"host {moved.names[claim.host_id]}: {moved.reason}"
        if claim.phase == P.AVAILABLE:  # its node is gone: Failed on the way back to Pending (the phases' table)
            claims_transition(claims=[claim], to_phase=P.FAILED, actor=moved.actor, reason="NodeNotFound",
                              message=reason)
            claim.phase = P.FAILED
        claim_host_lost(claim=claim, reason=reason, actor=moved.actor, counted=False)


def claim_kept_while_held(moved: HostsMoved) -> None:
    """Held after a restore (hosts/restore.py): the claim stays as the database says until the world reconcile read
    the host; what it finds decides (the reactions to moves out of held, below)."""


def host_freed(moved: HostsMoved) -> None:
    allocate_soon()


REACTIONS: dict[tuple[str, str], list] = {
    (S.PROVISIONING, S.PROVISIONED): [claim_available],
    # Lost while provisioning: to error, or to be cleaned first (the disk may hold half an image).
    (S.PROVISIONING, S.ERROR): [claim_lost_its_host],
    (S.PROVISIONING, S.DEPROVISIONING): [claim_lost_its_host],  # a release moves its claim to Releasing first
    (S.PROVISIONING, S.REPAIR): [claim_host_unhealthy],
    (S.PROVISIONED, S.ERROR): [claim_lost_its_host],
    (S.DEPROVISIONING, S.AVAILABLE): [claim_released],
    (S.DEPROVISIONING, S.REPAIR): [claim_released],
    (S.DEPROVISIONING, S.ERROR): [claim_released],
    # After a restore (hosts/restore.py): held, the claim waits; then what the world reconcile found.
    (S.PROVISIONING, S.HELD): [claim_kept_while_held],
    (S.PROVISIONED, S.HELD): [claim_kept_while_held],
    (S.DEPROVISIONING, S.HELD): [claim_kept_while_held],
    (S.HELD, S.PROVISIONED): [claim_found_running],
    (S.HELD, S.DEPROVISIONING): [claim_lost_after_restore],
    (S.HELD, S.MAINTENANCE): [claim_lost_after_restore],
    (S.HELD, S.ERROR): [claim_lost_after_restore],
    (ANY, S.AVAILABLE): [host_freed],
}


def react(moved: HostsMoved) -> None:
    for key in ((moved.from_state, moved.to_state), (ANY, moved.to_state)):
        for reaction in REACTIONS.get(key, ()):
            reaction(moved)
