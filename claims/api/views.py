"""Claims over HTTP: read (a member its tenants' claims), release (a tenant admin of the claim's tenant, or a
platform admin) through claims.phases.claims_release, power its node (those, and operators) through
claims.power.claim_power, and adopt a running server (admins)."""
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from claims.filtersets import ClaimGroupFilterSet, NodeClaimFilterSet
from claims.lifecycle import LIVE
from claims.models import ClaimGroup, NodeClaim
from claims.presenters import claim_groups_rows
from claims.selectors import claim_groups_visible, claims_visible
from claims.phases import claims_release
from claims.power import claim_power
from claims.providers import claims_extras
from claims.restore import AdoptRefused, host_adopt
from core import scoping
from core.api import Conflict, ScopedPermission, ScopedViewMixin, actor, field_errors
from hosts.api.serializers import HostSerializer

from .serializers import (AdoptSerializer, ClaimGroupSerializer, ClaimPowerSerializer, NodeClaimSerializer,
                          ReleaseSerializer)


class NodeClaimViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = NodeClaimSerializer
    filterset_class = NodeClaimFilterSet
    member_actions = frozenset({"release", "power"})
    operator_actions = frozenset({"power"})

    def get_queryset(self):
        return claims_visible(self.request.user,
                              NodeClaim.objects.select_related("tenant", "provider", "node_type", "replacement_of"))

    def get_serializer(self, *args, **kwargs):
        # The groups of the claims shown, with their state, read once for the page (two queries).
        instance = args[0] if args else None
        claims = instance if isinstance(instance, list) else [instance] if isinstance(instance, NodeClaim) else []
        ids = {c.group_id for c in claims if c.group_id}
        context = {**self.get_serializer_context(), "extras": claims_extras(claims)} if claims else {}
        if ids:
            context["groups"] = {g.pk: g for g in claim_groups_rows(ClaimGroup.objects.filter(pk__in=ids))}
        if context:
            kwargs["context"] = context
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

    @extend_schema(request=ClaimPowerSerializer, responses={
        200: NodeClaimSerializer,
        409: OpenApiResponse(description="the claim has no host, or a flow drives the host's power now")})
    @action(detail=True, methods=["post"])
    def power(self, request, pk=None):
        """Power the claim's node on, off or cycle it: its host through its BMC, or the machine an external provider
        made for it. The request is in the Event log at once, with the claim; a worker sends it and records the
        answer. Not while a flow drives the host (provisioning, say)."""
        claim = self.get_object()
        body = ClaimPowerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        claim_power(claim=claim, action=body.validated_data["action"], actor=actor(request),
                    reason=body.validated_data["reason"] or f"asked by {request.user.username} for claim {claim.name}")
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


class HostAdoptView(APIView):
    """POST /api/v1/hosts/adopt/: adopt a server that already runs an OS and serves a tenant's node (admins), as
    `manage.py adopt` does: registered as provisioned, neither powered nor re-imaged, bound to its node's claim."""

    permission_classes = [ScopedPermission]

    @extend_schema(request=AdoptSerializer, responses={
        201: HostSerializer,
        400: OpenApiResponse(description="not adopted, and nothing changed: a field, the BMC (unreachable, wrong "
                                         "credentials, no such MAC, powered off), no such node, a node of another "
                                         "tenant, no claim waiting for it")})
    def post(self, request):
        if not scoping.is_admin(request.user):
            raise exceptions.PermissionDenied("adopting a server is for admins")
        body = AdoptSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        values = dict(body.validated_data)
        tenant, claim = values.pop("tenant"), values.pop("claim")
        try:
            host = host_adopt(values=values, actor=actor(request), tenant=tenant, claim=claim)
        except AdoptRefused as exc:
            raise exceptions.ValidationError({"non_field_errors": [str(exc)]}) from None
        except DjangoValidationError as exc:
            raise exceptions.ValidationError(field_errors(exc)) from None
        return Response(HostSerializer(host, context={"request": request}).data, status=status.HTTP_201_CREATED)
