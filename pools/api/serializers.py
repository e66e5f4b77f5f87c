"""Tenants, pools and the site's configuration as JSON. Secrets are write-only: a tenant's kubeconfig
can be set, never read back (`has_kubeconfig` says whether one is set)."""
from django.db import models
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core import scoping
from core.api import StrictModelSerializer
from core.limits import node_count_error
from pools.api_check import tenant_api_check
from pools.capacity import environment_addresses
from pools.models import (
    FabricPartition,
    NodeEnvironment,
    NodePool,
    NodeProvider,
    NodeType,
    OSImage,
    Tenant,
)
from pools.selectors import tenants_visible

# JSON fields' shapes and values are checked by each model's clean(), which StrictModelSerializer runs: the
# same checks as the admin, the console's forms and `apply`.


def _request_user(serializer):
    request = serializer.context.get("request")
    return getattr(request, "user", None)


class FabricPartitionSerializer(serializers.ModelSerializer):
    value_text = serializers.CharField(read_only=True, help_text="as switches write it: 100, 0x8001")

    class Meta:
        model = FabricPartition
        fields = ["kind", "value", "value_text", "source", "since"]
        read_only_fields = fields


class TenantSerializer(StrictModelSerializer):
    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True, trim_whitespace=False,
                                       style={"input_type": "password"},
                                       help_text="the tenant API's kubeconfig; write-only, never returned")
    has_kubeconfig = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField(help_text="what the write just made means, for the caller (also "
                                                           "in the Warning header): a quota below current use")
    fabric_partitions = FabricPartitionSerializer(many=True, read_only=True,
                                                  help_text="the tenant's VLAN / InfiniBand partition key, given "
                                                            "with its first node; read-only")
    api_check = serializers.SerializerMethodField(
        help_text="does the tenant API (its VIP) answer: `console`, checked from the console when one tenant is "
                  "read (reused for a short while; in a list, the last result only), and `server`, the last check "
                  "from a server's network before an image was written; each with ok, the reason and when")

    class Meta:
        model = Tenant
        fields = ["id", "name", "namespace", "display_name", "api_endpoint", "kubeconfig", "has_kubeconfig",
                  "join_mode", "quota_nodes", "private_nodes_enabled", "provider_properties", "deleting_since",
                  "fabric_partitions", "created_at", "updated_at", "warnings", "api_check"]
        read_only_fields = ["deleting_since", "fabric_partitions", "created_at", "updated_at"]

    def get_has_kubeconfig(self, obj) -> bool:
        return bool(obj.kubeconfig)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "console": {"type": "object", "nullable": True}, "server": {"type": "object", "nullable": True}}})
    def get_api_check(self, obj) -> dict | None:
        if not isinstance(obj, models.Model) or not obj.pk:
            return None
        view = self.context.get("view")
        # One tenant read: a fresh check (bounded, outside any transaction); a list: what was last found.
        return tenant_api_check(obj, probe_now=getattr(view, "action", "") == "retrieve")

    def get_warnings(self, obj) -> list[str]:
        return list(self.context.get("warnings", []))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.instance, models.Model) and "name" in self.fields:
            self.fields["name"].read_only = True  # pools, claims and events name the tenant


class NodePoolSerializer(StrictModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", queryset=Tenant.objects.none())
    provider = serializers.SlugRelatedField(slug_field="name", queryset=NodeProvider.objects.all())
    # Without the database's own maximum: a quantity past POOL_MAX_NODES is refused with that bound's name.
    quantity = serializers.IntegerField(
        required=False, allow_null=True, min_value=0,
        help_text="a static pool's nodes: at most POOL_MAX_NODES (10000 unless set) and within the tenant's quota")
    version = serializers.IntegerField(
        required=False, min_value=1,
        help_text="optimistic concurrency: the version this change is based on (or send If-Match: W/\"<version>\"); "
                  "a stale one gets 412 and changes nothing")

    class Meta:
        model = NodePool
        fields = ["id", "tenant", "name", "provider", "kind", "quantity", "node_type_selector", "node_labels",
                  "taints", "termination_grace_period", "profile", "limits", "disruption", "expire_after", "weight",
                  "topology", "group", "version", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        user = _request_user(self)
        if "tenant" in self.fields and user is not None:
            # A pool can be made only for a tenant the caller may change; others do not exist for them.
            writer = scoping.role(user) in (scoping.ADMIN, scoping.MEMBER)
            self.fields["tenant"].queryset = tenants_visible(user) if writer else Tenant.objects.none()
        if isinstance(self.instance, models.Model):
            for name in ("tenant", "name"):
                if name in self.fields:
                    self.fields[name].read_only = True

    def validate_quantity(self, value):
        if node_count_error(value):
            raise serializers.ValidationError(node_count_error(value))
        return value

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


# How a host of the type is erased and verified, and the GPU health suite it must pass, before anyone gets it
# (hosts/gate/cleaning.py). The same fields as a manifest's spec.cleaning and spec.healthCheck.
RELEASE_GATE_FIELDS = ["cleaning_policy", "cleaning_fallback", "erase_concurrency", "erase_verify_share",
                       "erase_verify_full", "health_dcgm_level", "health_nccl_min_busbw_gbps"]


class NodeTypeSerializer(StrictModelSerializer):
    provider = serializers.SlugRelatedField(slug_field="name", queryset=NodeProvider.objects.all())
    repair = serializers.JSONField(required=False, help_text=(
        "the repair ladder of its hosts, as a manifest's spec.repair: {automatic: bool, ladders: {KIND: [REMEDY, "
        "...]}}; {}: every kind on its default ladder (hosts/flows/repair.py)"))
    effective_cost = serializers.SerializerMethodField()
    capacity = serializers.SerializerMethodField()

    class Meta:
        model = NodeType
        fields = ["id", "name", "provider", "display_name", "zone", "region", "properties", "resources", "cost",
                  "effective_cost", "host_selector", "sku", "health", "firmware", "gpu", "declared_in_provider",
                  *RELEASE_GATE_FIELDS, "repair", "warm_hosts", "warm_idle_minutes", "capacity", "created_at", "updated_at"]
        read_only_fields = ["declared_in_provider", "created_at", "updated_at"]

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
    addresses = serializers.SerializerMethodField(
        help_text="IPAM: size (addresses its ranges hold; null without a network or with a network-data "
                  "override), used, free, and leaked (rows whose claim is gone or holds no host, freed by the "
                  "periodic check)")

    class Meta:
        model = NodeEnvironment
        fields = ["id", "name", "namespace", "display_name", "provider", "tenant", "properties", "addresses",
                  "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def get_addresses(self, obj) -> dict:
        if not obj.pk:
            return {}
        return environment_addresses([obj]).get(obj.pk, {})


class OSImageSerializer(StrictModelSerializer):
    class Meta:
        model = OSImage
        fields = ["id", "name", "display_name", "description", "url", "checksum", "checksum_type", "format",
                  "size_bytes", "properties", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]
        extra_kwargs = {"size_bytes": {"min_value": 0}}
