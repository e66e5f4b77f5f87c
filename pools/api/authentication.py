"""`Authorization: Token <key>`: the token is found by the key's prefix and the key checked against its hash."""
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from .models import PREFIX_LENGTH, ApiToken


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's header parsing and `WWW-Authenticate: Token`, with our hashed tokens."""

    def authenticate_credentials(self, key):
        token = ApiToken.objects.select_related("user").filter(prefix=key[:PREFIX_LENGTH]).first()
        if token is None or not token.matches(key):
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
