from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"

    def ready(self):
        from . import consumers  # noqa: F401 (registers who may join a claim's live group)
