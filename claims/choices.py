from core.choices import ColouredChoices


class ClaimPhase(ColouredChoices):
    PENDING = "Pending", "Pending", "secondary"
    PROVISIONING = "Provisioning", "Provisioning", "warning"
    JOINING = "Joining", "Joining", "warning"
    AVAILABLE = "Available", "Available", "success"
    FAILED = "Failed", "Failed", "danger"
    RELEASING = "Releasing", "Releasing", "warning"
    RELEASED = "Released", "Released", "dark"
