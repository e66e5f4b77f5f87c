from django.db import models


class ProviderKind(models.TextChoices):
    # The console's own Redfish conductor, fed with Metal3-shaped objects.
    METAL3 = "metal3", "Metal3 (bare metal, Redfish)"


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
    """How a released host's disks are erased (hosts/cleaning.py, agent/sanitize.py)."""
    METADATA = "metadata", "metadata (partition tables and signatures, first and last 2 MiB)"
    FULL = "full", "full (overwrite every block with zeros: NIST Clear)"
    SECURE = "secure", "secure (the drive's own erase: NVMe format/sanitize, ATA security erase: NIST Purge)"


class GroupFailurePolicy(models.TextChoices):
    """What an all-or-nothing group does when one member fails provisioning (claims.services)."""
    REPLACE = "Replace", "Replace (a new host from the group's rail group, or the group waits)"
    RELEASE_GROUP = "ReleaseGroup", "ReleaseGroup (every member released, the group placed again)"


class FabricKind(models.TextChoices):
    """What a tenant's fabric partition is (pools.fabric): an Ethernet VLAN id or an InfiniBand partition key."""
    VLAN = "vlan", "VLAN"
    IB_PKEY = "ib-pkey", "InfiniBand partition key"
