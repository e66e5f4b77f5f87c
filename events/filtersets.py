"""Filters for the Event log, shared by the HTML pages (audit log, timelines) and the REST API."""
import django_filters as filters
from django import forms

from .choices import EventKind
from .models import Event


class IdFilter(filters.Filter):
    """An object id: a whole number in the database's range (anything else is a 400, not a failed query)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class EventFilterSet(filters.FilterSet):
    kind = filters.ChoiceFilter(choices=EventKind.choices)
    object_type = filters.CharFilter()
    object_name = filters.CharFilter()
    actor = filters.CharFilter(lookup_expr="icontains", label="Actor contains")
    host = IdFilter(field_name="host_id", label="Host id")
    claim = IdFilter(field_name="claim_id", label="Claim id")
    tenant = IdFilter(field_name="tenant_id", label="Tenant id")
    since = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Event
        fields = []
