"""Claims as JSON: what a tenant asked for, which node it got, and where it is in its life."""
from rest_framework import serializers

from claims.models import NodeClaim
from core.api import StrictSerializer


class ConditionSerializer(serializers.Serializer):
    type = serializers.CharField()
    status = serializers.CharField()
    lastTransitionTime = serializers.DateTimeField(allow_null=True)


class NodeClaimSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.CharField(source="pool_name", read_only=True)
    provider = serializers.SlugRelatedField(slug_field="name", read_only=True)
    node_type = serializers.SlugRelatedField(slug_field="name", read_only=True)
    host = serializers.CharField(source="host_name", read_only=True)
    conditions = ConditionSerializer(many=True, read_only=True)

    class Meta:
        model = NodeClaim
        fields = ["id", "name", "namespace", "tenant", "pool", "provider", "node_type", "host", "node_name",
                  "ip_address", "phase", "phase_changed_at", "reason", "message", "attempts", "requirements",
                  "properties", "node_labels", "taints", "conditions", "created_at", "scheduled_at", "provisioned_at",
                  "joined_at", "available_at", "released_at"]
        read_only_fields = fields


class ReleaseSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")
