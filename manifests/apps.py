"""The manifests app's registration: apply, delete and export of Kubernetes-style documents."""
from django.apps import AppConfig


class ManifestsConfig(AppConfig):
    name = "manifests"
