"""Access's app config. Its label, vmetal_api, names the API tokens' table (vmetal_api_apitoken) and their
migrations: a new label would need both moved."""
from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "access"
    label = "vmetal_api"
    verbose_name = "REST API"

    def ready(self):
        from . import checks, sessions  # noqa: F401 (the sign-in settings' check; the sign-in signal's receiver)
