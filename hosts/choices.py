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
    RETIRED = "retired", "Retired", "dark"  # taken out of the fleet for good
    ERROR = "error", "Error", "danger"
    MAINTENANCE = "maintenance", "Maintenance", "dark"


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
