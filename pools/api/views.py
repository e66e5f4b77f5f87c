"""Tenants, pools and the site's configuration over HTTP. Every write goes through a service
(pools.services, events.services.object_update), so it is validated by Model.clean() and recorded in the
Event log with the caller as actor."""
import re

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import exceptions, viewsets
from rest_framework.response import Response

from core import scoping
from core.api import ScopedViewMixin, actor
from core.transactions import retry_on_deadlock
from events.choices import ObjectType
from events.services import object_delete, object_update
from pools.capacity import capacity_shown
from pools.filtersets import (
    NodeEnvironmentFilterSet,
    NodePoolFilterSet,
    NodeProviderFilterSet,
    NodeTypeFilterSet,
    OSImageFilterSet,
    TenantFilterSet,
)
from pools.models import (
    NodeEnvironment,
    NodePool,
    NodeProvider,
    NodeType,
    OSImage,
)
from pools.selectors import node_environments_visible, pools_visible, tenants_visible
from pools.services import (
    StaleVersion,
    node_type_delete,
    pool_create,
    pool_delete,
    pool_update,
    tenant_api_changed,
    tenant_delete,
    tenant_quota_warning,
)

from .serializers import (
    NodeEnvironmentSerializer,
    NodePoolSerializer,
    NodeProviderSerializer,
    NodeTypeSerializer,
    OSImageSerializer,
    TenantSerializer,
)


class ConfigViewSet(ScopedViewMixin, viewsets.ModelViewSet):
    """Objects written with object_update: validated, saved only when something changed, one Event each.
    Everyone signed in reads them (members need to know what can be ordered); admins write (no
    member_actions)."""

    object_type = ""  # the Event log's name for these objects
    self_link = ""

    def event_tenant(self, obj, values: dict | None = None):
        """The tenant an Event about this object belongs to (members see their tenants' Events)."""
        values = values or {}
        return values["tenant"] if "tenant" in values else getattr(obj, "tenant", None)

    def perform_create(self, serializer):
        self._write(serializer.Meta.model(), serializer)

    def perform_update(self, serializer):
        self._write(serializer.instance, serializer)

    def _write(self, obj, serializer):
        values = dict(serializer.validated_data)
        with transaction.atomic():
            object_update(obj, values, actor=actor(self.request), object_type=self.object_type,
                          tenant=self.event_tenant(obj, values), self_link=self.self_link)
        serializer.instance = obj

    def perform_destroy(self, instance):
        with transaction.atomic():
            object_delete(instance, actor=actor(self.request), object_type=self.object_type,
                          tenant=self.event_tenant(instance))


class TenantViewSet(ConfigViewSet):
    """Tenants (VirtualClusterInstances). Members read their own; admins create, change and delete."""

    serializer_class = TenantSerializer
    filterset_class = TenantFilterSet
    object_type = ObjectType.TENANT
    self_link = "tenant"

    def get_queryset(self):
        return tenants_visible(self.request.user).prefetch_related("fabric_partitions")

    def event_tenant(self, obj, values=None):
        return None  # self_link fills it

    def perform_update(self, serializer):
        super().perform_update(serializer)
        if {"api_endpoint", "kubeconfig"} & set(serializer.validated_data):
            tenant_api_changed(tenant=serializer.instance)
        # A quota below what the pools ask for is saved (nothing is released); the caller is told, in the body
        # and, as RFC 7234 has it for any client, in a Warning header.
        if "quota_nodes" in serializer.validated_data:
            warning = tenant_quota_warning(tenant=serializer.instance, quota=serializer.instance.quota_nodes)
            serializer.context["warnings"] = [warning] if warning else []

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        warnings = response.data.get("warnings") if isinstance(response.data, dict) else None
        if warnings:
            response["Warning"] = ", ".join(f'299 - "{warning}"' for warning in warnings)
        return response

    @extend_schema(responses={204: None, 202: OpenApiResponse(description="being deleted: its claims release first")})
    def destroy(self, request, *args, **kwargs):
        """Its pools go at once (their claims release: drain, delete the Node, clean the host); the tenant
        goes when every claim is Released: 204 when that is at once, 202 while claims still release."""
        tenant = self.get_object()
        if tenant_delete(tenant=tenant, actor=actor(request)):
            return Response(status=204)
        releasing = tenant.claims.exclude(phase="Released").count()
        return Response({"detail": f"tenant {tenant.name} is being deleted: {releasing} claim(s) still release"},
                        status=202)


class NodeProviderViewSet(ConfigViewSet):
    serializer_class = NodeProviderSerializer
    filterset_class = NodeProviderFilterSet
    queryset = NodeProvider.objects.all()
    object_type = ObjectType.NODEPROVIDER


