"""Events as JSON. Those who may not see BMC details get messages with the hosts' BMC addresses masked and
without the raw `data`."""
from rest_framework import serializers

from events.models import Event

BMC_MASK = "(BMC)"


class EventSerializer(serializers.ModelSerializer):
    host = serializers.IntegerField(source="host_id", read_only=True, allow_null=True)
    claim = serializers.IntegerField(source="claim_id", read_only=True, allow_null=True)
    tenant = serializers.IntegerField(source="tenant_id", read_only=True, allow_null=True)

    class Meta:
        model = Event
        fields = ["id", "created_at", "kind", "object_type", "object_name", "host", "claim", "tenant", "from_state",
                  "to_state", "step", "message", "duration_s", "actor", "data"]
        read_only_fields = fields


class TenantEventSerializer(EventSerializer):
    message = serializers.SerializerMethodField()

    class Meta(EventSerializer.Meta):
        fields = [f for f in EventSerializer.Meta.fields if f != "data"]
        read_only_fields = fields

    def get_message(self, obj) -> str:
        text = obj.message
        for address in self.context.get("bmc_addresses", {}).get(obj.host_id, ()):
            text = text.replace(address, BMC_MASK)
        return text


EventSerializer.MEMBER_VARIANT = TenantEventSerializer  # the schema: `data` is optional (core.api hooks)
