"""Hosts over HTTP: register, change and act on hosts (admins), read them (auditors, tenants' own)."""
# Hosts over HTTP. Admins register hosts (the same checks as a BareMetalHost manifest), change their labels
# and settings, and act on them (maintenance on/off, retry) through hosts.services; operators act on them too
# but register, change and delete none; auditors read every host;
# a tenant member sees only the hosts serving its claims, without BMC details. The release gate's evidence
# (erase certificates, health runs) is read only, scoped by core.scoping.
from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)
from rest_framework import exceptions, mixins, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from access.sessions import fresh_sign_in_refusal
from core import scoping
from core.api import ScopedPermission, ScopedViewMixin, actor, or_empty
from events.choices import ObjectType
from events.services import object_update
from hosts.capacity import fleet_capacity
from hosts.certificate_views import signed_file
from hosts.choices import HostState
from hosts.filtersets import (
    BareMetalHostFilterSet,
    EraseCertificateFilterSet,
    HealthCheckRunFilterSet,
)
from hosts.models import BareMetalHost
from hosts.selectors import (
    erase_certificates_visible,
    health_runs_visible,
    hosts_visible,
    repair_cases_open,
    repair_position,
    repair_stats,
)
from hosts.services import host_create, host_delete, host_retry, host_set_maintenance
from pools.choices import FailureKind

from .serializers import (
    EraseCertificateSerializer,
    HealthRunDetailSerializer,
    HealthRunSerializer,
    HostSerializer,
    MaintenanceSerializer,
    RetrySerializer,
    TenantHostSerializer,
)

CONFLICT = OpenApiResponse(description="not allowed in the host's current state (the message says why)")


@extend_schema_view(
    list=extend_schema(description="Members get their own nodes, without BMC fields."),
    destroy=extend_schema(responses={204: None, 409: CONFLICT},
                          description="Deletes the host for good (hosts.services.host_delete): only when available, "
                                      "in maintenance, error, repair or retired, and serving no claim. Its erase "
                                      "certificates, health runs and Events are kept."))
class HostViewSet(ScopedViewMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = HostSerializer
    filterset_class = BareMetalHostFilterSet
    operator_actions = frozenset({"maintenance", "retry"})

    def get_queryset(self):
        return hosts_visible(self.request.user,
                             BareMetalHost.objects.select_related("claim__tenant", "claim__node_type",
                                                                 "kept_for_pool__tenant"))

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False) or scoping.may_see_bmc(self.request.user):
            return HostSerializer
        return TenantHostSerializer

    def tenant_of(self, obj):
        return None  # hosts belong to the platform: only admins change them

    def perform_create(self, serializer):
        # Registering, and driven on commit: the register flow checks the BMC, inspects and cleans.
        serializer.instance = host_create(values=dict(serializer.validated_data), actor=actor(self.request))

    def perform_update(self, serializer):
        host = serializer.instance
        with transaction.atomic():
            object_update(host, dict(serializer.validated_data), actor=actor(self.request),
                          object_type=ObjectType.HOST, self_link="host")

    def perform_destroy(self, instance):
        if isinstance(self.request.successful_authenticator, SessionAuthentication):
            refusal = fresh_sign_in_refusal(self.request)  # a browser's session: deleting wants a recent sign-in
            if refusal:
                raise exceptions.PermissionDenied(refusal)
        host_delete(host=instance, actor=actor(self.request))

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


@extend_schema_view(
    list=extend_schema(description="Admins and auditors see every certificate; a tenant member those of the erases "
                                   "of its own tenant's data (the previous tenant), whichever host it was."),
    retrieve=extend_schema(description="One certificate: the signed body and signature; `url` is the signed file "
                                       "as `manage.py verify-certificate` checks it, `page` the printable page."))
class EraseCertificateViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = EraseCertificateSerializer
    filterset_class = EraseCertificateFilterSet

    def get_queryset(self):
        return erase_certificates_visible(self.request.user)

    @extend_schema(responses={(200, "application/json"): OpenApiTypes.OBJECT},
                   description="The signed file, byte for byte as `manage.py verify-certificate` checks it (the "
                               "same as the console's download, for token callers).")
    @action(detail=True, methods=["get"])
    def signed(self, request, pk=None):
        return signed_file(self.get_object())


@extend_schema_view(
    list=extend_schema(description="Admins and auditors see every run; a tenant member those of the release gates "
                                   "that erased its own tenant's data."),
    retrieve=extend_schema(description="One run, with the tool's command, raw output and the parsed answer."))
