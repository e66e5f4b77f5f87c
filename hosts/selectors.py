"""Reads of a host's failure record, from the Event log: who failed, how often, with which image."""
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from events.choices import EventKind
from events.models import Event

from .choices import HostState
from .models import BareMetalHost


def _failures(since=None):
    """Transitions out of provisioning that hosts.flows._fail attributed (data: fault, step, message, evidence)."""
    cutoff = timezone.now() - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S)
    if since is not None and since > cutoff:
        cutoff = since
    return Event.objects.filter(kind=EventKind.TRANSITION, object_type="host", from_state=HostState.PROVISIONING,
                                created_at__gte=cutoff, data__has_key="fault")


def image_write_failures(*, name: str, url: str, checksum: str) -> dict[str, str]:
    """Hosts on which this image (this url and checksum) failed to write within the window and since it last
    wrote well anywhere (a write that works somewhere says the image is fine): {host: message}."""
    cutoff = timezone.now() - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S)
    last_good = (Event.objects.filter(kind=EventKind.STEP, step="write_image", message="done", created_at__gte=cutoff,
                                      data__image=name, data__image_url=url, data__image_checksum=checksum)
                 .order_by("-id").values_list("created_at", flat=True).first())
    events = _failures(since=last_good).filter(step="write_image", data__evidence__image=name,
                                               data__evidence__image_url=url,
                                               data__evidence__image_checksum=checksum).order_by("id")
    return {e.object_name: e.data.get("message", "") for e in events}


def host_recent_failures(*, host: BareMetalHost) -> list[Event]:
    """The host's own provisioning failures within the window, since it last went to repair. A failure that
    was the claim's (fault "claim"), or an image write whose image has since failed on IMAGE_FAILURE_HOSTS
    hosts, is not the host's and does not count."""
    last_repair = (Event.objects.filter(host_id=host.pk, kind=EventKind.TRANSITION, to_state=HostState.REPAIR)
                   .order_by("-id").values_list("created_at", flat=True).first())
    events = list(_failures(since=last_repair).filter(host_id=host.pk, data__fault="host").order_by("id"))
    verdicts = {}
    counted = []
    for event in events:
        evidence = event.data.get("evidence") or {}
        key = tuple(evidence.get(k) for k in ("image", "image_url", "image_checksum"))
        if event.step == "write_image" and all(key):
            if key not in verdicts:
                failed = image_write_failures(name=key[0], url=key[1], checksum=key[2])
                verdicts[key] = len(failed) >= settings.IMAGE_FAILURE_HOSTS
            if verdicts[key]:
                continue
        counted.append(event)
    return counted
