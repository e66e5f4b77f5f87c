"""The API's app config. Its label names the API tokens' table (vmetal_api_apitoken)."""
from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "pools.api"
    label = "vmetal_api"
    verbose_name = "REST API"
