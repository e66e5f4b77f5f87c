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


@signals.beat_init.connect
def _heartbeat(sender, **kwargs):
    """Touch BEAT_HEARTBEAT_FILE at each tick of the scheduler (at least every few seconds: the shortest entry's
    period), so that `manage.py probe beat` sees a beat whose loop stopped, not only one whose process died."""
    from pathlib import Path

    from django.conf import settings

    path = Path(settings.BEAT_HEARTBEAT_FILE)
    scheduler = sender.scheduler
    tick = scheduler.tick

    def ticking(*args, **kw):
        try:
            path.touch()
        except OSError:  # a probe that cannot read it says so; beat goes on
            pass
        return tick(*args, **kw)

    scheduler.tick = ticking
