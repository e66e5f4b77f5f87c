"""Filters for the claim list, shared by the HTML page and the REST API (django-filter)."""
import django_filters as filters
from django_filters.fields import MultipleChoiceField

from events.filtersets import BooleanFilter
from hosts.filtersets import NullsLastOrderingFilter

from .choices import ClaimPhase
from .models import ClaimGroup, NodeClaim

NOT_RELEASED = "live"  # the claims page's "not released": every phase but Released

# The sortable columns: (field, the name in ?sort=); the claims page's headers sort by these.
SORT_FIELDS = (("name", "name"), ("tenant__name", "tenant"), ("pool_name", "pool"), ("phase", "phase"),
               ("node_type__name", "node_type"), ("host_name", "host"), ("created_at", "created"))


class OptionalChoicesField(MultipleChoiceField):
    """An empty value (a select's "any" option) chooses nothing, rather than being an invalid choice."""

    def clean(self, value):
        return super().clean([v for v in value or () if v != ""])


class OptionalChoicesFilter(filters.MultipleChoiceFilter):
    field_class = OptionalChoicesField


class NodeClaimFilterSet(filters.FilterSet):
    q = filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")
    phase = OptionalChoicesFilter(
        choices=[(NOT_RELEASED, "not released"), *ClaimPhase.choices], method="filter_phase",
        help_text=f"one or more phases; {NOT_RELEASED}: every phase but Released")
    tenant = filters.CharFilter(field_name="tenant__name", label="Tenant")
    pool = filters.CharFilter(field_name="pool_name", label="Pool")
    node_type = filters.CharFilter(field_name="node_type__name", label="NodeType")
    host = filters.CharFilter(field_name="host_name", label="Host")
    sort = NullsLastOrderingFilter(fields=SORT_FIELDS, label="Sort",
                                   help_text="a column (name, tenant, pool, phase, node_type, host, created); "
                                             "a leading - for descending; newest first when none")

    class Meta:
        model = NodeClaim
        fields = {"name": ["exact"]}

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        # A tie keeps the newest first, as the unsorted list has it.
        return queryset.order_by(*queryset.query.order_by, "-created_at", "-pk") if queryset.query.order_by \
            else queryset

    def filter_phase(self, queryset, name, value):
        phases = set(value)
        if NOT_RELEASED in phases:
            phases.discard(NOT_RELEASED)
            phases.update(p for p in ClaimPhase.values if p != ClaimPhase.RELEASED)
        return queryset.filter(phase__in=phases)


class ClaimGroupFilterSet(filters.FilterSet):
    q = filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")
    tenant = filters.CharFilter(field_name="tenant__name", label="Tenant")
    pool = filters.CharFilter(field_name="pool_name", label="Pool")
    placed = BooleanFilter(field_name="placed_at", lookup_expr="isnull", exclude=True,
                                   label="Placed (true) or waiting to be placed (false)")

    class Meta:
        model = ClaimGroup
        fields = {"name": ["exact"]}
