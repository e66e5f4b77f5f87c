from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"

    def ready(self):
        from . import consumers  # noqa: F401 (registers who may join a host's live group)
