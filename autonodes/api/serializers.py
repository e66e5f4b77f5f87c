"""Auto Nodes as JSON: a pool's status (its watcher, demand, nodes, limits and budgets) and its decisions. Read
only; nothing here carries a secret (no kubeconfig, no BMC detail)."""
from rest_framework import serializers

from autonodes.models import TenantWatch
from autonodes.selectors import decorate_decision
from events.choices import ObjectType
from events.models import Event


class DecisionSerializer(serializers.ModelSerializer):
    """A decision Event: its reason, the pods it was about and the claims it created or released."""

    tenant = serializers.IntegerField(source="tenant_id", read_only=True, allow_null=True)
    pool = serializers.SerializerMethodField(help_text="null: a decision about the tenant (no pool matches a pod)")
    reason = serializers.SerializerMethodField()
    reason_display = serializers.SerializerMethodField()
    pods = serializers.SerializerMethodField()
    claims = serializers.SerializerMethodField()
    node_type = serializers.SerializerMethodField()
    group = serializers.SerializerMethodField(help_text="the all-or-nothing group it asked for or released, if any")

    class Meta:
        model = Event
        fields = ["id", "created_at", "tenant", "pool", "reason", "reason_display", "message", "pods", "claims",
                  "node_type", "group", "actor"]
        read_only_fields = fields

    def _decorated(self, obj: Event) -> Event:
        if not hasattr(obj, "reason_label"):
            decorate_decision(obj)
        return obj

    def get_pool(self, obj) -> str | None:
        return obj.object_name if obj.object_type == ObjectType.POOL else None

    def get_reason(self, obj) -> str:
        return self._decorated(obj).reason

    def get_reason_display(self, obj) -> str:
        return self._decorated(obj).reason_label

    def get_pods(self, obj) -> list[str]:
        return self._decorated(obj).pods

    def get_claims(self, obj) -> list[str]:
        return self._decorated(obj).claims

    def get_node_type(self, obj) -> str:
        data = obj.data if isinstance(obj.data, dict) else {}
        return str(data.get("node_type") or "")

    def get_group(self, obj) -> str | None:
        data = obj.data if isinstance(obj.data, dict) else {}
        return str(data["group"]) if data.get("group") else None


class WatchSerializer(serializers.ModelSerializer):
    state_display = serializers.CharField(source="get_state_display", read_only=True)
    since = serializers.DateTimeField(source="updated_at", read_only=True)

    class Meta:
        model = TenantWatch
        fields = ["state", "state_display", "connected_at", "last_event_at", "error", "failures", "retry_at", "since"]
        read_only_fields = fields


class PendingPodStatusSerializer(serializers.Serializer):
    pod = serializers.SerializerMethodField()
    namespace = serializers.CharField()
    name = serializers.CharField()
    uid = serializers.CharField()
    owner = serializers.CharField()
    requests = serializers.JSONField()
    status = serializers.CharField(help_text="the decision's answer: new, launched, waiting, unservable")
    state = serializers.CharField(source="state.key",
                                  help_text="for people: new, waiting (for capacity), provisioning, ready, unservable")
    state_display = serializers.CharField(source="state.label")
    reason = serializers.CharField(source="state.detail")
    claim = serializers.CharField(source="claim.name", allow_null=True, default=None)
    pool = serializers.CharField(source="pool.name", allow_null=True, default=None)
    seen_at = serializers.DateTimeField()
    decided_at = serializers.DateTimeField(allow_null=True)

    def get_pod(self, obj) -> str:
        return f"{obj.namespace}/{obj.name}"


class NodeStatusSerializer(serializers.Serializer):
    claim = serializers.CharField(source="name")
    phase = serializers.CharField()
    node = serializers.CharField(source="node_name")
    host = serializers.CharField(source="host_name")
    node_type = serializers.CharField(source="node_type.name", allow_null=True, default=None)
    step = serializers.CharField(help_text="the host's current step while it is being installed")
    created_at = serializers.DateTimeField()
    available_at = serializers.DateTimeField(allow_null=True)
    age_s = serializers.FloatField()
    pods = serializers.IntegerField(source="use.pods", allow_null=True, default=None)
    requested = serializers.JSONField(source="use.requested", allow_null=True, default=None)
    empty_since = serializers.DateTimeField(source="use.empty_since", allow_null=True, default=None)
    do_not_disrupt = serializers.BooleanField(source="use.do_not_disrupt", allow_null=True, default=None)
    next_action = serializers.CharField(source="use.next_action", allow_null=True, default=None)
    next_action_at = serializers.DateTimeField(source="use.next_action_at", allow_null=True, default=None)
    replacement = serializers.CharField(source="use.replacement.name", allow_null=True, default=None)


class LimitSerializer(serializers.Serializer):
    resource = serializers.CharField()
    used = serializers.FloatField()
    limit = serializers.FloatField()
    limit_text = serializers.CharField()
    reached = serializers.BooleanField()


class BudgetSerializer(serializers.Serializer):
    nodes = serializers.CharField()
    schedule = serializers.CharField()
    duration = serializers.CharField()
    reasons = serializers.ListField(child=serializers.CharField())
    in_force = serializers.BooleanField(help_text="now: always without a schedule, inside its windows with one")
    until = serializers.DateTimeField(allow_null=True, help_text="when a scheduled budget in force stops being so")
    blocks = serializers.BooleanField()


class PoolStatusSerializer(serializers.Serializer):
    id = serializers.IntegerField(source="pool.pk")
    name = serializers.CharField(source="pool.name")
    tenant = serializers.CharField(source="pool.tenant.name")
    kind = serializers.CharField(source="pool.kind")
    quantity = serializers.IntegerField(source="pool.quantity", allow_null=True)
    watch = WatchSerializer(allow_null=True)
    demand_total = serializers.IntegerField()
    demand = PendingPodStatusSerializer(many=True)
    nodes = NodeStatusSerializer(many=True)
    limits = LimitSerializer(many=True)
    disruption = serializers.DictField(child=serializers.CharField())
    budgets = BudgetSerializer(many=True)
    decisions = DecisionSerializer(many=True, help_text="the newest 10; GET /api/v1/decisions/?pool=<id> has them all")
