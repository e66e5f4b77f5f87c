"""The Event log over HTTP, read only, scoped: a member sees its tenants' events."""
from urllib.parse import urlsplit

from rest_framework import generics, viewsets
from rest_framework.permissions import BasePermission

from core import scoping
from core.api import ScopedViewMixin
from events.audit import audit_events
from events.filtersets import AuditFilterSet, EventFilterSet
from events.models import Event
from events.selectors import events_visible

from .serializers import AuditRowSerializer, EventSerializer, TenantEventSerializer


class EventViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = EventSerializer
    filterset_class = EventFilterSet

    def get_queryset(self):
        return events_visible(self.request.user)

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False) or scoping.may_see_bmc(self.request.user):
            return EventSerializer
        return TenantEventSerializer

    def get_serializer(self, *args, **kwargs):
        if args and args[0] is not None and not scoping.may_see_bmc(self.request.user):
            events = list(args[0]) if kwargs.get("many") else [args[0]]
            kwargs["context"] = {**self.get_serializer_context(), "bmc_addresses": _bmc_addresses(events)}
        return super().get_serializer(*args, **kwargs)


def _bmc_addresses(events) -> dict[int, tuple[str, ...]]:
    """{host id: (BMC address, its host:port)} for the hosts these events name: what a message may quote."""
    ids = {e.host_id for e in events if e.host_id}
    out = {}
    hosts = Event._meta.get_field("host").related_model  # events know hosts only through their link
    for pk, address in hosts.objects.filter(pk__in=ids).values_list("pk", "bmc_address"):
        netloc = urlsplit(address).netloc
        out[pk] = tuple(a for a in (address, netloc) if a)
    return out


class SeesEverything(BasePermission):
    message = "the audit trail spans every tenant: admins and auditors only"

    def has_permission(self, request, view):
        return scoping.sees_everything(request.user)


class AuditView(generics.ListAPIView):
    """GET /api/v1/audit/?since=…&until=…: the audit trail (docs/audit.md), oldest first, paginated; what
    `manage.py audit export` writes, row for row."""

    permission_classes = [SeesEverything]
    serializer_class = AuditRowSerializer
    filterset_class = AuditFilterSet

    def get_queryset(self):
        return audit_events()
