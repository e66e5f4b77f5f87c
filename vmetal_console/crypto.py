"""Secrets at rest: a model field that stores text encrypted with Fernet (AES-128-CBC + HMAC).

Keys come from FIELD_ENCRYPTION_KEY (comma separated, newest first, so keys can be rotated);
without it a key is derived from SECRET_KEY, which is fine for the embedded mode only."""
import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models


@lru_cache(maxsize=1)
def _fernet() -> MultiFernet:
    keys = list(settings.FIELD_ENCRYPTION_KEYS)
    if not keys:
        digest = hashlib.sha256(("vmetal-field-key:" + settings.SECRET_KEY).encode()).digest()
        keys = [base64.urlsafe_b64encode(digest).decode()]
    return MultiFernet([Fernet(k.encode()) for k in keys])


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("stored secret cannot be decrypted with the configured keys") from exc


class Secret(str):
    """A decrypted value whose repr never shows it (safe in logs and tracebacks)."""

    def __repr__(self) -> str:
        return "Secret('********')" if self else "Secret('')"


class EncryptedTextField(models.TextField):
    """Encrypted in the database, plain `Secret` in Python; empty stays empty."""

    def from_db_value(self, value, expression, connection):
        if value in (None, ""):
            return Secret("") if value == "" else value
        return Secret(decrypt(value))

    def to_python(self, value):
        if value is None or isinstance(value, Secret):
            return value
        return Secret(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value in (None, ""):
            return value
        return encrypt(value)
