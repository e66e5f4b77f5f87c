"""API tokens: one per user, shown once when made, listed by prefix only, revocable.

POST makes a new key for the caller (replacing any earlier one, which stops working at once) and returns
it this one time; nothing ever shows it again. Admins list and revoke anyone's token, others their own."""
from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from events.choices import EventKind
from events.services import event_record
from vmetal_console import scoping

from .base import actor

PREFIX_LENGTH = 8


class TokenSerializer(serializers.Serializer):
    prefix = serializers.SerializerMethodField()
    user = serializers.CharField(source="user.username", read_only=True)
    created = serializers.DateTimeField(read_only=True)

    def get_prefix(self, obj) -> str:
        return obj.key[:PREFIX_LENGTH]


class NewTokenSerializer(TokenSerializer):
    token = serializers.CharField(source="key", read_only=True,
                                  help_text="the key: shown this once; send it as `Authorization: Token <key>`")


class NoInputSerializer(serializers.Serializer):
    """A new token takes no input."""


class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                   viewsets.GenericViewSet):
    permission_classes = [IsAuthenticated]
    serializer_class = TokenSerializer
    lookup_field = "prefix"
    lookup_value_regex = r"[0-9a-f]{%d}" % PREFIX_LENGTH

    queryset = Token.objects.none()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Token.objects.none()
        tokens = Token.objects.select_related("user").order_by("user__username")
        return tokens if scoping.is_admin(self.request.user) else tokens.filter(user=self.request.user)

    def get_object(self):
        prefix = self.kwargs["prefix"]
        matches = list(self.get_queryset().filter(key__startswith=prefix)[:2])
        if len(matches) != 1:
            raise NotFound("no such token")
        return matches[0]

    @extend_schema(request=NoInputSerializer, responses={201: NewTokenSerializer})
    def create(self, request, *args, **kwargs):
        with transaction.atomic():
            Token.objects.filter(user=request.user).delete()
            token = Token.objects.create(user=request.user)
            event_record(kind=EventKind.ACTION, object_type="token", object_name=request.user.username,
                         actor=actor(request), message=f"API token {token.key[:PREFIX_LENGTH]}… made")
        return Response(NewTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("prefix", str, OpenApiParameter.PATH,
                                                description=f"the token's first {PREFIX_LENGTH} characters")])
    def destroy(self, request, *args, **kwargs):
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance):
        with transaction.atomic():
            name, prefix = instance.user.username, instance.key[:PREFIX_LENGTH]
            instance.delete()
            event_record(kind=EventKind.ACTION, object_type="token", object_name=name, actor=actor(self.request),
                         message=f"API token {prefix}… revoked")
