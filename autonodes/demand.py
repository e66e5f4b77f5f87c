"""The demand of a tenant's dynamic pools: its Pending pods, kept as PendingPod rows from what its pod watcher sees."""
# Written only by the tenant's watcher (autonodes.watcher), one pod at a time (`demand_observe`) and after each
# full list (`demand_resync`); decided on by autonodes.services, which owns the answer columns (status, claim,
# pool, reason, decided_at), but for one answer the watcher sees first: a launched pod that the scheduler turned away
# from its Ready node is new demand again (`turned_away`). Each write here is its own short transaction, never one
# around network I/O.
#
# `PendingPod.requests` holds what `fit.pod_requests` makes of the pod (containers summed, the largest init
# container, overhead), written back as Kubernetes quantities for people and the API: {"cpu": "500m", "memory":
# "16Gi", "nvidia.com/gpu": "8"} (memory and storage in the largest binary unit that divides them exactly, cpu in
# cores or millicores, counts as integers). `fit.quantities(row.requests)` reads them back (to float rounding), so
# `fit.Demand` of a row equals that of its pod.
from __future__ import annotations

import enum
import re
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim

from . import fit
from .choices import DemandStatus
from .models import PendingPod

# What a spec change is made of: a pod whose demand changed is decided again, the console's answer forgotten.
SPEC_FIELDS = ("requests", "node_selector", "node_affinity", "tolerations", "gang", "gang_min_member")

# Gangs (all-or-nothing pod groups), as the schedulers that place them mark their pods. The group's name, and its
# minMember where the pod itself carries it (the PodGroup object of scheduler-plugins and Volcano holds it in its
# spec, which the console does not read: then every Pending pod of the group is placed together).
GANG_NAME_LABELS = (
    "scheduling.x-k8s.io/pod-group",  # kubernetes-sigs/scheduler-plugins coscheduling (PodGroup CRD)
    "pod-group.scheduling.sigs.k8s.io/name",  # its lightweight coscheduling (labels only)
    "pod-group.scheduling.sigs.k8s.io",  # older spelling of the same
    "kueue.x-k8s.io/pod-group-name",  # Kueue plain-pod groups
)
GANG_NAME_ANNOTATIONS = ("scheduling.k8s.io/group-name",)  # Volcano
GANG_MIN_LABELS = ("pod-group.scheduling.sigs.k8s.io/min-available",)
GANG_MIN_ANNOTATIONS = ("kueue.x-k8s.io/pod-group-total-count", "pod-group.scheduling.sigs.k8s.io/min-available")


def pod_gang(meta: dict) -> tuple[str, int | None]:
    """("ns/group", minMember or None) of a pod's metadata; ("", None) when it belongs to no gang."""
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    name = next((str(labels[k]) for k in GANG_NAME_LABELS if labels.get(k)), "") or \
        next((str(annotations[k]) for k in GANG_NAME_ANNOTATIONS if annotations.get(k)), "")
    if not name:
        return "", None
    minimum = None
    for value in [labels.get(k) for k in GANG_MIN_LABELS] + [annotations.get(k) for k in GANG_MIN_ANNOTATIONS]:
        try:
            if value is not None and int(value) > 0:
                minimum = int(value)
                break
        except (TypeError, ValueError):
            continue
    return f"{meta.get('namespace') or 'default'}/{name}"[:317], minimum


class Seen(enum.Enum):
    """What one observation did to the demand."""

    NEW = "new"  # a pod became demand: opens or extends the tenant's batch
    CHANGED = "changed"  # a pending pod's spec changed: decided again, so it opens or extends the batch too
    TURNED_AWAY = "turned-away"  # the scheduler gave its Ready node to other pods: decided again, as new demand
    SAME = "same"  # still pending as before (its scheduler message may have changed)
    GONE = "gone"  # no longer demand: bound, running, deleted, or schedulable again
    IGNORED = "ignored"  # never demand (scheduled, a DaemonSet's pod) and no row to remove

    @property
    def is_new_demand(self) -> bool:
        return self in (Seen.NEW, Seen.CHANGED, Seen.TURNED_AWAY)


# A scheduler message read this long after the pod's node was Ready has seen that node: one read sooner may be the
# message of before it (the watch's latency), about the nodes that were there then.
SEEN_READY_AFTER = timedelta(seconds=5)
_NONE_AVAILABLE = re.compile(r"0/([1-9]\d*) nodes are available: (.*?)\.?(?: preemption:.*)?", re.S)
_NO_ROOM = re.compile(r"\d+ (?:Insufficient \S+|Too many pods)")


def turned_away(message: str) -> bool:
    """Whether kube-scheduler's message says that every node lacked room for the pod ("0/4 nodes are available: 4
    Insufficient nvidia.com/gpu."): its node was given to other pods. A message that names a taint, an affinity or
    anything else does not count: it cannot tell which node it means (a Ready node still tainted not-ready, say,
    which would launch a second node for the pod)."""
    found = _NONE_AVAILABLE.fullmatch((message or "").strip())
    return bool(found) and all(_NO_ROOM.fullmatch(part.strip()) for part in found.group(2).split(", "))


def turned_away_from(pod: PendingPod, claim: NodeClaim | None) -> bool:
    """Whether the pod, launched on `claim`, was turned away from its Ready node: its scheduler message, read at
    least SEEN_READY_AFTER after the node was Ready, says every node lacked room."""
    return (claim is not None and claim.phase == ClaimPhase.AVAILABLE and claim.available_at is not None
            and pod.scheduler_message_at is not None
            and pod.scheduler_message_at >= claim.available_at + SEEN_READY_AFTER
            and turned_away(pod.scheduler_message))


