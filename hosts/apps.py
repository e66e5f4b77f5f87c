"""The hosts app: its registries filled at start (flows, receivers, capacity source, preflight on change)."""
from django.apps import AppConfig


class HostsConfig(AppConfig):
    name = "hosts"

    def ready(self):
        # At ready, not at import: the models must be loaded before these modules are.
        from core import counters
        from events.links import model_names, name_source
        from pools.capacity import capacity_source

        from . import consumers  # noqa: F401 (registers who may join a host's live group)
        from .bmc import client as bmc_client
        from .capacity import node_type_capacity
        from .flows import host  # noqa: F401 (registers the host's own flows with the step engine)
        from .flows import repair  # registers the repair flow
        from .lifecycle import on_host_transition
        from .models import BareMetalHost
        from .preflight import connect_receivers

        capacity_source(node_type_capacity)
        bmc_client.CALL_OBSERVERS.append(lambda result: counters.counter_add(counters.BMC_REQUESTS, result))  # /metrics
        on_host_transition(repair.host_moved)  # a move into or out of repair opens or closes its repair case
        connect_receivers()  # a host's BMC or MAC changed: preflight it again on commit
        name_source("host", model_names(BareMetalHost))  # the Event log's host links
