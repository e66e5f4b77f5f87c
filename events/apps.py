"""The Event log's app config."""
from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "events"
