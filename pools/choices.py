from django.db import models


class ProviderKind(models.TextChoices):
    # The console's own Redfish conductor, fed with Metal3-shaped objects.
    METAL3 = "metal3", "Metal3 (bare metal, Redfish)"
    KUBEVIRT = "kubeVirt", "KubeVirt (virtual machines)"
    TERRAFORM = "terraform", "OpenTofu template"


class PoolKind(models.TextChoices):
    STATIC = "static", "Static"
    DYNAMIC = "dynamic", "Dynamic"


class JoinMode(models.TextChoices):
    VCLUSTER = "vcluster", "vCluster join script"
    KUBEADM = "kubeadm", "kubeadm join"


class ChecksumType(models.TextChoices):
    MD5 = "md5", "MD5"
    SHA256 = "sha256", "SHA-256"
    SHA512 = "sha512", "SHA-512"


class ImageFormat(models.TextChoices):
    RAW = "raw", "raw"
    QCOW2 = "qcow2", "qcow2"


class SelectorOperator(models.TextChoices):
    EQUALS = "", "equals"
    IN = "In", "In"
    NOT_IN = "NotIn", "NotIn"
    EXISTS = "Exists", "Exists"
    DOES_NOT_EXIST = "DoesNotExist", "DoesNotExist"
    GT = "Gt", "Gt"
    LT = "Lt", "Lt"


class ConsolidationPolicy(models.TextChoices):
    WHEN_EMPTY = "WhenEmpty", "WhenEmpty"
    WHEN_EMPTY_OR_UNDERUTILIZED = "WhenEmptyOrUnderutilized", "WhenEmptyOrUnderutilized"


class CleaningPolicy(models.TextChoices):
    """How a released host's disks are erased (hosts/gate/cleaning.py, agent/sanitize.py)."""
    METADATA = "metadata", "metadata (partition tables and signatures, first and last 2 MiB)"
    FULL = "full", "full (overwrite every block with zeros: NIST Clear)"
    SECURE = "secure", "secure (the drive's own erase: NVMe format/sanitize, ATA security erase: NIST Purge)"


class InspectionMode(models.TextChoices):
    """Where a host's inventory comes from at inspection (hosts/flows/steps.py: step_inspect). Metal3's
    `inspectionMode`; "fast" is its out-of-band inspection (Ironic's redfish inspect interface)."""
    AGENT = "agent", "agent (the ramdisk's agent inspects; a Redfish BMC's own inventory is kept beside it)"
    FAST = "fast", "fast (out of band: the Redfish BMC's own inventory, no agent inspect command)"


class GroupFailurePolicy(models.TextChoices):
    """What an all-or-nothing group does when one member fails provisioning (claims.phases, claims.allocation)."""
    REPLACE = "Replace", "Replace (a new host from the group's rail group, or the group waits)"
    RELEASE_GROUP = "ReleaseGroup", "ReleaseGroup (every member released, the group placed again)"


class FabricKind(models.TextChoices):
    """What a tenant's fabric partition is (pools.fabric): an Ethernet VLAN id or an InfiniBand partition key."""
    VLAN = "vlan", "VLAN"
    IB_PKEY = "ib-pkey", "InfiniBand partition key"


# --- the repair ladder (hosts/flows/repair.py): failure kinds, remedies, and the ladder of each kind by default ---------

class FailureKind(models.TextChoices):
    """Why a host went to repair, as the ladder classifies the failed run (hosts.flows.repair.classify)."""
    GPU_XID = "gpu-xid", "GPU Xid error"
    GPU_HEALTH = "gpu-health", "GPU health (DCGM, GPU reset)"
    NCCL_SLOW = "nccl-slow", "NCCL bandwidth below the threshold"
    ERASE = "erase", "erase not verified"
    DISK = "disk", "disk (the drive refused its erase)"
    SKU = "sku", "SKU deviation"
    UNKNOWN = "unknown", "unknown"


class RepairRemedy(models.TextChoices):
    """An automatic remedy: each boots the host into the agent's ramdisk and runs the checks again (the GPU
    health suite; the erase and its verification too where the failed run's erase is not verified)."""
    GPU_RESET = "gpu-reset", "GPU reset (nvidia-smi --gpu-reset), then the checks"
    POWER_CYCLE = "power-cycle", "cold power cycle through the BMC (held off), then the checks"
    RETEST = "retest", "the whole release gate again (erase, verify, GPU reset, health suite)"
    REIMAGE = "reimage", "a full erase of every disk (whatever the policy), verified in full, then the checks"


DEFAULT_LADDERS: dict[str, list[str]] = {
    FailureKind.GPU_XID: ["gpu-reset", "power-cycle", "retest"],
    FailureKind.GPU_HEALTH: ["gpu-reset", "power-cycle", "retest"],
    FailureKind.NCCL_SLOW: ["gpu-reset", "power-cycle", "retest"],
    FailureKind.ERASE: ["retest", "reimage"],
    FailureKind.DISK: ["power-cycle", "reimage"],
    FailureKind.SKU: ["power-cycle"],  # a server that lost a GPU or a disk at boot may find it again cold
    FailureKind.UNKNOWN: ["retest"],
}
REPAIR_LADDER_MAX = 6  # rungs per kind: a longer ladder only keeps a broken host from a person
