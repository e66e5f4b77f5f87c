from django.apps import AppConfig


class LabConfig(AppConfig):
    """The simulated data centre (`manage.py lab`): installed only where the lab runs (VMETAL_LAB), never
    imported by the product's apps."""

    name = "lab"
