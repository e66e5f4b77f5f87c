"""Filters for the Event log, shared by the HTML pages (audit log, timelines) and the REST API."""
from datetime import timedelta

import django_filters as filters
from django import forms
from django.db.models import Q
from django_filters.fields import IsoDateTimeField
from drf_spectacular.utils import extend_schema_field

from .choices import EventKind
from .models import Event
from .selectors import FAILED_STEP


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": 2**63 - 1})  # the schema says what it takes
class IdFilter(filters.Filter):
    """An object id: a whole number in the database's range (anything else is a 400, not a failed query)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", 2**63 - 1)
        super().__init__(*args, **kwargs)


class StrictBooleanField(forms.NullBooleanField):
    """true/false (or 1/0); empty: no filter; anything else a 400 (Django's field reads it as "no filter"). Read
    as typed: NullBooleanSelect would turn what it does not know into None before the field sees it."""

    widget = forms.TextInput

    def to_python(self, value):
        if value in (None, ""):
            return None
        if str(value).lower() in ("true", "1"):
            return True
        if str(value).lower() in ("false", "0"):
            return False
        raise forms.ValidationError("true or false", code="invalid")

    def validate(self, value):
        pass


class BooleanFilter(filters.BooleanFilter):
    field_class = StrictBooleanField


class TimestampField(IsoDateTimeField):
    """An ISO 8601 time with an offset PostgreSQL takes (within ±15:59:59, whole seconds); Python takes up to
    ±23:59, and the query would fail."""

    def to_python(self, value):
        value = super().to_python(value)
        offset = value.utcoffset() if value is not None else None
        if offset is not None and (abs(offset) >= timedelta(hours=16) or offset.microseconds):
            raise forms.ValidationError("the time zone offset must be within ±15:59", code="invalid")
        return value


# The offset as PostgreSQL takes it (TimestampField), in the schema too.
@extend_schema_field({"type": "string", "format": "date-time", "pattern": r"(Z|z|[+-](0[0-9]|1[0-5]):[0-5][0-9])$"})
class TimestampFilter(filters.IsoDateTimeFilter):
    field_class = TimestampField


STEPS = (("all", "every step"), ("failed", "failed steps only"))


class EventFilterSet(filters.FilterSet):
    kind = filters.ChoiceFilter(choices=EventKind.choices)
    object_type = filters.CharFilter()
    object_name = filters.CharFilter()
    name = filters.CharFilter(field_name="object_name", lookup_expr="icontains", label="Name contains")
    # "failed": every event but the steps that went well (a flow's every start and end); absent or "all": every event.
    steps = filters.ChoiceFilter(choices=STEPS, method="filter_steps", label="Steps")
    actor = filters.CharFilter(lookup_expr="icontains", label="Actor contains")
    host = IdFilter(field_name="host_id", label="Host id")
    claim = IdFilter(field_name="claim_id", label="Claim id")
    tenant = IdFilter(field_name="tenant_id", label="Tenant id")
    since = TimestampFilter(field_name="created_at", lookup_expr="gte")
    until = TimestampFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Event
        fields = []

    def filter_steps(self, queryset, name, value):
        if value == "failed":
            return queryset.filter(~Q(kind=EventKind.STEP) | FAILED_STEP)
        return queryset

class AuditFilterSet(filters.FilterSet):
    """The audit export's time range: since (included), until (excluded)."""

    since = TimestampFilter(field_name="created_at", lookup_expr="gte")
    until = TimestampFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Event
        fields = []
