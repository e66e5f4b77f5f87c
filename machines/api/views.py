"""OpenTofu states over the admin API: the platform's roles list them with their locks (never a state's content);
an admin releases a stuck lock, recorded as an Event."""
from django.db.models.functions import Length
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.response import Response

from core import scoping
from core.api import Conflict, actor

from ..models import TofuState
from ..tofu.backend import NotLocked, tofu_release_lock
from .serializers import TofuStateSerializer


class StaffReadsAdminsWrite(BasePermission):
    message = "OpenTofu states are the platform's: its roles read them, admins release their locks"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return scoping.sees_everything(request.user)
        return scoping.is_admin(request.user)


class TofuStateViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = TofuStateSerializer
    permission_classes = [StaffReadsAdminsWrite]
    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9._-]+"

    def get_queryset(self):
        return (TofuState.objects.select_related("provider").defer("tofu_state")
                .annotate(state_length=Length("tofu_state")).order_by("name"))

    @extend_schema(request=None, responses={200: TofuStateSerializer,
                                            409: OpenApiResponse(description="the state is not locked")})
    @action(detail=True, methods=["post"], url_path="release-lock")
    def release_lock(self, request, name=None):
        """Release a stuck lock (its run crashed or was killed holding it). A run still holding it has its next
        write refused. Recorded as an Event with the lock removed."""
        state = self.get_object()
        try:
            tofu_release_lock(name=state.name, actor=actor(request))
        except NotLocked as exc:
            raise Conflict(str(exc)) from None
        return Response(self.get_serializer(self.get_queryset().get(pk=state.pk)).data)


