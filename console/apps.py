"""The console app's registration: pages that compose several apps."""
from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The console's pages that compose several apps: home, the tenant self-service page (pools with their
    claims and nodes), the catalogue (NodeTypes with their capacity from hosts), the YAML apply page."""

    name = "console"
