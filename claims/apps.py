from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"

    def ready(self):
        from hosts.lifecycle import on_host_transition
        from pools.services import on_pool_delete, on_tenant_finalize

        from . import (
            consumers,  # noqa: F401 (registers who may join a claim's live group)
            steps,  # noqa: F401 (registers the provision and deprovision flows with the step engine)
        )
        from .reactions import react
        from .services import pool_claims_release, tenants_finalize

        on_host_transition(react)  # what a host's move means for its claim
        on_pool_delete(pool_claims_release)
        on_tenant_finalize(tenants_finalize)
