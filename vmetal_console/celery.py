"""The Celery app: the engine that spreads reconciles and provisioning over workers."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vmetal_console.settings")
app = Celery("vmetal_console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
