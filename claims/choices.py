from django.db import models


class ClaimPhase(models.TextChoices):
    PENDING = "Pending", "Pending"
    PROVISIONING = "Provisioning", "Provisioning"
    JOINING = "Joining", "Joining"
    AVAILABLE = "Available", "Available"
    FAILED = "Failed", "Failed"
    RELEASING = "Releasing", "Releasing"
    RELEASED = "Released", "Released"


PHASE_COLOURS = {"Pending": "secondary", "Provisioning": "warning", "Joining": "warning", "Available": "success",
                 "Failed": "danger", "Releasing": "warning", "Released": "dark"}
