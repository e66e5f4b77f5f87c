from django.db import models


class HostState(models.TextChoices):
    REGISTERING = "registering", "Registering"
    INSPECTING = "inspecting", "Inspecting"
    AVAILABLE = "available", "Available"
    PROVISIONING = "provisioning", "Provisioning"
    PROVISIONED = "provisioned", "Provisioned"
    DEPROVISIONING = "deprovisioning", "Deprovisioning"
    REPAIR = "repair", "Repair"
    RETESTING = "retesting", "Retesting"  # in repair: cleaned and checked again (hosts.services.host_retest)
    RETIRED = "retired", "Retired"  # taken out of the fleet for good
    ERROR = "error", "Error"
    MAINTENANCE = "maintenance", "Maintenance"

    @classmethod
    def colour(cls, state: str) -> str:
        return STATE_COLOURS.get(state, "secondary")


STATE_COLOURS = {
    "registering": "secondary", "inspecting": "secondary", "available": "info",
    "provisioning": "warning", "provisioned": "success", "deprovisioning": "warning",
    "repair": "orange", "retesting": "warning", "retired": "dark", "error": "danger", "maintenance": "dark",
}


class PowerState(models.TextChoices):
    ON = "on", "On"
    OFF = "off", "Off"
    UNKNOWN = "unknown", "Unknown"


class BMCScheme(models.TextChoices):
    REDFISH = "redfish", "Redfish (HTTPS)"
    REDFISH_HTTP = "redfish+http", "Redfish (HTTP)"
    REDFISH_VIRTUALMEDIA = "redfish-virtualmedia", "Redfish virtual media"
    REDFISH_VIRTUALMEDIA_HTTP = "redfish-virtualmedia+http", "Redfish virtual media (HTTP)"
    IPMI = "ipmi", "IPMI"


class CleaningMode(models.TextChoices):
    METADATA = "metadata", "metadata"
    DISABLED = "disabled", "disabled"


class Verdict(models.TextChoices):
    PASS = "pass", "Pass"
    FAIL = "fail", "Fail"
