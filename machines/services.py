"""Claims served by external providers: a machine per claim, made, followed, joined, powered and released through
its provider's kind (machines/kinds). Every provider call is network I/O: made outside any transaction, its outcome
written in a short one after it."""
import logging
from dataclasses import dataclass, field

import yaml
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from claims.choices import ClaimPhase as P
from claims.models import NodeClaim
from claims.phases import claims_transition
from claims.tenant_api import TenantAPI, TenantAPIError
from core.tasks import task_send, task_send_on_commit
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record
from pools.matching import requirements_match
from pools.models import NodeType, external_provider_q

from . import task_names
from .choices import DiskProof
from .choices import MachineState as M
from .kinds import Join, KindError, kind_of
from .models import Machine

log = logging.getLogger(__name__)

ACTOR = "system:machines"
# A claim's power actions (the API's words) and what a kind is asked.
POWER_ACTIONS = {"power-on": "on", "power-off": "off", "power-cycle": "reboot"}
LIVE_MACHINE = ~Q(state=M.GONE)


@dataclass
class FillResult:
    made: dict[str, str] = field(default_factory=dict)  # claim → machine's NodeType
    waiting: dict[str, str] = field(default_factory=dict)  # claim → why


def claims_fill(*, actor: str = ACTOR) -> FillResult:
    """Pending claims on external providers get a machine each: of the NodeType a dynamic pool's decision chose
    for the claim (or an earlier machine of it had), else of the cheapest NodeType of their provider whose
    properties match and whose capacity (the kind's, read outside the transaction) is not used up by live machines.
    The NodeType row is locked while its machines are counted, so two passes never overfill it."""
    result = FillResult()
    pending = list(NodeClaim.objects.filter(external_provider_q("provider__"), phase=P.PENDING, host__isnull=True, machine__isnull=True)
                   .select_related("provider").order_by("created_at", "pk"))
    if not pending:
        return result
    types = sorted(NodeType.objects.filter(provider__in={c.provider_id for c in pending}).select_related("provider"),
                   key=lambda t: (t.effective_cost(), t.name))
    capacity: dict[int, int | None] = {}
    for node_type in types:  # network I/O (a Metal3 cluster's hosts): before any lock
        try:
            capacity[node_type.pk] = kind_of(node_type.provider).capacity(node_type)
        except KindError as exc:
            capacity[node_type.pk] = 0
            log.warning("capacity of %s: %s", node_type.name, exc.message)
    for claim in pending:
        if claim.node_type_id:  # chosen already (a dynamic pool's decision, by cost and fit): that type only
            candidates = [t for t in types if t.pk == claim.node_type_id and t.provider_id == claim.provider_id]
        else:
            candidates = [t for t in types if t.provider_id == claim.provider_id
                          and requirements_match(claim.requirements, t.effective_properties())]
        if not candidates:
            result.waiting[claim.name] = "no NodeType of its provider matches its requirements"
            _wait(claim, "NoNodeType", result.waiting[claim.name])
            continue
        chosen = None
        for node_type in candidates:
            if _take(claim, node_type, capacity[node_type.pk], actor):
                chosen = node_type
                break
        if chosen:
            result.made[claim.name] = chosen.name
        else:
            limits = ", ".join(f"{t.name} {capacity[t.pk]}" for t in candidates)
            result.waiting[claim.name] = f"every matching NodeType is at its capacity ({limits})"
            _wait(claim, "NoCapacity", result.waiting[claim.name])
    return result


def _wait(claim: NodeClaim, reason: str, message: str) -> None:
    if (claim.reason, claim.message) != (reason, message):
        NodeClaim.objects.filter(pk=claim.pk, phase=P.PENDING).update(reason=reason, message=message)


@transaction.atomic
def _take(claim: NodeClaim, node_type: NodeType, capacity: int | None, actor: str) -> bool:
    NodeType.objects.select_for_update().filter(pk=node_type.pk).first()
    if capacity is not None:
        used = Machine.objects.filter(LIVE_MACHINE, node_type=node_type).aggregate(n=Count("pk"))["n"]
        if used >= capacity:
            return False
    fresh = NodeClaim.objects.select_for_update().filter(pk=claim.pk, phase=P.PENDING).first()
    if fresh is None or Machine.objects.filter(claim=fresh).exists():
        return False
    Machine.objects.create(claim=fresh, provider=node_type.provider, node_type=node_type,
                           kind=node_type.provider.kind, name=fresh.name)
    NodeClaim.objects.filter(pk=fresh.pk).update(node_type=node_type, node_name=fresh.name, attempts=fresh.attempts + 1)
    fresh.node_type, fresh.node_name = node_type, fresh.name
    claims_transition(claims=[fresh], to_phase=P.PROVISIONING, actor=actor, reason="Scheduled",
                      message=f"a {node_type.name} machine is being made by provider {node_type.provider.name}")
    transaction.on_commit(lambda: task_send(task_names.ADVANCE_MACHINE, machine_id=fresh.machine.pk))
    return True


