"""Reads of a host's failure record, from the Event log: who failed, how often, with which image."""
from datetime import timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from core import scoping
from events.choices import EventKind, ObjectType
from events.models import Event
from pools.models import Tenant

from .choices import HostState
from .models import BareMetalHost, EraseCertificate, HealthCheckRun


def _failures(since=None):
    """Transitions out of provisioning that hosts.flows.fail attributed (data: fault, step, message, evidence)."""
    cutoff = timezone.now() - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S)
    if since is not None and since > cutoff:
        cutoff = since
    return Event.objects.filter(kind=EventKind.TRANSITION, object_type=ObjectType.HOST,
                                from_state=HostState.PROVISIONING, created_at__gte=cutoff, data__has_key="fault")


def image_write_failures(*, name: str, url: str, checksum: str) -> dict[str, str]:
    """Hosts on which this image (this url and checksum) failed to write within the window and since it last
    wrote well anywhere (a write that works somewhere says the image is fine): {host: message}."""
    cutoff = timezone.now() - timedelta(seconds=settings.HOST_FAILURE_WINDOW_S)
    # The step that writes it (claims.steps) records the image it wrote, and its failures the image they failed on.
    last_good = (Event.objects.filter(kind=EventKind.STEP, message="done", created_at__gte=cutoff,
                                      data__image=name, data__image_url=url, data__image_checksum=checksum)
                 .order_by("-id").values_list("created_at", flat=True).first())
    events = _failures(since=last_good).filter(data__evidence__image=name,
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
        if all(key):  # a failure that names the image it wrote
            if key not in verdicts:
                failed = image_write_failures(name=key[0], url=key[1], checksum=key[2])
                verdicts[key] = len(failed) >= settings.IMAGE_FAILURE_HOSTS
            if verdicts[key]:
                continue
        counted.append(event)
    return counted


# --- what each user may see (the rule: core.scoping) ----------------------------------------------

def hosts_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see only the hosts that serve their claims now."""
    qs = BareMetalHost.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(claim__tenant_id__in=ids)


def _erases_of(ids: list[int]) -> Q:
    """The erases of these tenants' data: the previous tenant, by name, as the signed document names it."""
    return Q(previous_tenant__in=Tenant.objects.filter(pk__in=ids).values("name"))


def erase_certificates_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see the certificates of the erases of their own tenants' data: the proof they are owed, whichever
    host it was and whoever uses it now."""
    qs = EraseCertificate.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    return qs if ids is None else qs.filter(_erases_of(ids))


def health_runs_visible(user, qs: QuerySet | None = None) -> QuerySet:
    """Members see the health runs of the release gates whose certificates they see (the same flow run: how the
    host was checked after their use), never those of other tenants' releases or of registrations."""
    qs = HealthCheckRun.objects.all() if qs is None else qs
    ids = scoping.tenant_ids(user)
    if ids is None:
        return qs
    return qs.filter(flow_id__in=EraseCertificate.objects.filter(_erases_of(ids)).values("flow_id"))
