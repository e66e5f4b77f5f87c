"""NodeClaim: one request for one node."""
from django.core.exceptions import ValidationError
from django.db import models

from core.crypto import EncryptedTextField
from core.labels import validate_labels, validate_taints
from pools.validators import check_taints, collect, validate_string_map

from .choices import ClaimPhase, ReleasePurpose


class ClaimGroup(models.Model):
    """N claims placed as one all-or-nothing group: every member's host in one rail group (or what the pool's
    `topology` names), all taken in one transaction or none (claims.allocation.claims_allocate)."""

    name = models.CharField(max_length=253, unique=True)  # "one-g7k2xq"
    tenant = models.ForeignKey("pools.Tenant", on_delete=models.CASCADE, related_name="claim_groups")
    pool = models.ForeignKey("pools.NodePool", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="claim_groups")
    pool_name = models.CharField(max_length=63)
    size = models.PositiveIntegerField()
    # Snapshot of the pool at creation: what each member shares (hosts.topology.Topology fields) and what a
    # member's failure does (pools.choices.GroupFailurePolicy).
    shares = models.JSONField(default=list)
    on_member_failure = models.CharField(max_length=16)
    # Where it was placed; empty while it waits.
    rack = models.CharField(max_length=100, blank=True)
    rail_group = models.CharField(max_length=100, blank=True)
    placed_at = models.DateTimeField(null=True, blank=True)
    placements = models.PositiveIntegerField(default=0)  # times placed (ReleaseGroup places it again)
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)  # why it waits, what its last member failure did
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "name"]

    def __str__(self) -> str:
        return self.name

    def domain(self) -> tuple[str, ...]:
        return tuple(getattr(self, key) for key in self.shares)


class NodeClaim(models.Model):
    name = models.CharField(max_length=253, unique=True)  # "one-vc4vs"
    namespace = models.CharField(max_length=63, default="p-default")
    tenant = models.ForeignKey("pools.Tenant", on_delete=models.PROTECT, related_name="claims")
    pool = models.ForeignKey("pools.NodePool", null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="claims")
    pool_name = models.CharField(max_length=63)
    # A member of an all-or-nothing group, or None.
    group = models.ForeignKey(ClaimGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="members")
    provider = models.ForeignKey("pools.NodeProvider", on_delete=models.PROTECT, related_name="claims")
    node_type = models.ForeignKey("pools.NodeType", null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="claims")
    # One host serves at most one claim: the unique constraint makes double allocation impossible.
    host = models.OneToOneField("hosts.BareMetalHost", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="claim")
    host_name = models.CharField(max_length=253, blank=True)  # kept after release, for the timeline
    node_name = models.CharField(max_length=253, blank=True)
    # The node's address on its NodeEnvironment's network (IPAM); empty when the network uses DHCP.
    environment = models.ForeignKey("pools.NodeEnvironment", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="claims")
    ip_address = models.GenericIPAddressField(null=True, blank=True)
    bootstrap_token_id = models.CharField(max_length=6, blank=True)  # to delete the join token on release
    # Written only by claims.phases.claims_transition.
    phase = models.CharField(max_length=16, choices=ClaimPhase.choices, default=ClaimPhase.PENDING, db_index=True)
    phase_changed_at = models.DateTimeField(auto_now_add=True)
    reason = models.CharField(max_length=64, blank=True)  # machine-readable: NoCapacity, NoNodeType, ...
    message = models.TextField(blank=True)  # for people
    attempts = models.PositiveIntegerField(default=0)  # hosts allocated to it so far
    # Set when it is released: why (claims.choices.ReleasePurpose), read by the release gate.
    release_purpose = models.CharField(max_length=16, choices=ReleasePurpose.choices, blank=True,
                                       default=ReleasePurpose.FREE)
    # Names of hosts that failed it: taken again only when no other can free up; CLAIM_MAX_ATTEMPTS distinct
    # ones fail the claim.
    failed_hosts = models.JSONField(default=list, blank=True)
    # Snapshot of the pool at creation: what this claim asks for.
    requirements = models.JSONField(default=list, blank=True)
    properties = models.JSONField(default=dict, blank=True)
    node_labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    provisioned_at = models.DateTimeField(null=True, blank=True)
    joined_at = models.DateTimeField(null=True, blank=True)
    available_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    # A dynamic pool's claim: when it is expected Available by (creation + its NodeType's measured launch p95,
    # clamped: claims.selectors.launch_deadlines), and when it was reported past that (once; it is not relaunched).
    launch_deadline_at = models.DateTimeField(null=True, blank=True)
    launch_reported_at = models.DateTimeField(null=True, blank=True)
    # What the node was made from beyond the pool's snapshot above, for drift (claims.drift): the OSImage written
    # ({"name", "url", "checksum"}, at its write) and its NodeType's properties (at allocation).
    image = models.JSONField(default=dict, blank=True)
    node_type_properties = models.JSONField(default=dict, blank=True)
    # Drifted: since when the node is no longer what its pool would make now, and what changed ("OS image a → b;
    # labels: team=ml added"); cleared when it is again. A static pool's roll replaces drifted nodes.
    drifted_since = models.DateTimeField(null=True, blank=True)
    drift = models.CharField(max_length=500, blank=True)
    # A replacement made first (a drift roll, a dynamic pool's expiry or drift): the claim it replaces, released
    # once this one is Available. While both are live, the pair counts once towards the pool's quantity.
    replacement_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="replacements")

    class Meta:
        ordering = ["-created_at", "name"]
        indexes = [models.Index(fields=["pool", "phase"]), models.Index(fields=["tenant", "phase"])]
        constraints = [models.UniqueConstraint(fields=["environment", "ip_address"], name="uniq_node_address",
                                               condition=models.Q(ip_address__isnull=False))]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        # What the node is labelled and tainted with in the tenant's cluster: as Kubernetes would take it.
        errors = {}
        collect(errors, "node_labels", lambda: validate_string_map(self.node_labels, "node labels"),
                lambda: validate_labels(self.node_labels))
        collect(errors, "taints", lambda: check_taints(self.taints), lambda: validate_taints(self.taints))
        if errors:
            raise ValidationError(errors)

    @property
    def phase_colour(self) -> str:
        return ClaimPhase.colour(self.phase)

    def conditions(self) -> list[dict]:
        """Scheduled / Provisioned / Joined, as vCluster reports them; Drifted as Karpenter's NodeClaims do."""
        conditions = [
            {"type": name, "status": "True" if at else "False", "lastTransitionTime": at.isoformat() if at else None}
            for name, at in (("Scheduled", self.scheduled_at), ("Provisioned", self.provisioned_at),
                             ("Joined", self.joined_at))
        ]
        if self.drifted_since:
            conditions.append({"type": "Drifted", "status": "True", "reason": "Drifted", "message": self.drift,
                               "lastTransitionTime": self.drifted_since.isoformat()})
        return conditions


