"""API tokens: several per user, each named, expiring and scoped, shown once when made, listed by prefix only,
revocable.

POST makes a new key for the caller (its other tokens untouched: a name in use is a 400, never a replacement) and
returns it this one time; the database keeps only its hash (access.models). Made with a token, the new one is no
broader than it (access.services.token_create). Admins list and revoke anyone's token, others their own."""
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.exceptions import ValidationError as BadRequest
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from access.models import PREFIX_LENGTH, ApiToken
from access.selectors import tokens_visible
from access.services import token_create, token_revoke
from core.api import actor
from pools.selectors import tenants_visible

from .serializers import NewTokenSerializer, TokenRequestSerializer, TokenSerializer


class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                   viewsets.GenericViewSet):
    permission_classes = [IsAuthenticated]
    serializer_class = TokenSerializer
    lookup_field = "prefix"
    lookup_value_regex = r"[0-9a-f]{%d}" % PREFIX_LENGTH
    read_only_tokens_may_write = True  # a read-only token makes read-only tokens (access.authentication); see create

    queryset = ApiToken.objects.none()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return tokens_visible(self.request.user)

    def get_object(self):
        token = self.get_queryset().filter(prefix=self.kwargs["prefix"]).first()
        if token is None:
            raise NotFound("no such token")
        return token

    @extend_schema(request=TokenRequestSerializer, responses={201: NewTokenSerializer})
    def create(self, request, *args, **kwargs):
        asked = TokenRequestSerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        names = asked.validated_data["tenants"]
        tenants = list(tenants_visible(request.user).filter(name__in=names))  # others' are unknown too
        unknown = sorted(set(names) - {t.name for t in tenants})
        if unknown:
            raise BadRequest({"tenants": [f"no tenant {', '.join(unknown)}"]})
        made_with = request.auth if isinstance(request.auth, ApiToken) else None
        token, key = token_create(user=request.user, actor=actor(request), name=asked.validated_data["name"],
                                  expires=asked.validated_data["expires"], read_only=asked.validated_data["read_only"],
                                  tenants=tenants, made_with=made_with)  # TokenRefused: a 400 saying why
        return Response(NewTokenSerializer(token, context={"key": key}).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("prefix", str, OpenApiParameter.PATH,
                                                description=f"the token's first {PREFIX_LENGTH} characters")])
    def destroy(self, request, *args, **kwargs):
        if isinstance(request.auth, ApiToken) and request.auth.read_only:
            raise PermissionDenied(f"token {request.auth.prefix}… is read-only")
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance):
        token_revoke(token=instance, actor=actor(self.request))
