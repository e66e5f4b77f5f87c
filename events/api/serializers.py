"""Events as JSON. Those who may not see BMC details get messages with the hosts' BMC addresses masked and
without the raw `data`."""
from rest_framework import serializers

from events.audit import audit_row
from events.choices import EventKind
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


class AuditRowSerializer(serializers.Serializer):
    """One audit row (events.audit.audit_row), schema version 1: docs/audit.md."""

    id = serializers.IntegerField()
    at = serializers.CharField(help_text="when, ISO 8601 in UTC")
    actor = serializers.CharField(help_text="user:NAME (console, API, admin) or cli:LOGIN (manage.py); security "
                                            "events: who the console saw")
    via = serializers.CharField(help_text='"session", "token PREFIX (read-only|read-write)", "manage.py", or empty')
    role = serializers.CharField(help_text='"admin", "auditor", "member of TENANT", or empty')
    address = serializers.CharField(help_text="the client's address, empty outside a request")
    kind = serializers.ChoiceField(choices=EventKind.choices)
    object_type = serializers.CharField()
    object = serializers.CharField()
    tenant = serializers.CharField(help_text="the tenant concerned, or empty")
    message = serializers.CharField()
    before = serializers.DictField(help_text="the fields changed, as they were (secrets: (set) or (empty))")
    after = serializers.DictField(help_text="the fields changed, as they became")
    schema = serializers.IntegerField(help_text="this schema's version: 1")

    def to_representation(self, instance):
        return audit_row(instance)
