"""The Celery app: the engine that spreads reconciles and provisioning over workers."""
import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vmetal_console.settings")
app = Celery("vmetal_console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
def _keys_fit(**kwargs):
    """A worker whose keys cannot read the database, or sign, stops at once with the reason, instead of failing
    every drive task. (Celery runs Django's system checks at start too, but ignores what they find.)"""
    import django

    from vmetal_console.checks import refuse_to_start_unless_keys_fit

    django.setup()
    refuse_to_start_unless_keys_fit("worker")