def _tenant_api(claim: NodeClaim) -> TenantAPI:
    if not claim.tenant.kubeconfig:
        raise KindError(f"tenant {claim.tenant.name} has no API credentials (kubeconfig)", retry=False)
    return TenantAPI(claim.tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S)


def _join(claim: NodeClaim) -> Join:
    """A bootstrap token in the tenant's API and the cloud-init that joins with it, as the bare-metal seed does."""
    api = _tenant_api(claim)
    try:
        token = api.create_bootstrap_token(ttl_s=settings.BOOTSTRAP_TOKEN_TTL_S,
                                           description=f"vmetal join for {claim.name}")
        command, _ = api.join(claim.tenant.join_mode, claim.tenant.api_endpoint or api.server.split("://", 1)[-1],
                              token.token)
    except TenantAPIError as exc:
        raise KindError(f"tenant API: {exc}") from None
    except ValueError as exc:
        raise KindError(f"join command: {exc}", retry=False) from None
    node = claim.node_name or claim.name
    user_data = "#cloud-config\n" + yaml.safe_dump({"hostname": node, "runcmd": [command]}, sort_keys=False)
    return Join(user_data=user_data, node_name=node, token_id=token.id)


def machine_advance(*, machine_id: int, actor: str = ACTOR) -> str:
    """One look at a machine: make it, follow it to Running, see its node Ready and labelled (the claim
    Available), or release it. Idempotent: safe to run twice at once (each kind's calls are)."""
    machine = Machine.objects.select_related("claim__tenant", "claim__node_type", "provider", "node_type") \
        .filter(pk=machine_id).first()
    if machine is None or machine.state == M.GONE:
        return "gone"
    claim = machine.claim
    if claim.phase in (P.RELEASING, P.RELEASED, P.FAILED) or machine.state == M.DELETING:
        return _release(machine, actor)
    kind = kind_of(machine.provider)
    try:
        if not machine.memory.get("filled"):
            _fill(machine, kind)
        progress = kind.progress(machine)
    except KindError as exc:
        return _trouble(machine, exc, actor)
    if progress.state == M.FAILED:
        return _trouble(machine, KindError(progress.message or "the provider reports the machine failed",
                                           retry=False), actor)
    if progress.state == M.RUNNING and machine.state == M.CREATING:
        with transaction.atomic():
            moved = Machine.objects.filter(pk=machine.pk, state=M.CREATING).update(
                state=M.RUNNING, running_at=timezone.now(), message=progress.message, power="On")
            claim = NodeClaim.objects.select_for_update().get(pk=claim.pk)
            if moved and claim.phase == P.PROVISIONING:
                claims_transition(claims=[claim], to_phase=P.JOINING, actor=actor, reason="Provisioned",
                                  message=f"machine {machine.name} runs; waiting for node {claim.node_name}")
        machine.state = M.RUNNING
    elif progress.message != machine.message:
        Machine.objects.filter(pk=machine.pk).update(message=progress.message)
    if machine.state in (M.RUNNING, M.STOPPED) and claim.phase == P.JOINING:
        return _joined(machine, claim, actor)
    return machine.state


def _fill(machine: Machine, kind) -> None:
    join = _join(machine.claim)
    try:
        kind.fill(machine, join)
    except KindError:
        _forget_token(machine.claim, join.token_id)
        raise
    machine.memory = {**machine.memory, "filled": True}
    Machine.objects.filter(pk=machine.pk).update(made=machine.made, memory=machine.memory, name=machine.name,
                                                 namespace=machine.namespace, outputs=machine.outputs)
    NodeClaim.objects.filter(pk=machine.claim_id).update(bootstrap_token_id=join.token_id)


def _forget_token(claim: NodeClaim, token_id: str) -> None:
    try:
        _tenant_api(claim).delete_bootstrap_token(token_id)
    except (KindError, TenantAPIError) as exc:
        log.warning("join token %s of %s left to expire: %s", token_id, claim.name, exc)