class AddressAllocation(models.Model):
    """One address handed out from a NodeEnvironment's ranges (claims/ipam.py): taken in the transaction that
    binds its claim to a host, given back in the one that ends that binding. The row is the record a person
    audits; a row whose claim is gone or holds no host any more is a leak, which the periodic check frees."""

    environment = models.ForeignKey("pools.NodeEnvironment", on_delete=models.CASCADE, related_name="addresses")
    address = models.GenericIPAddressField()
    # Plain ids: a claim deleted behind the console's back (SQL, a tenant's cascade) leaves its row for the
    # leak check to find, rather than taking it along unseen.
    claim = models.ForeignKey(NodeClaim, null=True, on_delete=models.DO_NOTHING, db_constraint=False,
                              related_name="+")
    claim_name = models.CharField(max_length=253)
    host = models.ForeignKey("hosts.BareMetalHost", null=True, on_delete=models.SET_NULL, related_name="+")
    host_name = models.CharField(max_length=253)
    tenant = models.ForeignKey("pools.Tenant", null=True, on_delete=models.SET_NULL, related_name="+")
    since = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["environment_id", "since", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "address"], name="uniq_environment_address"),
            models.UniqueConstraint(fields=["claim"], name="uniq_address_per_claim"),
        ]

    def __str__(self) -> str:
        return f"{self.address} ({self.claim_name})"


class JoinToken(models.Model):
    """A bootstrap token the console made in a tenant's API for a person's "Join Node…" (the claims' own tokens
    live on their claims). Its secret is kept, encrypted, so that the same person's next click shows the same
    live token again rather than minting another; revoking deletes it in the tenant API."""

    tenant = models.ForeignKey("pools.Tenant", on_delete=models.CASCADE, related_name="join_tokens")
    token_id = models.CharField(max_length=6)
    secret = EncryptedTextField()
    made_for = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    made_for_name = models.CharField(max_length=150, help_text="the username, kept when the user goes")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True, help_text="when the console first saw a node use it")
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.token_id}"
