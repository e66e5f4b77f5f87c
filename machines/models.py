"""What an external provider made for a claim, the Secrets providers read, and OpenTofu's state."""
from django.db import models

from core.crypto import EncryptedTextField
from pools.choices import ProviderKind

from .choices import DiskProof, MachineState


class Machine(models.Model):
    """The machine an external provider made for one claim: a KubeVirt VirtualMachine, a BareMetalHost of another
    Metal3 cluster, an OpenTofu workspace. Kept after release (gone_at) as the claim's record."""

    claim = models.OneToOneField("claims.NodeClaim", on_delete=models.CASCADE, related_name="machine")
    provider = models.ForeignKey("pools.NodeProvider", on_delete=models.PROTECT, related_name="machines")
    node_type = models.ForeignKey("pools.NodeType", null=True, on_delete=models.SET_NULL, related_name="machines")
    kind = models.CharField(max_length=32, choices=ProviderKind.choices)
    name = models.CharField(max_length=253)  # the VM, the BareMetalHost, the workspace
    namespace = models.CharField(max_length=253, blank=True)
    # Every object made for it, deleted on release and awaited until gone:
    # [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "namespace": "...", "name": "..."}, ...]
    made = models.JSONField(default=list, blank=True)
    # What the kind needs to find again what it changed (a BareMetalHost's annotations before, say).
    memory = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=MachineState.choices, default=MachineState.CREATING,
                             db_index=True)
    message = models.TextField(blank=True)
    power = models.CharField(max_length=8, blank=True)  # "On" / "Off": as last asked
    outputs = models.JSONField(default=dict, blank=True)  # an OpenTofu workspace's outputs
    disk_proof = models.CharField(max_length=16, choices=DiskProof.choices, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    running_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @property
    def state_colour(self) -> str:
        return MachineState.colour(self.state)


class ProviderSecret(models.Model):
    """A Secret providers read: a cluster's kubeconfig (clusterRef), OpenTofu provider credentials (labelled
    terraform.vcluster.com/provider). Its data is encrypted; it is never shown or exported."""

    namespace = models.CharField(max_length=253, default="vcluster-platform")
    name = models.CharField(max_length=253)
    labels = models.JSONField(default=dict, blank=True)
    contents = EncryptedTextField(blank=True)  # JSON of {key: value}
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["namespace", "name"]
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="uniq_provider_secret")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class TofuState(models.Model):
    """One workspace's OpenTofu state, as its HTTP backend keeps it: the state encrypted, the lock with its ID."""

    name = models.CharField(max_length=253, unique=True)  # NODE_CLAIM.PROJECT.node
    provider = models.ForeignKey("pools.NodeProvider", null=True, on_delete=models.SET_NULL, related_name="+")
    tofu_state = EncryptedTextField(blank=True)
    serial = models.PositiveBigIntegerField(default=0)
    # The HTTP backend's basic-auth password for this workspace, hashed; the runner passes it in the environment.
    password_hash = models.CharField(max_length=128, blank=True)
    lock_id = models.CharField(max_length=128, blank=True)
    lock_info = models.JSONField(default=dict, blank=True)
    locked_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
