"""The console's own table: a canary that proves the field-encryption keys read what this database holds."""
from django.db import models

from core.crypto import EncryptedTextField

CANARY = "vmetal field-encryption canary"


class KeyCanary(models.Model):
    """CANARY, encrypted with the field keys of the first migrate (and re-encrypted by rotate-field-keys). If the
    configured keys cannot read it, they cannot read the BMC credentials and kubeconfigs either."""

    value = EncryptedTextField()
    created_at = models.DateTimeField(auto_now_add=True)
