"""`Authorization: Token <key>`: the token is found by the key's prefix and the key checked against its hash."""
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions

from .models import PREFIX_LENGTH
from .selectors import token_by_prefix


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's header parsing and `WWW-Authenticate: Token`, with our hashed tokens."""

    def authenticate_credentials(self, key):
        token = token_by_prefix(key[:PREFIX_LENGTH])
        if token is None or not token.matches(key):
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
