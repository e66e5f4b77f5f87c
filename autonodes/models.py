"""Auto Nodes: the demand dynamic pools answer (Pending pods), the watchers that see it, and each node's use."""
# Decisions themselves are Events (events.EventKind.DECISION, object_type pool): one log for audit, the pool
# page and the live views. Data of a decision Event: {"reason": DecisionReason, "pool": name, "pods": ["ns/name",
# ...], "claims": [names], "node_type": name, ...}.
from django.db import models

from .choices import DemandStatus, WatchState


class PendingPod(models.Model):
    """One pod of a tenant that the tenant's scheduler could not place (PodScheduled=False, Unschedulable).
    Written by the tenant's watcher (autonodes.watcher); decided on by autonodes.services."""

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.CASCADE, related_name="pending_pods")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64)
    owner = models.CharField(max_length=253, blank=True)  # "Job/train-7": the workload it belongs to
    # What it asks, as the pod spec says it (summed over containers, max with init containers).
    requests = models.JSONField(default=dict, blank=True)  # {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}
    node_selector = models.JSONField(default=dict, blank=True)
    # spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
    node_affinity = models.JSONField(default=list, blank=True)
    tolerations = models.JSONField(default=list, blank=True)
    scheduler_message = models.TextField(blank=True)  # the PodScheduled condition's message
    # When the watcher saw that message change: said after the pod's node was Ready, it tells whether the scheduler
    # turned the pod away from it (autonodes.demand.turned_away).
    scheduler_message_at = models.DateTimeField(null=True, blank=True)
    # A gang: the coscheduling PodGroup it belongs to ("ns/name", autonodes.demand.pod_gang) and the group's
    # minMember when the pod says it; its pods are placed all or nothing (autonodes.simulation).
    gang = models.CharField(max_length=317, blank=True)
    gang_min_member = models.PositiveIntegerField(null=True, blank=True)
    seen_at = models.DateTimeField(auto_now_add=True)  # first seen Pending
    updated_at = models.DateTimeField(auto_now=True)
    # The console's answer.
    status = models.CharField(max_length=16, choices=DemandStatus.choices, default=DemandStatus.NEW, db_index=True)
    claim = models.ForeignKey("claims.NodeClaim", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="pending_pods")  # the claim launched for it
    pool = models.ForeignKey("pools.NodePool", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="pending_pods")
    reason = models.TextField(blank=True)  # for people: why waiting / unservable
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "seen_at", "namespace", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "uid"], name="uniq_pending_pod")]
        indexes = [models.Index(fields=["tenant", "status"])]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def status_colour(self) -> str:
        return DemandStatus.colour(self.status)


class TenantWatch(models.Model):
    """The pod watcher of one tenant, as its supervisor last reported it: shown on the pages, read by decisions
    (a tenant whose API is down is not decided for)."""

    tenant = models.OneToOneField("pools.Tenant", on_delete=models.CASCADE, related_name="watch")
    state = models.CharField(max_length=16, choices=WatchState.choices, default=WatchState.STARTING)
    resource_version = models.CharField(max_length=64, blank=True)  # where a resumed watch starts
    connected_at = models.DateTimeField(null=True, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)  # the last failure, for people
    failures = models.PositiveIntegerField(default=0)  # in a row; drives the back-off
    retry_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # The lease: which watcher process holds this tenant's watch, until when (renewed by compare-and-swap;
    # autonodes/leases.py). Another process takes it once it has lapsed.
    # db_default: the previous release's code, running beside this one during an upgrade, inserts rows too.
    holder = models.CharField(max_length=128, blank=True, default="", db_default="")
    held_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"watch of {self.tenant_id}: {self.state}"

    @property
    def state_colour(self) -> str:
        return WatchState.colour(self.state)


class PodWatcher(models.Model):
    """A running `manage.py watch-pods` process, as long as it says it lives: the live ones share the tenants."""

    name = models.CharField(max_length=128, unique=True)  # host:pid:random, the holder its leases name
    shard = models.CharField(max_length=24, default="0/1")  # its --shard: processes of one shard share its tenants
    seen_until = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


class NodeUsage(models.Model):
    """What runs on the node of one claim of a dynamic pool, and what disruption plans for it."""

    claim = models.OneToOneField("claims.NodeClaim", on_delete=models.CASCADE, related_name="usage")
    pods = models.PositiveIntegerField(default=0)  # non-daemonset pods bound to the node
    requested = models.JSONField(default=dict, blank=True)  # their requests summed: {"cpu": "8", ...}
    empty_since = models.DateTimeField(null=True, blank=True)
    do_not_disrupt = models.BooleanField(default=False)  # a pod on it has karpenter.sh/do-not-disrupt: "true"
    # When its pods last changed (count or requests): an underutilized node is consolidated only once its pods
    # have been left alone for consolidateAfter, as Karpenter's Consolidatable condition.
    pods_changed_at = models.DateTimeField(null=True, blank=True)
    # What holds back a disruption due now ("budget:Empty", "do-not-disrupt", "min-lifetime"; "" when nothing):
    # a Blocked decision Event is written when this changes, not on every pass.
    blocked_by = models.CharField(max_length=100, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    # The next disruption decision, for people: "released at 12:13 unless a pod arrives".
    next_action = models.CharField(max_length=300, blank=True)
    next_action_at = models.DateTimeField(null=True, blank=True)
    # Expiry or drift: the claim that replaces this one (this one is released once its pods have moved).
    replacement = models.ForeignKey("claims.NodeClaim", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="replaces")

    def __str__(self) -> str:
        return f"usage of claim {self.claim_id}"


class PoolRoll(models.Model):
    """A static pool's roll of its drifted nodes (autonodes.roll), as its last pass left it: how far it is and
    what it waits for, for the tenant page."""

    pool = models.OneToOneField("pools.NodePool", on_delete=models.CASCADE, related_name="roll")
    started_at = models.DateTimeField(null=True, blank=True)  # None: no roll under way
    replaced = models.PositiveIntegerField(default=0)  # drifted nodes taken out so far in this roll
    total = models.PositiveIntegerField(default=0)  # replaced + drifted ones left
    # For people: "1 of 3 replaced, replacing one-x7k2q" / "held: the budget's window is closed until 02:00".
    status = models.CharField(max_length=300, blank=True)
    # What holds it ("budget:0", "do-not-disrupt:node", "replacement-failed", ...; "" when nothing): a Blocked
    # decision Event is written when this changes, not on every pass.
    held_by = models.CharField(max_length=200, blank=True)
    next_at = models.DateTimeField(null=True, blank=True)  # when it may go on (a window, a retry)
    retry_at = models.DateTimeField(null=True, blank=True)  # a failed replacement is made again from then
    failure = models.CharField(max_length=300, blank=True)  # what the last failed replacement said
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"roll of pool {self.pool_id}"
