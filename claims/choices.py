"""The claim phases, with their badge colours, and the name of the claim's own step."""
from core.choices import ColouredChoices


class ClaimPhase(ColouredChoices):
    PENDING = "Pending", "Pending", "secondary"
    PROVISIONING = "Provisioning", "Provisioning", "warning"
    JOINING = "Joining", "Joining", "warning"
    AVAILABLE = "Available", "Available", "success"
    FAILED = "Failed", "Failed", "danger"
    RELEASING = "Releasing", "Releasing", "warning"
    RELEASED = "Released", "Released", "dark"


ALLOCATE = "allocate"  # the claim's own step in its timeline: the wait for a host, from its creation to Scheduled
