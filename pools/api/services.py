"""Making and revoking API tokens (the API, the admin and `manage.py token` all come here)."""
import secrets

from django.db import transaction

from events.choices import EventKind, ObjectType
from events.services import event_record

from .models import PREFIX_LENGTH, ApiToken


def token_create(*, user, actor: str) -> tuple[ApiToken, str]:
    """A new key for `user`, replacing any earlier one (which stops working at once). Returns the token and
    its key: the caller shows the key this once, nothing can show it again."""
    key = secrets.token_hex(32)
    while ApiToken.objects.filter(prefix=key[:PREFIX_LENGTH]).exclude(user=user).exists():
        key = secrets.token_hex(32)  # prefixes name tokens: one in use by someone else is drawn again
    with transaction.atomic():
        ApiToken.objects.filter(user=user).delete()
        token = ApiToken.objects.create(user=user, prefix=key[:PREFIX_LENGTH], key_hash=ApiToken.hash(key))
        event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name=user.username, actor=actor,
                     message=f"API token {token.prefix}… made")
    return token, key


def token_revoke(*, token: ApiToken, actor: str) -> None:
    with transaction.atomic():
        token.delete()
        event_record(kind=EventKind.ACTION, object_type=ObjectType.TOKEN, object_name=token.user.username, actor=actor,
                     message=f"API token {token.prefix}… revoked")
