"""The Event log: append-only. Audit, timelines and live views all read it."""
from django.db import models

from .choices import EventKind, ObjectType


class Event(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    object_type = models.CharField(max_length=32, choices=ObjectType.choices)
    object_name = models.CharField(max_length=253)
    # Plain ids without foreign-key constraints: events outlive the objects they describe.
    host = models.ForeignKey("hosts.BareMetalHost", null=True, blank=True, on_delete=models.DO_NOTHING,
                             db_constraint=False, related_name="events")
    claim = models.ForeignKey("claims.NodeClaim", null=True, blank=True, on_delete=models.DO_NOTHING,
                              db_constraint=False, related_name="events")
    tenant = models.ForeignKey("pools.Tenant", null=True, blank=True, on_delete=models.DO_NOTHING,
                               db_constraint=False, related_name="events")
    from_state = models.CharField(max_length=32, blank=True)
    to_state = models.CharField(max_length=32, blank=True)
    step = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    duration_s = models.FloatField(null=True, blank=True)  # time spent in from_state, or the step's length
    actor = models.CharField(max_length=150)  # "user:alice", "system:reconciler", "agent:node-01"
    # Where a person's change came from (events.services fills them in; empty for the console's own work): the
    # client's address, how the actor was signed in ("session", "token 1a2b3c4d (read-write)", "manage.py") and
    # through which role ("admin", "auditor", "member of one").
    address = models.GenericIPAddressField(null=True, blank=True)
    via = models.CharField(max_length=64, blank=True)
    role = models.CharField(max_length=100, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["host", "created_at"]),
            models.Index(fields=["claim", "created_at"]),
            models.Index(fields=["tenant", "created_at"]),
            models.Index(fields=["object_type", "created_at"]),
        ]

    def __str__(self) -> str:
        arrow = f" {self.from_state}→{self.to_state}" if self.to_state else ""
        return f"{self.object_type} {self.object_name}{arrow} {self.step}".strip()

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise ValueError("events are append-only")
