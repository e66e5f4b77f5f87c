"""Machines from providers other than the console's own conductor: KubeVirt VMs, an existing Metal3 cluster's
BareMetalHosts, OpenTofu workspaces (machines/kinds)."""
from django.apps import AppConfig


class MachinesConfig(AppConfig):
    name = "machines"
    verbose_name = "Machines (external providers)"

    def ready(self):
        from .clusters import cluster_client
        from .kinds import metal3, register

        register("metal3", metal3.Metal3Cluster(cluster_client))  # an existing Metal3 cluster's hosts
