"""Filters for tenants, pools and the site's configuration: one FilterSet per list, shared by the HTML
pages and the REST API (django-filter)."""
import django_filters as filters

from .choices import ImageFormat, PoolKind, ProviderKind
from .models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant


class NameSearchFilterSet(filters.FilterSet):
    q = filters.CharFilter(field_name="name", lookup_expr="icontains", label="Name contains")


class TenantFilterSet(NameSearchFilterSet):
    class Meta:
        model = Tenant
        fields = {"name": ["exact"], "namespace": ["exact"]}


class NodePoolFilterSet(NameSearchFilterSet):
    tenant = filters.CharFilter(field_name="tenant__name", label="Tenant")
    provider = filters.CharFilter(field_name="provider__name", label="NodeProvider")
    kind = filters.ChoiceFilter(choices=PoolKind.choices, empty_label="any")

    class Meta:
        model = NodePool
        fields = {"name": ["exact"]}


class NodeProviderFilterSet(NameSearchFilterSet):
    kind = filters.ChoiceFilter(choices=ProviderKind.choices, empty_label="any")

    class Meta:
        model = NodeProvider
        fields = {"name": ["exact"]}


class NodeTypeFilterSet(NameSearchFilterSet):
    provider = filters.CharFilter(field_name="provider__name", label="NodeProvider")

    class Meta:
        model = NodeType
        fields = {"name": ["exact"], "zone": ["exact"], "region": ["exact"]}


class NodeEnvironmentFilterSet(NameSearchFilterSet):
    provider = filters.CharFilter(field_name="provider__name", label="NodeProvider")
    tenant = filters.CharFilter(field_name="tenant__name", label="Tenant")

    class Meta:
        model = NodeEnvironment
        fields = {"name": ["exact"], "namespace": ["exact"]}


class OSImageFilterSet(NameSearchFilterSet):
    format = filters.ChoiceFilter(choices=ImageFormat.choices, empty_label="any")

    class Meta:
        model = OSImage
        fields = {"name": ["exact"]}
