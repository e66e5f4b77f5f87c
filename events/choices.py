"""The Event log's declared kinds and object types, with their labels."""
from django.db import models


class EventKind(models.TextChoices):
    TRANSITION = "transition", "State change"
    STEP = "step", "Step"
    CHANGE = "change", "Configuration change"
    ACTION = "action", "Action"
    SECURITY = "security", "Security"  # a refused agent lookup, a boot script asked for twice
    READ = "read", "Secret read"  # a person was shown a secret (a join command, an export with secrets)
    DECISION = "decision", "Auto Nodes decision"  # a dynamic pool added, did not add or released nodes (autonodes)


class ObjectType(models.TextChoices):
    """What an Event is about. The objects with a link of their own (host, claim, tenant) name their live
    groups; the others reach the live views through the links they carry (a pool: its tenant)."""

    HOST = "host", "Host"
    CLAIM = "claim", "Claim"
    POOL = "pool", "Pool"
    TENANT = "tenant", "Tenant"
    MEMBERSHIP = "membership", "Membership"
    NODEPROVIDER = "nodeprovider", "NodeProvider"
    NODETYPE = "nodetype", "NodeType"
    NODEENVIRONMENT = "nodeenvironment", "NodeEnvironment"
    OSIMAGE = "osimage", "OS image"
    USER = "user", "User"
    GROUP = "group", "Group"
    TOKEN = "token", "API token"
