"""Filters of Auto Nodes' decisions (decision Events), for GET /api/v1/decisions/."""
import django_filters as filters

from events.choices import ObjectType
from events.filtersets import IdFilter, TimestampFilter
from events.models import Event
from pools.models import NodePool

from .choices import DecisionReason


class DecisionFilterSet(filters.FilterSet):
    tenant = IdFilter(field_name="tenant_id", label="Tenant id")
    pool = IdFilter(method="filter_pool", label="Pool id")
    pool_name = filters.CharFilter(method="filter_pool_name", label="Pool name")
    reason = filters.ChoiceFilter(field_name="data__reason", choices=DecisionReason.choices)
    since = TimestampFilter(field_name="created_at", lookup_expr="gte")
    until = TimestampFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Event
        fields = []

    def filter_pool(self, queryset, name, value):
        # Decisions name their pool within its tenant (object_name), so that they outlive a deleted pool.
        found = NodePool.objects.filter(pk=value).values_list("tenant_id", "name").first()
        if found is None:
            return queryset.none()
        return queryset.filter(tenant_id=found[0], object_type=ObjectType.POOL, object_name=found[1])

    def filter_pool_name(self, queryset, name, value):
        return queryset.filter(object_type=ObjectType.POOL, object_name=value)
