from django.apps import AppConfig


class PoolsConfig(AppConfig):
    name = "pools"

    def ready(self):
        from events.links import model_names, name_source

        from .models import Tenant

        name_source("tenant", model_names(Tenant))  # the Event log's tenant links and its tenant filter
