"""OpenTofu states as the admin API shows them: the lock and its holder, never the state itself."""
from rest_framework import serializers

from ..models import TofuState


class TofuStateSerializer(serializers.ModelSerializer):
    provider = serializers.SlugRelatedField(slug_field="name", read_only=True)
    locked = serializers.SerializerMethodField()
    has_state = serializers.SerializerMethodField()

    class Meta:
        model = TofuState
        fields = ["name", "provider", "serial", "has_state", "locked", "lock_id", "lock_info", "locked_at",
                  "updated_at"]
        read_only_fields = fields

    def get_locked(self, obj) -> bool:
        return bool(obj.lock_id)

    def get_has_state(self, obj) -> bool:
        return bool(obj.state_length)  # annotated: the state is not decrypted to list it
