"""Reading API tokens: by prefix (how a key and the CLI name one) and those a user may see."""
from core import scoping

from .models import ApiToken


def token_by_prefix(prefix: str) -> ApiToken | None:
    return ApiToken.objects.select_related("user").filter(prefix=prefix).first()


def tokens_visible(user):
    """Everyone's tokens to an admin, a user's own to anyone else (expired ones too, until revoked)."""
    tokens = (ApiToken.objects.select_related("user").prefetch_related("tenants")
              .order_by("user__username", "name"))
    return tokens if scoping.is_admin(user) else tokens.filter(user=user)
