from django.apps import AppConfig


class AutonodesConfig(AppConfig):
    name = "autonodes"
    verbose_name = "Auto Nodes (dynamic pools)"