def _joined(machine: Machine, claim: NodeClaim, actor: str) -> str:
    try:
        api = _tenant_api(claim)
        api.wait_node_ready(claim.node_name, deadline_s=0)
        labels = {**claim.node_labels, "vmetal.dev/claim": claim.name, "vmetal.dev/pool": claim.pool_name,
                  "vcluster.com/node-provider": machine.provider.name}
        if claim.node_type:
            labels["vcluster.com/node-type"] = claim.node_type.name
        api.set_node_labels_and_taints(claim.node_name, labels, claim.taints)
    except TenantAPIError as exc:
        if exc.status is None or exc.status >= 500:
            log.info("node %s of %s: %s", claim.node_name, claim.name, exc)
        return "joining"
    except KindError as exc:
        return _trouble(machine, exc, actor)
    claims_transition(claims=[claim], to_phase=P.AVAILABLE, actor=actor, reason="Joined",
                      message=f"node {claim.node_name} Ready on {machine.kind} machine {machine.name}")
    return "available"


def _trouble(machine: Machine, exc: KindError, actor: str) -> str:
    """A retryable problem is said on the machine and tried again at the next look. One that waiting does not
    mend makes the machine go (what was made of it is deleted); a claim not yet Available then gets another
    machine, until CLAIM_MAX_ATTEMPTS were made for it (_release), else it fails."""
    if exc.retry:
        Machine.objects.filter(pk=machine.pk).update(message=exc.message)
        return "retry"
    with transaction.atomic():
        claim = NodeClaim.objects.select_for_update().get(pk=machine.claim_id)
        again = claim.phase in (P.PROVISIONING, P.JOINING) and claim.attempts < settings.CLAIM_MAX_ATTEMPTS
        memory = {**machine.memory, "failed": exc.message} if again else machine.memory
        Machine.objects.filter(pk=machine.pk).exclude(state=M.GONE).update(state=M.DELETING, message=exc.message,
                                                                           memory=memory)
        if again:
            NodeClaim.objects.filter(pk=claim.pk).update(
                message=f"{machine.kind} machine {machine.name} failed ({exc.message}); it is deleted and another "
                        f"made (attempt {claim.attempts + 1} of {settings.CLAIM_MAX_ATTEMPTS})")
        elif claim.phase in (P.PROVISIONING, P.JOINING, P.AVAILABLE):
            claims_transition(claims=[claim], to_phase=P.FAILED, actor=actor, reason="ProviderFailed",
                              message=f"{machine.kind} machine {machine.name}: {exc.message}"
                                      + (f" (after {claim.attempts} attempts)" if claim.attempts > 1 else ""))
    task_send_on_commit(task_names.ADVANCE_MACHINE, machine_id=machine.pk)
    return "failed"


def _release(machine: Machine, actor: str) -> str:
    """Drain and delete the node in the tenant (a tenant API that fails is tried again at the next look), then every
    object the provider made, until the kind says they are gone."""
    claim = machine.claim
    if machine.state != M.DELETING:
        Machine.objects.filter(pk=machine.pk).update(state=M.DELETING, released_at=timezone.now())
        machine.state = M.DELETING
    if claim.node_name and claim.tenant.kubeconfig and not machine.memory.get("node_removed"):
        try:
            api = _tenant_api(claim)
            if api.node_exists(claim.node_name):
                api.drain(claim.node_name)
                api.delete_node(claim.node_name)
            if claim.bootstrap_token_id:
                api.delete_bootstrap_token(claim.bootstrap_token_id)
        except TenantAPIError as exc:
            Machine.objects.filter(pk=machine.pk).update(message=f"drain: {exc}")
            return "draining"
        machine.memory = {**machine.memory, "node_removed": True}
        Machine.objects.filter(pk=machine.pk).update(memory=machine.memory)
    kind = kind_of(machine.provider)
    try:
        gone = kind.release(machine)
    except KindError as exc:
        Machine.objects.filter(pk=machine.pk).update(message=f"release: {exc.message}")
        return "releasing"
    if not gone:
        Machine.objects.filter(pk=machine.pk).update(memory=machine.memory, message="waiting for its objects to go")
        return "releasing"
    with transaction.atomic():
        claim = NodeClaim.objects.select_for_update().get(pk=claim.pk)
        if claim.phase == P.RELEASING:
            claims_transition(claims=[claim], to_phase=P.RELEASED, actor=actor, reason="Released",
                              message=f"{machine.kind} machine {machine.name} is gone")
        elif machine.memory.get("failed") and claim.phase in (P.PROVISIONING, P.JOINING):
            # Its failure is in the claim's Event log; the claim is free for the next fill to make another.
            Machine.objects.filter(pk=machine.pk).delete()
            claims_transition(claims=[claim], to_phase=P.PENDING, actor=actor, reason="MachineFailed",
                              message=f"{machine.kind} machine {machine.name} failed: {machine.memory['failed']}; "
                                      f"it is gone, another is made",
                              fields={"node_name": "", "bootstrap_token_id": ""})
            return "gone"
        Machine.objects.filter(pk=machine.pk).update(state=M.GONE, gone_at=timezone.now(), memory=machine.memory,
                                                     outputs=machine.outputs, disk_proof=kind.disk_proof(machine),
                                                     message="")
    return "gone"


