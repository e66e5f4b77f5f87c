"""The composition root's app registration, and the key canary written after migrate."""
from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ConsoleConfig(AppConfig):
    """The composition root's own app: the key checks and the canary they read (vmetal_console.checks)."""

    name = "vmetal_console"
    label = "vmetal_console"
    verbose_name = "vMetal Console"

    def ready(self):
        from . import checks

        post_migrate.connect(checks.canary_write, sender=self)
