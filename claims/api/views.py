"""Claims over HTTP: read (a member its tenants' claims), and release (a member of the claim's tenant, or
an admin) through claims.phases.claims_release."""
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from claims.filtersets import ClaimGroupFilterSet, NodeClaimFilterSet
from claims.lifecycle import LIVE
from claims.models import ClaimGroup, NodeClaim
from claims.presenters import claim_groups_rows
from claims.selectors import claim_groups_visible, claims_visible
from claims.phases import claims_release
from core.api import Conflict, ScopedViewMixin, actor

from .serializers import ClaimGroupSerializer, NodeClaimSerializer, ReleaseSerializer


class NodeClaimViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeClaimSerializer
    filterset_class = NodeClaimFilterSet
    member_actions = frozenset({"release"})

    def get_queryset(self):
        return claims_visible(self.request.user,
                              NodeClaim.objects.select_related("tenant", "provider", "node_type"))

    def get_serializer(self, *args, **kwargs):
        # The groups of the claims shown, with their state, read once for the page (two queries).
        instance = args[0] if args else None
        claims = instance if isinstance(instance, list) else [instance] if isinstance(instance, NodeClaim) else []
        ids = {c.group_id for c in claims if c.group_id}
        if ids:
            kwargs["context"] = {**self.get_serializer_context(),
                                 "groups": {g.pk: g for g in claim_groups_rows(ClaimGroup.objects.filter(pk__in=ids))}}
        return super().get_serializer(*args, **kwargs)

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


class ClaimGroupViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    """All-or-nothing groups (a pool's `group`, or a dynamic pool's decision): each with its state, where it was
    placed (or why it waits) and its members. A member sees their tenants' groups; other tenants' are 404."""

    serializer_class = ClaimGroupSerializer
    filterset_class = ClaimGroupFilterSet

    def get_queryset(self):
        return claim_groups_visible(self.request.user, ClaimGroup.objects.select_related("tenant")
                                    .order_by("-created_at", "-pk"))

    def get_serializer(self, *args, **kwargs):
        instance = args[0] if args else None
        if isinstance(instance, list | ClaimGroup):  # the state and members of each, read in two queries
            rows = claim_groups_rows(instance if isinstance(instance, list) else [instance])
            args = (rows if isinstance(instance, list) else rows[0], *args[1:])
        return super().get_serializer(*args, **kwargs)