def machines_reconcile() -> dict:
    """The beat's pass: pending claims get machines; every machine not gone is looked at by its own task."""
    filled = claims_fill()
    ids = list(Machine.objects.filter(LIVE_MACHINE).values_list("pk", flat=True))
    for machine_id in ids:
        task_send(task_names.ADVANCE_MACHINE, machine_id=machine_id)
    return {"made": len(filled.made), "waiting": len(filled.waiting), "looked_at": len(ids)}


# --- release and power, called by the claims app through its registries ---------------------------------------

def machine_claims_release(claims: list[NodeClaim]) -> set[int]:
    """The claims among these that hold a machine not gone: they go to Releasing and their machines are released
    once the transaction commits."""
    held = dict(Machine.objects.filter(LIVE_MACHINE, claim__in=claims).values_list("claim_id", "pk"))
    for machine_id in held.values():
        task_send_on_commit(task_names.ADVANCE_MACHINE, machine_id=machine_id)
    return set(held)


def machine_power_request(*, claim: NodeClaim, action: str, actor: str, reason: str = "") -> bool:
    """A claim's power action for its machine: the request in the Event log now, sent by a worker on commit.
    False when the claim holds no machine that can be powered."""
    machine = Machine.objects.filter(claim=claim, state__in=(M.RUNNING, M.STOPPED)).first()
    if machine is None:
        return False
    reason = (reason or "").strip()
    with transaction.atomic():
        event = event_record(kind=EventKind.ACTION, object_type=ObjectType.CLAIM, object_name=claim.name,
                             claim_id=claim.pk, tenant_id=claim.tenant_id, step=action, actor=actor,
                             message=f"{action} of {machine.kind} machine {machine.name} requested"
                                     + (f": {reason}" if reason else ""),
                             data={"action": action, "machine": machine.name, "reason": reason})
        request_id = event.pk
        task_send_on_commit(task_names.POWER_MACHINE, machine_id=machine.pk, request_id=request_id)
    return True


def machine_power_send(*, machine_id: int, request_id: int) -> str:
    """The worker's half: the action through the machine's kind, the outcome in the Event log. A request already
    answered is not sent again."""
    machine = Machine.objects.select_related("claim", "provider").filter(pk=machine_id).first()
    request = Event.objects.filter(pk=request_id).first()
    if machine is None or request is None or Event.objects.filter(
            claim_id=machine.claim_id, data__request_id=request_id).exists():
        return "done"
    action = request.data["action"]
    try:
        kind_of(machine.provider).power(machine, POWER_ACTIONS[action])
        ok, message = True, f"{action} of {machine.kind} machine {machine.name} done"
    except KindError as exc:
        ok, message = False, f"{action} of {machine.kind} machine {machine.name} failed: {exc.message}"
    with transaction.atomic():
        if ok:  # what the kind learnt (a workspace's outputs); a reboot leaves the power as it was
            changed = {"outputs": machine.outputs, "memory": machine.memory}
            if action != "power-cycle":
                power = "On" if action == "power-on" else "Off"
                changed.update(power=power, state=M.RUNNING if power == "On" else M.STOPPED)
            Machine.objects.filter(pk=machine.pk, state__in=(M.RUNNING, M.STOPPED)).update(**changed)
        event_record(kind=EventKind.ACTION, object_type=ObjectType.CLAIM, object_name=machine.claim.name,
                     claim_id=machine.claim_id, tenant_id=machine.claim.tenant_id, step=action, actor=request.actor,
                     message=message, data={"request_id": request_id, "ok": ok, "machine": machine.name})
    return "ok" if ok else "failed"


def expected_proof(machine: Machine) -> str:
    try:
        return kind_of(machine.provider).disk_proof(machine)
    except (KindError, AttributeError):
        return ""


def machines_view(claim_ids) -> dict[int, dict]:
    """What each claim's machine is, for the API and the claim page (claims.providers.machines_of)."""
    found = {}
    for m in Machine.objects.filter(claim_id__in=list(claim_ids)).select_related("provider"):
        expected = "" if m.disk_proof else expected_proof(m)
        found[m.claim_id] = {
            "kind": m.kind, "name": m.name, "namespace": m.namespace, "state": m.state, "state_colour": m.state_colour,
            "message": m.message, "power": m.power, "made": m.made, "outputs": m.outputs,
            "created_at": m.created_at, "running_at": m.running_at, "gone_at": m.gone_at,
            "disk_proof": m.disk_proof, "disk_proof_text": DiskProof(m.disk_proof).label if m.disk_proof else "",
            "expected_proof": expected, "expected_proof_text": DiskProof(expected).label if expected else ""}
    return found