class HealthRunViewSet(ScopedViewMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = HealthRunSerializer
    filterset_class = HealthCheckRunFilterSet

    def get_queryset(self):
        runs = health_runs_visible(self.request.user)
        return runs if self.action == "retrieve" else runs.defer("command", "raw_output", "raw_json", "parsed")

    def get_serializer_class(self):
        return HealthRunDetailSerializer if self.action == "retrieve" else HealthRunSerializer


class CapacityView(APIView):
    """GET /api/v1/capacity/: what the fleet board's capacity card shows (hosts.capacity.fleet_capacity), for
    admins and auditors; a tenant member is refused (the fleet is not theirs to see)."""

    permission_classes = [ScopedPermission]

    @extend_schema(responses={200: OpenApiTypes.OBJECT},
                   description="Per NodeType, per rack (the `rack` label) and in all: hosts total, free (available), "
                               "allocatable (available and not held back), serving a claim, broken (error, repair, "
                               "retesting), held (after a restore, until the world reconcile read them), and the free hosts held back by each reason (bmc_red: the BMC's last "
                               "answer failed; preflight_red: the host's preflight is red).")
    def get(self, request):
        if not scoping.sees_everything(request.user):
            raise exceptions.PermissionDenied("the fleet's capacity is for admins and auditors")
        return Response(fleet_capacity())


REPAIR_STATES = (HostState.REPAIR, HostState.REPAIRING, HostState.RETESTING)


class RepairView(APIView):
    """GET /api/v1/repair/: the repair ladder as the repair page shows it, for admins and auditors: each host in
    repair with its case (failure kind, where, the ladder, the rung reached, the attempts) and the fleet's mean
    time to repair and repair rate, per NodeType and per failure kind (hosts.selectors.repair_stats)."""

    permission_classes = [ScopedPermission]

    @extend_schema(
        parameters=[OpenApiParameter("days", {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 3660},
                                    description="the window: cases opened within it (default 30)"),
                    OpenApiParameter("node_type", str, description="only this NodeType's cases"),
                    OpenApiParameter("kind", or_empty({"type": "string", "enum": sorted(FailureKind.values)}),
                                     description="only this failure kind; empty: every kind")],
        responses={200: OpenApiTypes.OBJECT, 400: OpenApiResponse(description="a parameter that is not valid")},
        description="`hosts`: the open repair cases (host, state, kind, detail, ladder, position, outcome, summary, "
                    "attempts with remedy, outcome, times, failed step). `stats`: `fleet`, `by_node_type` and "
                    "`by_kind`, each with cases, running, repaired (by the ladder), returned (by a person), "
                    "waiting, retired, repair_rate (repaired / cases whose ladder is over) and mttr_s (mean "
                    "seconds from the failure to the return to service).")
    def get(self, request):
        if not scoping.sees_everything(request.user):
            raise exceptions.PermissionDenied("the repair pool is for admins and auditors")
        try:
            days = float(request.query_params.get("days", 30))
        except ValueError:
            raise exceptions.ValidationError({"days": ["must be a number of days, e.g. 30"]}) from None
        if not 0 < days <= 3660:
            raise exceptions.ValidationError({"days": ["must be more than 0 and at most 3660"]})
        kind = request.query_params.get("kind", "")
        if kind and kind not in FailureKind.values:
            raise exceptions.ValidationError({"kind": [f"must be one of {', '.join(FailureKind.values)}"]})
        node_type = request.query_params.get("node_type", "")[:253]
        hosts = []
        for case in repair_cases_open(list(BareMetalHost.objects.filter(state__in=REPAIR_STATES)
                                           .order_by("name").values_list("pk", flat=True))).values():
            state = case.host.state
            hosts.append({
                "host": case.host_name, "state": state, "node_type": case.node_type, "kind": case.kind,
                "detail": case.detail, "failure_step": case.failure_step, "failure": case.failure,
                "ladder": case.ladder, "position": case.position, "outcome": case.outcome, "summary": case.summary,
                "ladder_position": repair_position(ladder=case.ladder, position=case.position, outcome=case.outcome,
                                                   state=state),
                "opened_at": case.opened_at,
                "attempts": [{"position": a.position, "remedy": a.step, "outcome": a.outcome,
                              "started_at": a.started_at, "finished_at": a.finished_at, "failed_step": a.failed_step,
                              "message": a.message} for a in case.attempts.all()]})
        hosts.sort(key=lambda h: h["host"])
        return Response({"hosts": hosts, "stats": repair_stats(days=days, node_type=node_type, kind=kind)})
