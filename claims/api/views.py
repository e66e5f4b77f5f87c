"""Claims over HTTP: read (a member its tenants' claims), and release (a member of the claim's tenant, or
an admin) through claims.services.claims_release."""
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from claims.filtersets import NodeClaimFilterSet
from claims.lifecycle import LIVE
from claims.models import NodeClaim
from claims.selectors import claims_visible
from claims.services import claims_release
from core.api import Conflict, ScopedViewMixin, actor

from .serializers import NodeClaimSerializer, ReleaseSerializer


class NodeClaimViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeClaimSerializer
    filterset_class = NodeClaimFilterSet
    member_actions = frozenset({"release"})

    def get_queryset(self):
        return claims_visible(self.request.user,
                              NodeClaim.objects.select_related("tenant", "provider", "node_type"))

    @extend_schema(request=ReleaseSerializer, responses={
        200: NodeClaimSerializer, 409: OpenApiResponse(description="already released or being released")})
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        """Give the node back: drained, cleaned, verified and returned to the free pool. The pool keeps its
        quantity, so the reconciler asks for a replacement; scale the pool down to have fewer nodes."""
        claim = self.get_object()
        body = ReleaseSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if claim.phase not in LIVE:
            raise Conflict(f"claim {claim.name} is {claim.phase}: nothing to release")
        claims_release(claims=[claim], actor=actor(request),
                       reason=body.validated_data["reason"] or f"released by {request.user.username}")
        return Response(self.get_serializer(self.get_object()).data)
