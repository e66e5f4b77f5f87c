"""The Auto Nodes app's registration (dynamic pools: demand, decisions, disruption)."""
from django.apps import AppConfig


class AutonodesConfig(AppConfig):
    name = "autonodes"
    verbose_name = "Auto Nodes (dynamic pools)"

    def ready(self):
        from claims.phases import on_claim_end

        from .services import claims_ended

        on_claim_end(claims_ended)  # a claim that ends returns the pods still waiting for it to the demand
