"""API tokens: one per user, shown once when made, listed by prefix only, revocable.

POST makes a new key for the caller (replacing any earlier one, which stops working at once) and returns
it this one time; the database keeps only its hash (access.models). Admins list and revoke anyone's token,
others their own."""
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from access.models import PREFIX_LENGTH, ApiToken
from access.selectors import tokens_visible
from access.services import token_create, token_revoke
from core.api import actor

from .serializers import NewTokenSerializer, NoInputSerializer, TokenSerializer


class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                   viewsets.GenericViewSet):
    permission_classes = [IsAuthenticated]
    serializer_class = TokenSerializer
    lookup_field = "prefix"
    lookup_value_regex = r"[0-9a-f]{%d}" % PREFIX_LENGTH

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

    @extend_schema(request=NoInputSerializer, responses={201: NewTokenSerializer})
    def create(self, request, *args, **kwargs):
        token, key = token_create(user=request.user, actor=actor(request))
        return Response(NewTokenSerializer(token, context={"key": key}).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[OpenApiParameter("prefix", str, OpenApiParameter.PATH,
                                                description=f"the token's first {PREFIX_LENGTH} characters")])
    def destroy(self, request, *args, **kwargs):
        return super().destroy(request, *args, **kwargs)

    def perform_destroy(self, instance):
        token_revoke(token=instance, actor=actor(self.request))
