"""API tokens, stored as a prefix (to list and revoke them by) and a hash of the key: the key itself is shown
once, when it is made, and is nowhere in the database."""
import hashlib
import hmac

from django.conf import settings
from django.db import models

PREFIX_LENGTH = 8


class ApiToken(models.Model):
    """One per user. Keys are 32 random bytes, not passwords: a plain sha256 is enough to make a stolen
    database useless for calling the API."""

    prefix = models.CharField(max_length=PREFIX_LENGTH, unique=True, help_text="the key's first characters")
    key_hash = models.CharField(max_length=64, help_text="sha256 of the key (hex)")
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @staticmethod
    def hash(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def matches(self, key: str) -> bool:
        return hmac.compare_digest(self.key_hash, self.hash(key))
