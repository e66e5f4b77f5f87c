"""The host's declared choices: states, power, verdicts, cleaning modes and repair outcomes, each with its colour."""
from django.db import models

from core.choices import ColouredChoices


class HostState(ColouredChoices):
    REGISTERING = "registering", "Registering", "secondary"
    INSPECTING = "inspecting", "Inspecting", "secondary"
    # Available is green as a claim's Available is; provisioned (serving a claim) is blue.
    AVAILABLE = "available", "Available", "success"
    # An available host under its NodeType's idle health check (pools/health_tiers.py): still allocatable,
    # a claim pre-empts the check.
    CHECKING = "checking", "Idle check", "secondary"
    PROVISIONING = "provisioning", "Provisioning", "warning"
    PROVISIONED = "provisioned", "Provisioned", "primary"
    DEPROVISIONING = "deprovisioning", "Deprovisioning", "warning"
    REPAIR = "repair", "Repair", "purple"  # not an in-progress amber: it waits for a person
    # In repair: cleaned and checked again (hosts.services.host_retest).
    RETESTING = "retesting", "Retesting", "warning"
    # In repair: one automatic remedy of the repair ladder under way, then the checks (hosts/flows/repair.py).
    REPAIRING = "repairing", "Repairing", "warning"
    # An available host under a servicing action an admin asked for (a firmware update: hosts/flows/firmware.py);
    # not allocatable until it is done.
    SERVICING = "servicing", "Servicing", "warning"
    RETIRED = "retired", "Retired", "dark"  # taken out of the fleet for good
    ERROR = "error", "Error", "danger"
    MAINTENANCE = "maintenance", "Maintenance", "dark"
    # After a restore of the database: nothing acts on the host until its real state (its BMC's power, the tenants'
    # nodes) was read and the world reconcile decided where it goes (claims/restore.py). `held_from` keeps the state
    # the restored database gave it.
    HELD = "held", "Held: reconciling after a restore", "dark"


class PowerState(models.TextChoices):
    ON = "on", "On"
    OFF = "off", "Off"
    UNKNOWN = "unknown", "Unknown"


class CleaningMode(models.TextChoices):
    METADATA = "metadata", "metadata"
    DISABLED = "disabled", "disabled"


class Verdict(models.TextChoices):
    PASS = "pass", "Pass"
    FAIL = "fail", "Fail"


class RepairOutcome(models.TextChoices):
    """How a repair case (hosts.models.RepairCase) or one rung of its ladder (RepairAttempt) ended."""
    RUNNING = "running", "Running"
    PASSED = "passed", "Passed"  # an attempt whose checks passed
    FAILED = "failed", "Failed"  # an attempt whose checks failed again
    ABORTED = "aborted", "Aborted"  # an attempt the host left otherwise (maintenance, an error of its flow)
    REPAIRED = "repaired", "Repaired automatically"  # a case closed by a passing remedy
    RETURNED = "returned", "Returned to service by a person"  # closed by an admin (retest + return, override)
    WAITING = "waiting", "Waiting for a person"  # the ladder is exhausted (or none is automatic)
    RETIRED = "retired", "Retired"
    WITHDRAWN = "withdrawn", "Taken out"  # maintenance, or back through a release
