"""The console's filters for times, one format on every page: `when` (the date with its year and the time, UTC)
and `since` (how long ago, as static/console/live.js refreshes it)."""
from datetime import datetime

from django import template
from django.template.defaultfilters import date as date_filter
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.timesince import timesince

register = template.Library()

WHEN = "Y-m-d H:i:s"


@register.filter
def when(value) -> str:
    """The one shown format: 2026-12-05 07:44:50 (the console runs in UTC). Takes an ISO 8601 string too (a check's
    time kept in the cache)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if not value:
        return ""
    return date_filter(timezone.localtime(value) if timezone.is_aware(value) else value, WHEN)


@register.filter
def since(value, now: datetime | None = None) -> str:
    """How long ago; under a minute reads "less than a minute", not Django's "0 minutes"."""
    if not value:
        return ""
    now = now or timezone.now()
    if (now - value).total_seconds() < 60:
        return "less than a minute"
    return timesince(value, now)
