"""Tenants, pools and the site's configuration as JSON. Secrets are write-only: a tenant's kubeconfig
can be set, never read back (`has_kubeconfig` says whether one is set)."""
from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from pools.models import NodeEnvironment, NodePool, NodeProvider, NodeType, OSImage, Tenant
from vmetal_console import scoping

from .base import StrictModelSerializer

# Shapes of the JSON fields, checked before Model.clean() runs: today's clean() assumes them and fails with a
# TypeError on, say, `values: 5` (a 500, and for host selectors and resources a saved row that breaks the
# allocator). Once the models check shapes themselves these become redundant (see the review note).
SCALAR = (str, int, float)


def _scalar(value) -> bool:
    return isinstance(value, SCALAR) and not isinstance(value, bool)


def _finite_quantity(value) -> bool:
    from math import isfinite

    from pools.models import parse_quantity

    try:
        return _scalar(value) and isfinite(parse_quantity(value))
    except (ValueError, OverflowError):
        return False


def check_node_type_selector(value):
    if not isinstance(value, list):
        raise serializers.ValidationError("must be a list of {property, operator, value(s)}")
    for i, req in enumerate(value):
        if not isinstance(req, dict):
            raise serializers.ValidationError(f"[{i}]: must be a mapping {{property, operator, value(s)}}")
        if "operator" in req and not isinstance(req["operator"], str):
            raise serializers.ValidationError(f"[{i}].operator: must be a string")
        if "value" in req and req["value"] is not None and not _scalar(req["value"]):
            raise serializers.ValidationError(f"[{i}].value: must be a string or a number")
        values = req.get("values")
        if values is not None and not (isinstance(values, list) and all(_scalar(v) for v in values)):
            raise serializers.ValidationError(f"[{i}].values: must be a list of strings")
    return value


def check_taints(value):
    if isinstance(value, list):
        for i, taint in enumerate(value):
            if isinstance(taint, dict) and not all(isinstance(v, str) for v in taint.values()):
                raise serializers.ValidationError(f"[{i}]: key, value and effect are strings")
    return value


def check_disruption(value):
    if isinstance(value, dict):
        for key in ("consolidationPolicy", "consolidateAfter"):
            if key in value and value[key] is not None and not _scalar(value[key]):
                raise serializers.ValidationError(f"{key}: must be a string")
        budgets = value.get("budgets")
        if budgets is not None and not (isinstance(budgets, list) and all(isinstance(b, dict) for b in budgets)):
            raise serializers.ValidationError("budgets: must be a list of {nodes: ...}")
    return value


def check_limits(value):
    if isinstance(value, dict):
        for key, amount in value.items():
            if not _finite_quantity(amount):
                raise serializers.ValidationError(f"{key}: {amount!r} is not a quantity")
    return value


def check_host_selector(value):
    if isinstance(value, dict):
        labels = value.get("matchLabels")
        if labels is not None and not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
            raise serializers.ValidationError("matchLabels: must map label keys to strings")
        expressions = value.get("matchExpressions")
        if expressions is not None:
            if not isinstance(expressions, list):
                raise serializers.ValidationError("matchExpressions: must be a list of {key, operator, values}")
            for i, expr in enumerate(expressions):
                if not isinstance(expr, dict):
                    raise serializers.ValidationError(f"matchExpressions[{i}]: must be a mapping")
                if not all(isinstance(expr.get(k, ""), str) for k in ("key", "operator")):
                    raise serializers.ValidationError(f"matchExpressions[{i}]: key and operator are strings")
                values = expr.get("values")
                if values is not None and not (isinstance(values, list) and all(_scalar(v) for v in values)):
                    raise serializers.ValidationError(f"matchExpressions[{i}].values: must be a list of strings")
    return value


def check_resources(value):
    if isinstance(value, dict):
        for key, amount in value.items():
            if not _finite_quantity(amount):
                raise serializers.ValidationError(f"{key}: {amount!r} is not a quantity")
    return value


def _request_user(serializer):
    request = serializer.context.get("request")
    return getattr(request, "user", None)


