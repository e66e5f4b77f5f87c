"""`Authorization: Token <key>`: the token is found by the key's prefix and the key checked against its hash, its
expiry and its scope. A read-only token is refused (403) on anything but GET, HEAD and OPTIONS, whatever the view;
a tenant-limited one narrows what its user sees and changes (core.scoping reads the limit off the user)."""
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.permissions import SAFE_METHODS

from .models import PREFIX_LENGTH
from .selectors import token_by_prefix
from .services import token_used


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's header parsing and `WWW-Authenticate: Token`, with our hashed, expiring, scoped tokens."""

    def authenticate(self, request):
        found = super().authenticate(request)
        if found is None:
            return None
        user, token = found
        view = (getattr(request, "parser_context", None) or {}).get("view")
        if (token.read_only and request.method not in SAFE_METHODS
                and not getattr(view, "read_only_tokens_may_write", False)):
            raise exceptions.PermissionDenied(f"token {token.prefix}… is read-only")
        return user, token

    def authenticate_credentials(self, key):
        token = token_by_prefix(key[:PREFIX_LENGTH])
        if token is None or not token.matches(key):
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        now = timezone.now()
        if token.expired(now):
            raise exceptions.AuthenticationFailed(f"token {token.prefix}… expired at "
                                                  f"{token.expires_at.isoformat(timespec='seconds')}")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        token_used(token, now)
        user = token.user
        limit = list(token.tenants.values_list("pk", flat=True))
        if limit:
            user.token_tenant_ids = limit  # core.scoping.tenant_ids
        return user, token
