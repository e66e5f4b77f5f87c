"""API tokens, stored as a prefix (to list and revoke them by) and a hash of the key: the key itself is shown
once, when it is made, and is nowhere in the database. A user may hold several, each named, each with an
expiry and a scope (read only or read and write, optionally some of the user's tenants only)."""
import hashlib
import hmac

from django.conf import settings
from django.db import models
from django.utils import timezone

PREFIX_LENGTH = 8


class ApiToken(models.Model):
    """Keys are 32 random bytes, not passwords: a plain sha256 is enough to make a stolen database useless for
    calling the API."""

    prefix = models.CharField(max_length=PREFIX_LENGTH, unique=True, help_text="the key's first characters")
    key_hash = models.CharField(max_length=64, help_text="sha256 of the key (hex)")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=64, help_text="what the token is for; one name per user")
    read_only = models.BooleanField(default=False, help_text="GET, HEAD and OPTIONS only")
    tenants = models.ManyToManyField("pools.Tenant", blank=True, related_name="+",
                                     help_text="only these of the user's tenants; none: all the user may see")
    created = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True, help_text="recorded at most once a minute")

    class Meta:
        verbose_name = "API token"
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="api_token_name_per_user")]

    def __str__(self) -> str:
        return f"{self.prefix}… {self.name} ({self.user})"

    @staticmethod
    def hash(key: str) -> str:
        return hashlib.sha256(key.encode()).hexdigest()

    def matches(self, key: str) -> bool:
        return hmac.compare_digest(self.key_hash, self.hash(key))

    def expired(self, now=None) -> bool:
        return (now or timezone.now()) >= self.expires_at

    @property
    def scope(self) -> str:
        return "read-only" if self.read_only else "read-write"


class OidcIdentity(models.Model):
    """Who signed in through the identity provider: its issuer and subject, stable for one person at one provider,
    where a username or an e-mail address may change or be given to someone else. The one thing a sign-in is
    matched on (access.oidc)."""

    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities")
    created = models.DateTimeField(auto_now_add=True)
    last_sign_in = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "OIDC identity"
        verbose_name_plural = "OIDC identities"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="uniq_oidc_identity")]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer} ({self.user})"
