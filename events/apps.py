"""The events app's registration: the append-only Event log every app records to."""
from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "events"
