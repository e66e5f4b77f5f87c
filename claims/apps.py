from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"

    def ready(self):
        from celery.signals import worker_ready

        from events.links import model_names, name_source
        from hosts.boot.dhcp import address_source
        from hosts.lifecycle import on_host_transition
        from hosts.restore import world_reconciler
        from hosts.services import idle_check_hold_source
        from pools.api_check import tenant_api_check_source
        from pools.capacity import address_usage_source
        from pools.services import on_pool_delete, on_pools_changed, on_tenant_finalize
        from pools.usage import claims_unreleased_source

        from . import (
            consumers,  # noqa: F401 (registers who may join a claim's live group)
            steps,  # noqa: F401 (registers the provision and deprovision flows with the step engine)
            task_names,
        )
        from .ipam import environments_usage, host_addresses
        from .models import NodeClaim
        from .phases import pool_claims_release, tenants_finalize
        from .reactions import react
        from .reconcile import reconcile_soon
        from .selectors import claims_unreleased, node_types_waited_for
        from .tenant_check import tenant_api_status

        address_source(host_addresses)  # a host's DHCP entry carries its claim's address
        address_usage_source(environments_usage)  # the environments' used / free / leaked (API)
        on_host_transition(react)  # what a host's move means for its claim
        on_pool_delete(pool_claims_release)
        on_tenant_finalize(tenants_finalize)
        on_pools_changed(reconcile_soon)  # pools that changed are reconciled once the change commits
        claims_unreleased_source(claims_unreleased)  # what still uses a NodeType or a tenant
        tenant_api_check_source(tenant_api_status)  # the tenant's API answer shows both sides' checks
        idle_check_hold_source(node_types_waited_for)  # no idle health check while claims wait for a host
        name_source("claim", model_names(NodeClaim))  # the Event log's claim links
        world_reconciler(task_names.WORLD_RECONCILE)  # held hosts after a restore: claims/restore.py decides
        # Each worker's start: re-import the archived certificates, and reconcile if the database was restored.
        worker_ready.connect(_world_reconcile_at_start, weak=False, dispatch_uid="claims-world-reconcile")


def _world_reconcile_at_start(**kwargs) -> None:
    from hosts.restore import reconcile_request

    reconcile_request(countdown=0)