class TenantSerializer(StrictModelSerializer):
    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=False,
                                       style={"input_type": "password"},
                                       help_text="the tenant API's kubeconfig; write-only, never returned")
    has_kubeconfig = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["id", "name", "namespace", "display_name", "api_endpoint", "kubeconfig", "has_kubeconfig",
                  "join_mode", "quota_nodes", "private_nodes_enabled", "provider_properties", "deleting_since",
                  "created_at", "updated_at"]
        read_only_fields = ["deleting_since", "created_at", "updated_at"]

    def get_has_kubeconfig(self, obj) -> bool:
        return bool(obj.kubeconfig)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.instance, models.Model) and "name" in self.fields:
            self.fields["name"].read_only = True  # pools, claims and events name the tenant


class NodePoolSerializer(StrictModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", queryset=Tenant.objects.none())
    provider = serializers.SlugRelatedField(slug_field="name", queryset=NodeProvider.objects.all())
    version = serializers.IntegerField(
        required=False, min_value=1,
        help_text="optimistic concurrency: the version this change is based on (or send If-Match: W/\"<version>\"); "
                  "a stale one gets 412 and changes nothing")

    class Meta:
        model = NodePool
        fields = ["id", "tenant", "name", "provider", "kind", "quantity", "node_type_selector", "node_labels",
                  "taints", "termination_grace_period", "profile", "limits", "disruption", "expire_after", "weight",
                  "version", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        user = _request_user(self)
        if "tenant" in self.fields and user is not None:
            # A pool can be made only for a tenant the caller may change; others do not exist for them.
            writer = scoping.role(user) in (scoping.ADMIN, scoping.MEMBER)
            self.fields["tenant"].queryset = scoping.tenants(user) if writer else Tenant.objects.none()
        if isinstance(self.instance, models.Model):
            for name in ("tenant", "name"):
                if name in self.fields:
                    self.fields[name].read_only = True

    validate_node_type_selector = staticmethod(check_node_type_selector)
    validate_taints = staticmethod(check_taints)
    validate_disruption = staticmethod(check_disruption)
    validate_limits = staticmethod(check_limits)

    def validate(self, attrs):
        if self.instance is None and "version" in attrs:
            raise serializers.ValidationError({"version": ["a new pool has no version yet"]})
        return super().validate(attrs)


class NodeProviderSerializer(StrictModelSerializer):
    class Meta:
        model = NodeProvider
        fields = ["id", "name", "kind", "display_name", "properties", "config", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]


class CapacitySerializer(serializers.Serializer):
    total = serializers.IntegerField()
    available = serializers.IntegerField()
    provisioned = serializers.IntegerField()


class NodeTypeSerializer(StrictModelSerializer):
    provider = serializers.SlugRelatedField(slug_field="name", queryset=NodeProvider.objects.all())
    effective_cost = serializers.SerializerMethodField()
    capacity = serializers.SerializerMethodField()

    class Meta:
        model = NodeType
        fields = ["id", "name", "provider", "display_name", "zone", "region", "properties", "resources", "cost",
                  "effective_cost", "host_selector", "declared_in_provider", "capacity", "created_at", "updated_at"]
        read_only_fields = ["declared_in_provider", "created_at", "updated_at"]

    validate_host_selector = staticmethod(check_host_selector)
    validate_resources = staticmethod(check_resources)

    def get_effective_cost(self, obj) -> int | None:
        try:
            return obj.effective_cost()
        except (ValueError, OverflowError):
            return None

    @extend_schema_field(CapacitySerializer(allow_null=True))
    def get_capacity(self, obj) -> dict | None:
        """Derived from the hosts the type's selector matches; the view computes it once per page."""
        return self.context.get("capacity", {}).get(obj.pk)


class NodeEnvironmentSerializer(StrictModelSerializer):
    provider = serializers.SlugRelatedField(slug_field="name", queryset=NodeProvider.objects.all(),
                                            required=False, allow_null=True)
    tenant = serializers.SlugRelatedField(slug_field="name", queryset=Tenant.objects.all(), required=False,
                                          allow_null=True)

    class Meta:
        model = NodeEnvironment
        fields = ["id", "name", "namespace", "display_name", "provider", "tenant", "properties", "created_at",
                  "updated_at"]
        read_only_fields = ["created_at", "updated_at"]


class OSImageSerializer(StrictModelSerializer):
    class Meta:
        model = OSImage
        fields = ["id", "name", "display_name", "description", "url", "checksum", "checksum_type", "format",
                  "size_bytes", "properties", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        extra_kwargs = {"size_bytes": {"min_value": 0}}
