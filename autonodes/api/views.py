"""Auto Nodes over HTTP, read only and tenant-scoped: a pool's status and the decisions."""
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from autonodes.filtersets import DecisionFilterSet
from autonodes.selectors import decisions_visible, pool_status
from core.api import ScopedPermission, ScopedViewMixin
from pools.models import NodePool
from pools.selectors import pools_visible

from .serializers import DecisionSerializer, PoolStatusSerializer

STATUS_DECISIONS = 10


class PoolStatusView(APIView):
    """GET /api/v1/pools/<id>/status/: what the pool page shows. Members see their tenants' pools; others 404."""

    permission_classes = [ScopedPermission]

    @extend_schema(responses={200: PoolStatusSerializer}, operation_id="pools_status_retrieve",
                   parameters=[OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)])
    def get(self, request, id: str):  # the path's name, as the other pool URLs have it
        if len(id) > 18:  # past PostgreSQL's bigint: no such pool (not a failed query)
            raise Http404("no such pool")
        pool = pools_visible(request.user, NodePool.objects.select_related("tenant", "provider")).filter(pk=int(id)).first()
        if pool is None:
            raise Http404("no such pool")
        return Response(PoolStatusSerializer(pool_status(pool, decisions=STATUS_DECISIONS)).data)


class DecisionViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    """Auto Nodes' decisions (decision Events), newest first: why each dynamic pool added, did not add, kept or
    released nodes. Filters: tenant (id), pool (id), pool_name, reason, since, until."""

    serializer_class = DecisionSerializer
    filterset_class = DecisionFilterSet

    def get_queryset(self):
        return decisions_visible(self.request.user)