class NodeTypeViewSet(ConfigViewSet):
    """NodeTypes with their capacity (total / available / provisioned), derived from the hosts each type's
    selector matches: one query per page, whatever the number of types."""

    serializer_class = NodeTypeSerializer
    filterset_class = NodeTypeFilterSet
    queryset = NodeType.objects.select_related("provider")
    object_type = ObjectType.NODETYPE

    def get_serializer(self, *args, **kwargs):
        if args and args[0] is not None:
            objects = list(args[0]) if kwargs.get("many") else [args[0]]
            kwargs["context"] = {**self.get_serializer_context(), "capacity": capacity_shown(objects)}
        return super().get_serializer(*args, **kwargs)

    def perform_create(self, serializer):
        super().perform_create(serializer)
        serializer.context["capacity"] = capacity_shown([serializer.instance])

    def perform_update(self, serializer):
        super().perform_update(serializer)
        serializer.context["capacity"] = capacity_shown([serializer.instance])

    def perform_destroy(self, instance):
        node_type_delete(node_type=instance, actor=actor(self.request))


class NodeEnvironmentViewSet(ConfigViewSet):
    """Networks nodes get their addresses from. One that belongs to a tenant is seen only by those who see
    that tenant; shared ones by everyone signed in."""

    serializer_class = NodeEnvironmentSerializer
    filterset_class = NodeEnvironmentFilterSet
    object_type = ObjectType.NODEENVIRONMENT

    def get_queryset(self):
        environments = NodeEnvironment.objects.select_related("provider", "tenant")
        return node_environments_visible(self.request.user, environments)


class OSImageViewSet(ConfigViewSet):
    serializer_class = OSImageSerializer
    filterset_class = OSImageFilterSet
    queryset = OSImage.objects.all()
    object_type = ObjectType.OSIMAGE


# --- pools ----------------------------------------------------------------------------------------

IF_MATCH = OpenApiParameter(
    "If-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description='The pool\'s ETag as last read (W/"<version>"); a stale one gets 412 and changes nothing.')
ETAG = re.compile(r'^\s*(?:W/)?"(\d{1,18})"\s*$')


def pool_etag(pool: NodePool) -> str:
    return f'W/"{pool.version}"'


def expected_version(request, body_version: int | None) -> int | None:
    """The version a change is based on: If-Match (`*` means any), else the body's `version`."""
    header = request.headers.get("If-Match")
    if header is None or header.strip() == "*":
        return body_version
    match = ETAG.match(header)
    if not match:
        raise exceptions.ValidationError({"If-Match": ['must be one ETag such as W/"3"']})
    version = int(match.group(1))
    if body_version is not None and body_version != version:
        raise exceptions.ValidationError({"version": [f"differs from If-Match ({version})"]})
    return version


def _stale(pool: NodePool, expected: int) -> StaleVersion:
    return StaleVersion(f"pool {pool} changed meanwhile (version {pool.version}, not {expected})")


@extend_schema_view(
    retrieve=extend_schema(description="A pool; its ETag header (W/\"<version>\") goes back in If-Match."),
    update=extend_schema(parameters=[IF_MATCH], responses={200: NodePoolSerializer, 412: OpenApiResponse(
        description="stale version: changed meanwhile; nothing was changed")}),
    partial_update=extend_schema(parameters=[IF_MATCH], responses={200: NodePoolSerializer, 412: OpenApiResponse(
        description="stale version: changed meanwhile; nothing was changed")}),
)
class NodePoolViewSet(ScopedViewMixin, viewsets.ModelViewSet):
    """A tenant's pools. Members create, change and delete their own tenants' pools; static quantities stay
    within the tenant's quota (400 otherwise, nothing changed). Changes are optimistic: send the version
    you read (If-Match or `version`); a stale one gets 412."""

    serializer_class = NodePoolSerializer
    filterset_class = NodePoolFilterSet
    member_actions = frozenset({"create", "update", "partial_update", "destroy"})

    def get_queryset(self):
        return pools_visible(self.request.user, NodePool.objects.select_related("tenant", "provider"))

    def retrieve(self, request, *args, **kwargs):
        pool = self.get_object()
        return Response(self.get_serializer(pool).data, headers={"ETag": pool_etag(pool)})

    def perform_create(self, serializer):
        values = dict(serializer.validated_data)
        tenant = values.pop("tenant")
        if not scoping.may_change_tenant(self.request.user, tenant):
            raise exceptions.PermissionDenied(f"you may not change tenant {tenant.name}")
        serializer.instance = pool_create(tenant=tenant, values=values, actor=actor(self.request))

    def create(self, request, *args, **kwargs):
        response = super().create(request, *args, **kwargs)
        response["ETag"] = f'W/"{response.data["version"]}"'
        return response

    def update(self, request, *args, **kwargs):
        partial = kwargs.pop("partial", False)
        pool = self.get_object()
        serializer = self.get_serializer(pool, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        values = dict(serializer.validated_data)
        expected = expected_version(request, values.pop("version", None))
        pool = pool_update(pool=pool, values=values, expected_version=expected, actor=actor(request))
        return Response(self.get_serializer(pool).data, headers={"ETag": pool_etag(pool)})

    @extend_schema(parameters=[IF_MATCH])
    def destroy(self, request, *args, **kwargs):
        return super().destroy(request, *args, **kwargs)

    @retry_on_deadlock()
    @transaction.atomic
    def perform_destroy(self, instance):
        expected = expected_version(self.request, None)
        locked = (NodePool.objects.select_for_update(of=("self",)).select_related("tenant", "provider")
                  .get(pk=instance.pk))
        if expected is not None and locked.version != expected:
            raise _stale(locked, expected)
        pool_delete(pool=locked, actor=actor(self.request))
