"""Startup checks of the console's keys. `manage.py check` (and `check --deploy`, `migrate`, `runserver`: every
command that checks) and a Celery worker at its start run them; a key that cannot work is an error that names
its setting, instead of pages, API calls and drive tasks that fail one by one later."""
import sys

from django.apps import apps as global_apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router

from core import crypto

TAG = "vmetal_keys"
FIELD_KEY_HINT = ("FIELD_ENCRYPTION_KEY holds Fernet keys, comma separated, newest first; make one with "
                  "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'")


def _stored_canary() -> str:
    """The canary this database holds: its text, '' when there is none to read (a database not migrated yet,
    or one that cannot be reached: other checks and commands say so), or ValueError when the keys cannot read it."""
    from .models import KeyCanary

    connection = connections[router.db_for_read(KeyCanary)]
    try:
        if KeyCanary._meta.db_table not in connection.introspection.table_names():
            return ""
        return KeyCanary.objects.values_list("value", flat=True).first() or ""
    except DatabaseError:
        return ""


@checks.register(TAG)
def field_encryption_keys_read_this_database(app_configs=None, **kwargs):
    try:
        crypto.field_keys()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint=FIELD_KEY_HINT, id="vmetal.E001")]
    try:
        _stored_canary()
    except ValueError:
        return [checks.Error(
            "FIELD_ENCRYPTION_KEY cannot decrypt data stored in this database (the key is wrong, or was rotated "
            "without keeping the old one as a second entry)",
            hint="set the key this database was written with; to rotate, put the new key first and keep the old "
                 "one after it until `manage.py rotate-field-keys` has run", id="vmetal.E002")]
    return []


@checks.register(TAG)
def certificate_keys_load(app_configs=None, **kwargs):
    from hosts.gate import certificates

    errors = []
    try:
        certificates.signing_key()
    except certificates.SigningUnavailable as exc:
        errors.append(checks.Error(str(exc), id="vmetal.E003"))
    try:
        certificates.retired_keys()
    except ValueError as exc:
        errors.append(checks.Error(str(exc), id="vmetal.E004"))
    return errors


def canary_write(sender, *, using, apps=global_apps, **kwargs):
    """post_migrate (migrate, and a test database's flush): the canary, under the current keys, if none is kept."""
    try:
        model = apps.get_model("vmetal_console", "KeyCanary")
    except LookupError:  # migrated back to before the canary
        return
    if not model.objects.using(using).exists():
        from .models import CANARY

        model.objects.using(using).create(value=CANARY)


def refuse_to_start_unless_keys_fit(process: str) -> None:
    """For a process that runs no system checks of its own (a Celery worker): stop with the checks' words."""
    errors = [message for message in checks.run_checks(tags=[TAG]) if message.is_serious()]
    if errors:
        sys.exit(f"vMetal Console {process} cannot start:\n" + "\n".join(
            f"  {e.msg}" + (f"\n    ({e.hint})" if e.hint else "") for e in errors))