BINARY_UNITS = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity_text(resource: str, value: float) -> str:
    """A parsed request as a quantity again: 17179869184 memory → "16Gi", 0.5 cpu → "500m", 8 GPUs → "8"."""
    if float(value).is_integer():
        number = int(value)
        if resource == "memory" or resource.endswith("storage") or resource.startswith("hugepages-"):
            for unit, size in BINARY_UNITS:
                if number and number % size == 0:
                    return f"{number // size}{unit}"
        return str(number)
    if float(value * 1000).is_integer() or abs(value * 1000 - round(value * 1000)) < 1e-6:
        return f"{round(value * 1000)}m"
    return repr(float(value))


def pod_fields(pod: dict) -> dict:
    """The PendingPod columns a pod dict gives (without tenant and answer)."""
    meta = pod.get("metadata") or {}
    demand = fit.Demand.of_pod(pod)
    refs = meta.get("ownerReferences") or []
    owner = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    message = next((c.get("message") or "" for c in (pod.get("status") or {}).get("conditions") or []
                    if c.get("type") == "PodScheduled"), "")
    gang, min_member = pod_gang(meta)
    return {
        "gang": gang,
        "gang_min_member": min_member,
        "namespace": meta.get("namespace") or "default",
        "name": meta.get("name") or "",
        "owner": f"{owner.get('kind')}/{owner.get('name')}"[:253] if owner else "",
        "requests": {key: quantity_text(key, value) for key, value in sorted(demand.requests.items())},
        "node_selector": demand.node_selector,
        "node_affinity": demand.node_affinity,
        "tolerations": demand.tolerations,
        "scheduler_message": message,
    }


def is_demand(pod: dict) -> bool:
    """A pod a dynamic pool could answer: unschedulable, and not a DaemonSet's (those follow nodes, they never
    call for one)."""
    return fit.is_unschedulable(pod) and not fit.is_daemonset_pod(pod)


def demand_observe(*, tenant_id: int, pod: dict, deleted: bool = False) -> Seen:
    """One pod as the stream or a list shows it: a PendingPod row while it is demand, none otherwise.

    An existing row keeps the console's answer (status, claim, pool, reason) unless the pod's spec changed;
    then it is new demand again. `deleted`: the pod is gone (a DELETED event)."""
    uid = (pod.get("metadata") or {}).get("uid")
    if not uid:
        return Seen.IGNORED
    if deleted or not is_demand(pod):
        removed, _ = PendingPod.objects.filter(tenant_id=tenant_id, uid=uid).delete()
        return Seen.GONE if removed else Seen.IGNORED
    fields = pod_fields(pod)
    now = timezone.now()
    with transaction.atomic():
        row = PendingPod.objects.select_for_update().filter(tenant_id=tenant_id, uid=uid).first()
        if row is None:
            PendingPod.objects.create(tenant_id=tenant_id, uid=uid, scheduler_message_at=now, **fields)
            return Seen.NEW
        changed = any(getattr(row, name) != fields[name] for name in SPEC_FIELDS)
        update = {name: value for name, value in fields.items() if getattr(row, name) != value}
        seen = Seen.CHANGED if changed else Seen.SAME
        if "scheduler_message" in update:
            update["scheduler_message_at"] = now
        if changed:  # decided again from scratch: the earlier answer was for another spec
            update.update(status=DemandStatus.NEW, claim=None, pool=None, reason="", decided_at=None)
        elif "scheduler_message" in update and row.status == DemandStatus.LAUNCHED and row.claim_id:
            claim = NodeClaim.objects.filter(pk=row.claim_id).only("name", "phase", "available_at", "node_name",
                                                                   "host_name").first()
            row.scheduler_message, row.scheduler_message_at = update["scheduler_message"], now
            if turned_away_from(row, claim):
                # Said at once on its pool's page, and decided again within seconds (the watcher's batch): not after
                # AUTONODES_BIND_GRACE_S of "node ready, binding" on a node that another pod holds.
                update.update(status=DemandStatus.NEW, claim=None, decided_at=None,
                              reason=f"its node {claim.node_name or claim.host_name or claim.name} was given to "
                                     f"other pods (the scheduler: {row.scheduler_message}); deciding again")
                seen = Seen.TURNED_AWAY
        if update:
            for name, value in update.items():
                setattr(row, name, value)
            row.save(update_fields=[*update, "updated_at"])
        return seen


def demand_resync(*, tenant_id: int, pods: list[dict]) -> tuple[int, int]:
    """After a full list: every pod of it observed, and the rows of pods the list no longer shows as demand
    deleted (they were bound, deleted or changed while no stream was open). Returns (new demand, rows now)."""
    new = 0
    keep = set()
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid or not is_demand(pod):
            continue
        keep.add(uid)
        if demand_observe(tenant_id=tenant_id, pod=pod).is_new_demand:
            new += 1
    PendingPod.objects.filter(tenant_id=tenant_id).exclude(uid__in=keep).delete()
    return new, len(keep)


def demand_uids(*, tenant_id: int) -> set[str]:
    return set(PendingPod.objects.filter(tenant_id=tenant_id).values_list("uid", flat=True))


def demand_forget(*, tenant_id: int) -> int:
    """The tenant is no longer watched (its last dynamic pool went): its demand would only go stale."""
    return PendingPod.objects.filter(tenant_id=tenant_id).delete()[0]
