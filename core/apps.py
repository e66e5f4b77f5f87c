"""The core app's registration: the leaf every app may import."""
from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The leaf every app may use and that uses no app: secrets at rest, live publishing, the tenant-scoping
    rule, the API base, the console's view helpers and live-view framework, compare-and-swap transitions."""

    name = "core"
    verbose_name = "Core"
