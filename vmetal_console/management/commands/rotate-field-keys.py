"""python manage.py rotate-field-keys: every secret at rest re-encrypted under the newest FIELD_ENCRYPTION_KEY,
after which the older keys can be dropped from the setting."""
from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from core.crypto import EncryptedTextField


class Command(BaseCommand):
    help = ("Re-encrypt every encrypted field (BMC credentials, kubeconfigs, queued command secrets, the key "
            "canary) under the first key of FIELD_ENCRYPTION_KEY; the keys after it are then no longer needed.")

    def handle(self, *args, **options):
        total = 0
        for model in apps.get_models():
            fields = [f.name for f in model._meta.concrete_fields if isinstance(f, EncryptedTextField)]
            if not fields:
                continue
            with transaction.atomic():
                # Read decrypted (any configured key), write back: get_prep_value encrypts under the newest.
                for pk, *values in model.objects.select_for_update().values_list("pk", *fields).iterator():
                    model.objects.filter(pk=pk).update(**dict(zip(fields, values)))
                    total += 1
        self.stdout.write(f"re-encrypted {total} rows under the newest FIELD_ENCRYPTION_KEY")
