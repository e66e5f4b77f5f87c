"""Publishing changes to live views (Channels groups). Called on commit, never inside a transaction."""
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def publish(groups: list[str], message: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    for group in groups:
        try:
            async_to_sync(layer.group_send)(group, {"type": "object.changed", **message})
        except Exception:  # a live view missing a message re-syncs from the Event log
            log.warning("live update to %s not delivered", group, exc_info=True)


def enqueue(task, **kwargs) -> None:
    """Send a Celery task; a broker outage is logged, not fatal: the beat reconcile catches up."""
    try:
        task.apply_async(kwargs=kwargs, retry=True, retry_policy={"max_retries": 2, "interval_start": 0.2})
    except Exception:
        log.warning("could not enqueue %s; the periodic reconcile will catch up", task.name, exc_info=True)
