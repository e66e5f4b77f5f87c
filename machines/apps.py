"""Machines from providers other than the console's own conductor: KubeVirt VMs, an existing Metal3 cluster's
BareMetalHosts, OpenTofu workspaces (machines/kinds)."""
from django.apps import AppConfig


class MachinesConfig(AppConfig):
    name = "machines"
    verbose_name = "Machines (external providers)"

    def ready(self):
        from .kinds import metal3  # noqa: F401  (registers kind metal3: an existing Metal3 cluster's hosts)
