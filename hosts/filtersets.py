"""Filters for the host list, shared by the fleet board (hosts.views, hosts.consumers) and the REST API
(django-filter), and for the release gate's evidence (erase certificates, health runs) in the API."""
import re

import django_filters as filters
from django import forms
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast
from drf_spectacular.utils import extend_schema_field

from events.filtersets import BooleanFilter, IdFilter, TimestampFilter
from pools.matching import label_selector_q
from pools.models import NodeType

from .choices import HostState, PowerState, Verdict
from .models import BareMetalHost, EraseCertificate, HealthCheckRun
from .topology import topology_q

LABEL_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")


class LabelsField(forms.CharField):
    """key=value or key, comma separated, as {key: value, or None for "has the key"}. A bad key is this
    field's error (a 400 in the API, an ignored filter on the page), not a failed query."""

    def to_python(self, value):
        text = super().to_python(value)
        if "\x00" in text:  # the validators run on the mapping this returns, too late to see it
            raise forms.ValidationError("Null characters are not allowed.")
        labels = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, val = part.partition("=")
            key = key.strip()
            if not LABEL_KEY.match(key):
                # The key as a param: django-filter formats the message with %, which the key may contain.
                raise forms.ValidationError("%(key)s is not a label key", params={"key": repr(key)})
            labels[key] = val.strip() if eq else None
        return labels


_KEY = LABEL_KEY.pattern.strip("^$")
_PART = rf"\s*({_KEY}\s*(=[^,\u0000]*)?)?\s*"


@extend_schema_field({"type": "string", "pattern": rf"^{_PART}(,{_PART})*$"})  # what LabelsField reads
class LabelsFilter(filters.CharFilter):
    field_class = LabelsField


# The sortable columns: (field, the name in ?sort=).
SORT_FIELDS = (("name", "name"), ("state", "state"), ("power_state", "power"), ("claim__name", "claim"),
               ("claim__tenant__name", "tenant"), ("state_changed_at", "since"), ("error_message", "error"))


class NullsLastOrderingFilter(filters.OrderingFilter):
    """Sorts as asked, with the rows that have no value (a free host's claim and tenant) last either way."""

    def filter(self, qs, value):
        ordering = [self.get_ordering_value(param) for param in value or () if param]  # `name,,state`: two
        if not ordering:
            return qs
        return qs.order_by(*[F(o[1:]).desc(nulls_last=True) if o.startswith("-") else F(o).asc(nulls_last=True)
                             for o in ordering])


class HostFilterSet(filters.FilterSet):
    q = filters.CharFilter(method="filter_q", label="Search",
                           help_text="name, MAC, serial, BMC address, claim, tenant or GPU model (any part of it)")
    state = filters.MultipleChoiceFilter(choices=HostState.choices)
    power_state = filters.ChoiceFilter(choices=PowerState.choices)
    online = BooleanFilter()
    node_type = filters.CharFilter(method="filter_node_type", label="NodeType",
                                   help_text="hosts the NodeType's host selector matches")
    label = LabelsFilter(method="filter_label", label="Labels",
                         help_text="key=value or key, comma separated, all must match: role=gpu, rack=r1")
    tenant = filters.CharFilter(field_name="claim__tenant__name", label="Tenant",
                                help_text="hosts serving this tenant's claims")
    rack = filters.CharFilter(method="filter_topology", label="Rack",
                              help_text="hosts in this rack (label topology.vmetal.dev/rack, or rack)")
    rail_group = filters.CharFilter(method="filter_topology", label="Rail group",
                                    help_text="hosts in this rail group (label topology.vmetal.dev/rail-group)")
    # The fleet board's column headers and its CSV export sort by these; a tie keeps the name's order.
    sort = NullsLastOrderingFilter(fields=SORT_FIELDS, label="Sort",
                                  help_text="a column (name, state, power, claim, tenant, since, error); "
                                            "a leading - for descending")

    class Meta:
        model = BareMetalHost
        fields = {"name": ["exact"]}

    def filter_q(self, queryset, name, value):
        """Any part of the name, boot MAC, BMC address, claim or tenant; or of the inventory the agent reported
        (disk and system serials, NIC MACs, GPU models), searched as its JSON text."""
        value = value.strip()
        if not value:
            return queryset
        return queryset.annotate(inventory_text=Cast("inventory", TextField())).filter(
            Q(name__icontains=value) | Q(boot_mac__icontains=value) | Q(bmc_address__icontains=value)
            | Q(claim__name__icontains=value) | Q(claim__tenant__name__icontains=value)
            | Q(inventory_text__icontains=value))

    def filter_queryset(self, queryset):
        queryset = super().filter_queryset(queryset)
        return queryset.order_by(*queryset.query.order_by, "name") if queryset.query.order_by else queryset

    def filter_node_type(self, queryset, name, value):
        # Looked up once per request: the fleet board filters its rows and its counts with it.
        memo = getattr(self.request, "_node_type_selectors", {}) if self.request is not None else {}
        if value.strip() not in memo:
            node_type = NodeType.objects.filter(name=value.strip()).only("host_selector").first()
            memo[value.strip()] = node_type.host_selector if node_type is not None else None
            if self.request is not None:
                self.request._node_type_selectors = memo
        selector = memo[value.strip()]
        if selector is None:
            return queryset.none()
        return queryset.filter(label_selector_q(selector))

    def filter_label(self, queryset, name, value):
        return queryset.filter(label_selector_q({
            "matchLabels": {k: v for k, v in value.items() if v is not None},
            "matchExpressions": [{"key": k, "operator": "Exists"} for k, v in value.items() if v is None]}))

    def filter_topology(self, queryset, name, value):
        return queryset.filter(topology_q(**{name: value}))


BareMetalHostFilterSet = HostFilterSet


class EvidenceFilterSet(filters.FilterSet):
    """What the release gate's evidence (certificates, health runs) is looked up by: its host and when."""

    host = IdFilter(field_name="host_id", label="Host id")
    host_name = filters.CharFilter(help_text="the host's name (kept when the host is gone)")
    since = TimestampFilter(field_name="created_at", lookup_expr="gte")
    until = TimestampFilter(field_name="created_at", lookup_expr="lt")


class EraseCertificateFilterSet(EvidenceFilterSet):
    result = filters.ChoiceFilter(choices=Verdict.choices)
    tenant = filters.CharFilter(field_name="previous_tenant", label="Tenant",
                                help_text="the erases of this tenant's data (the previous tenant)")

    class Meta:
        model = EraseCertificate
        fields = ["flow_id", "disk", "serial", "method"]


class HealthCheckRunFilterSet(EvidenceFilterSet):
    verdict = filters.ChoiceFilter(choices=Verdict.choices)
    tenant = filters.CharFilter(method="filter_tenant", label="Tenant",
                                help_text="the runs of the release gates that erased this tenant's data")

    class Meta:
        model = HealthCheckRun
        fields = ["flow_id", "suite", "node_type"]

    def filter_tenant(self, queryset, name, value):
        erased = EraseCertificate.objects.filter(previous_tenant=value).values("flow_id")
        return queryset.filter(flow_id__in=erased)


def without_state(data):
    """The same filters without the state choice (and page): for the per-state counts and their links."""
    params = data.copy()
    for key in ("state", "page"):
        params.pop(key, None)
    return params
