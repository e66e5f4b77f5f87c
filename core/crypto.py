"""Secrets at rest: a model field that stores text encrypted with Fernet (AES-128-CBC + HMAC).

Keys come from FIELD_ENCRYPTION_KEY (comma separated, newest first, so keys can be rotated; settings.py
requires it in production and makes one under var/keys/ in the embedded mode). vmetal_console.checks proves
at startup that they read what the database holds."""
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver


def field_keys() -> list[Fernet]:
    """settings.FIELD_ENCRYPTION_KEYS as Fernet keys; ImproperlyConfigured names the entry that is not one."""
    keys = list(settings.FIELD_ENCRYPTION_KEYS)
    if not keys:
        raise ImproperlyConfigured("FIELD_ENCRYPTION_KEY is not set")
    fernets = []
    for number, key in enumerate(keys, 1):
        try:
            fernets.append(Fernet(key.encode()))
        except (ValueError, TypeError):
            which = f": entry {number} of {len(keys)}" if len(keys) > 1 else ""
            raise ImproperlyConfigured(f"FIELD_ENCRYPTION_KEY{which} is not a Fernet key (32 url-safe "
                                       "base64-encoded bytes)") from None
    return fernets


@lru_cache(maxsize=1)
def _fernet() -> MultiFernet:
    return MultiFernet(field_keys())


@receiver(setting_changed)
def _keys_changed(*, setting, **kwargs):
    if setting == "FIELD_ENCRYPTION_KEYS":
        _fernet.cache_clear()


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
