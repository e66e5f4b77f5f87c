"""The REST API under /api/v1/ (tenant-scoped), its OpenAPI 3 schema at /api/schema/ and
browsable docs at /api/docs/ (Swagger UI) and /api/redoc/."""
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from access.api.views import TokenViewSet
from autonodes.api.views import DecisionViewSet, PoolStatusView
from claims.api.views import ClaimGroupViewSet, HostAdoptView, NodeClaimViewSet
from events.api.views import AuditView, EventViewSet
from hosts.api.views import CapacityView, EraseCertificateViewSet, HealthRunViewSet, HostViewSet, RepairView
from manifests.api import ApplyView
from pools.api.views import (NodeEnvironmentViewSet, NodePoolViewSet, NodeProviderViewSet, NodeTypeViewSet,
                             OSImageViewSet, TenantViewSet)

# The trailing slash is optional (/api/v1/pools and /api/v1/pools/ both work; the schema shows the latter).
router = DefaultRouter(trailing_slash="/?")
router.register("tenants", TenantViewSet, basename="tenant")
router.register("pools", NodePoolViewSet, basename="pool")
router.register("claims", NodeClaimViewSet, basename="claim")
router.register("claim-groups", ClaimGroupViewSet, basename="claim-group")
router.register("hosts", HostViewSet, basename="host")
router.register("erase-certificates", EraseCertificateViewSet, basename="erase-certificate")
router.register("health-runs", HealthRunViewSet, basename="health-run")
router.register("nodeproviders", NodeProviderViewSet, basename="nodeprovider")
router.register("nodetypes", NodeTypeViewSet, basename="nodetype")
router.register("nodeenvironments", NodeEnvironmentViewSet, basename="nodeenvironment")
router.register("osimages", OSImageViewSet, basename="osimage")
router.register("events", EventViewSet, basename="event")
router.register("tokens", TokenViewSet, basename="token")
router.register("decisions", DecisionViewSet, basename="decision")

v1 = [
    re_path(r"^apply/?$", ApplyView.as_view(), name="apply"),
    re_path(r"^capacity/?$", CapacityView.as_view(), name="capacity"),
    re_path(r"^audit/?$", AuditView.as_view(), name="audit"),
    re_path(r"^repair/?$", RepairView.as_view(), name="repair"),
    re_path(r"^hosts/adopt/?$", HostAdoptView.as_view(), name="host-adopt"),  # before the router's hosts/<pk>
    re_path(r"^pools/(?P<id>[0-9]+)/status/?$", PoolStatusView.as_view(), name="pool-status"),
    path("", include("machines.urls")),  # OpenTofu's state backend, tofu-states
    *router.urls,
]

urlpatterns = [
    path("v1/", include((v1, "api"), namespace="api")),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("auth/", include("rest_framework.urls")),  # the browsable API's login and logout (django-axes guards it)
]
