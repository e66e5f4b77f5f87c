"""Machines from providers other than the console's own conductor: KubeVirt VMs, an existing Metal3 cluster's
BareMetalHosts, OpenTofu workspaces (machines/kinds)."""
from django.apps import AppConfig


class MachinesConfig(AppConfig):
    name = "machines"
    verbose_name = "Machines (external providers)"

    def ready(self):
        from claims.providers import on_machine_power, on_machine_release, on_machine_steps, on_machine_view
        from pools.capacity import machine_capacity_source

        from . import selectors, services
        from .clusters import cluster_client
        # The kubeVirt and terraform kinds register themselves (machines.kinds.register) when imported.
        from .kinds import kubevirt, metal3, register, terraform  # noqa: F401

        register("metal3", metal3.Metal3Cluster(cluster_client))  # an existing Metal3 cluster's hosts
        on_machine_release(services.machine_claims_release)  # a released claim's machine goes
        on_machine_power(services.machine_power_request)  # a claim's power action goes to its machine
        on_machine_view(services.machines_view)  # the claim's API answer and page show its machine
        machine_capacity_source(selectors.machine_capacity)
        on_machine_steps(selectors.machine_steps, selectors.machine_step_durations)  # timelines and timings  # the capacity views count its NodeTypes' machines
