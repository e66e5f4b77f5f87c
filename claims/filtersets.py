"""Filters for the claim list, shared by the HTML page and the REST API (django-filter)."""
import django_filters as filters

from .choices import ClaimPhase
from .models import NodeClaim


class NodeClaimFilterSet(filters.FilterSet):
    q = filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")
    phase = filters.MultipleChoiceFilter(choices=ClaimPhase.choices)
    tenant = filters.CharFilter(field_name="tenant__name", label="Tenant")
    pool = filters.CharFilter(field_name="pool_name", label="Pool")
    node_type = filters.CharFilter(field_name="node_type__name", label="NodeType")
    host = filters.CharFilter(field_name="host_name", label="Host")

    class Meta:
        model = NodeClaim
        fields = {"name": ["exact"]}
