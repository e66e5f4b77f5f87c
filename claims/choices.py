"""The claim phases, with their badge colours, and the name of the claim's own step."""
from django.db import models

from core.choices import ColouredChoices


class ClaimPhase(ColouredChoices):
    PENDING = "Pending", "Pending", "secondary"
    PROVISIONING = "Provisioning", "Provisioning", "warning"
    JOINING = "Joining", "Joining", "warning"
    AVAILABLE = "Available", "Available", "success"
    FAILED = "Failed", "Failed", "danger"
    RELEASING = "Releasing", "Releasing", "warning"
    RELEASED = "Released", "Released", "dark"


class ReleasePurpose(models.TextChoices):
    """Why a claim gives its host back, which decides what the release gate may keep (hosts/gate): a host going
    back to the free pool may serve any tenant next; a drift roll's in-place re-image serves the same pool again."""
    FREE = "", "back to the free pool"
    REIMAGE = "reimage", "re-imaged for the same pool"


ALLOCATE = "allocate"  # the claim's own step in its timeline: the wait for a host, from its creation to Scheduled
