"""Access's app config. Its label names the API tokens' table (vmetal_api_apitoken) and their migrations, as
when tokens were part of the REST API app."""
from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "access"
    label = "vmetal_api"
    verbose_name = "REST API"
