from django.db import models


class EventKind(models.TextChoices):
    TRANSITION = "transition", "State change"
    STEP = "step", "Step"
    CHANGE = "change", "Configuration change"
    ACTION = "action", "Action"
    SECURITY = "security", "Security"  # a refused agent lookup, a boot script asked for twice
