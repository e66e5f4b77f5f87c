"""Hosts over HTTP. Admins register hosts (the same checks as a BareMetalHost manifest), change their labels
and settings, and act on them (maintenance on/off, retry) through hosts.services; auditors read every host;
a tenant member sees only the hosts serving its claims, without BMC details."""
from django.db import transaction
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from events.services import object_update
from hosts.filtersets import BareMetalHostFilterSet
from hosts.models import BareMetalHost
from hosts.services import host_retry, host_set_maintenance
from pools.api.base import ScopedViewMixin, actor
from vmetal_console import scoping

from .serializers import HostSerializer, MaintenanceSerializer, RetrySerializer, TenantHostSerializer

CONFLICT = OpenApiResponse(description="not allowed in the host's current state (the message says why)")


@extend_schema_view(list=extend_schema(description="Members get their own nodes, without BMC fields."))
class HostViewSet(ScopedViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, viewsets.GenericViewSet):
    serializer_class = HostSerializer
    filterset_class = BareMetalHostFilterSet

    def get_queryset(self):
        return scoping.hosts(self.request.user, BareMetalHost.objects.select_related("claim__tenant"))

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False) or scoping.may_see_bmc(self.request.user):
            return HostSerializer
        return TenantHostSerializer

    def tenant_of(self, obj):
        return None  # hosts belong to the platform: only admins change them

    def perform_create(self, serializer):
        host = BareMetalHost()
        with transaction.atomic():
            object_update(host, dict(serializer.validated_data), actor=actor(self.request), object_type="host",
                          self_link="host")
        serializer.instance = host  # registering: the register flow picks it up (hosts.flows.drive_stale)

    def perform_update(self, serializer):
        host = serializer.instance
        with transaction.atomic():
            object_update(host, dict(serializer.validated_data), actor=actor(self.request), object_type="host",
                          self_link="host")

    @extend_schema(request=MaintenanceSerializer, responses={200: HostSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def maintenance(self, request, pk=None):
        host = self.get_object()
        body = MaintenanceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        host_set_maintenance(host=host, on=body.validated_data["on"], actor=actor(request),
                             reason=body.validated_data["reason"])
        return Response(self.get_serializer(self.get_object()).data)

    @extend_schema(request=RetrySerializer, responses={200: HostSerializer, 409: CONFLICT})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        host = self.get_object()
        body = RetrySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        host_retry(host=host, actor=actor(request), reason=body.validated_data["reason"])
        return Response(self.get_serializer(self.get_object()).data)
