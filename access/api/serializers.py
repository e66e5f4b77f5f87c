"""API tokens as JSON: listed by prefix and owner; the key itself only in the answer that made it."""
from rest_framework import serializers


class TokenSerializer(serializers.Serializer):
    prefix = serializers.CharField(read_only=True)
    user = serializers.CharField(source="user.username", read_only=True)
    created = serializers.DateTimeField(read_only=True)


class NewTokenSerializer(TokenSerializer):
    token = serializers.SerializerMethodField(
        help_text="the key: shown this once; send it as `Authorization: Token <key>`")

    def get_token(self, obj) -> str:
        return self.context["key"]


class NoInputSerializer(serializers.Serializer):
    """A new token takes no input."""
