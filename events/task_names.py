"""The names of the Celery tasks events offers: callers and the beat send them by these (core.tasks.task_send)."""
PRUNE_AUDIT = "events.tasks.prune_audit"
PRUNE_EVENTS = "events.tasks.prune_events"
