"""API tokens as JSON: listed by prefix, name, owner, scope, expiry and last use; the key itself only in the answer
that made it."""
from rest_framework import serializers


class TokenSerializer(serializers.Serializer):
    prefix = serializers.CharField(read_only=True)
    name = serializers.CharField(read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)
    scope = serializers.ChoiceField(choices=["read-only", "read-write"], read_only=True)
    tenants = serializers.SerializerMethodField()
    created = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True)
    expired = serializers.SerializerMethodField()
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)

    def get_tenants(self, obj) -> list[str]:
        """The tenants it is limited to; empty: every tenant its user may see."""
        return sorted(t.name for t in obj.tenants.all())

    def get_expired(self, obj) -> bool:
        return obj.expired()


class NewTokenSerializer(TokenSerializer):
    token = serializers.SerializerMethodField(
        help_text="the key: shown this once; send it as `Authorization: Token <key>`")

    def get_token(self, obj) -> str:
        return self.context["key"]


class TokenRequestSerializer(serializers.Serializer):
    """What a new token is: all optional. Its name must be new among the caller's tokens (none is replaced)."""

    name = serializers.CharField(max_length=64, required=False, allow_null=True, default=None,
                                 help_text="new among the caller's tokens; none: token, token-2, ... (the first free)")
    expires = serializers.RegexField(r"^\d{1,7}[smhdw]$", max_length=8, required=False, allow_null=True, default=None,
                                     help_text="lifetime such as 2s, 12h, 90d; the default API_TOKEN_EXPIRES_DEFAULT, "
                                               "at most API_TOKEN_EXPIRES_MAX")
    read_only = serializers.BooleanField(required=False, default=False)
    tenants = serializers.ListField(child=serializers.CharField(max_length=63), required=False, default=list,
                                    max_length=100, help_text="names of the caller's tenants to limit it to")
