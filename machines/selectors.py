"""Reads of external providers' machines: each NodeType's capacity as its kind says and the machines it holds."""
import logging

from django.db.models import Count

from .kinds import KindError, kind_of
from .models import Machine
from .services import LIVE_MACHINE

log = logging.getLogger(__name__)


def machine_capacity(node_types: list) -> dict[int, dict]:
    """{type id: {"total", "claimed", "error"}} for the external providers' types among these: total as the kind
    says (None: no limit; a provider that cannot be asked: None with the error), claimed its machines not gone
    (one query). The kinds' calls are network I/O: never call this inside a transaction."""
    external = [t for t in node_types if t.provider.external]
    if not external:
        return {}
    claimed = dict(Machine.objects.filter(LIVE_MACHINE, node_type__in=external).order_by()
                   .values_list("node_type").annotate(n=Count("pk")).values_list("node_type", "n"))
    found = {}
    for t in external:
        total, error = None, ""
        try:
            total = kind_of(t.provider).capacity(t)
        except KindError as exc:
            error = exc.message
        except Exception as exc:  # a provider's answer must never take a page down: said, and logged
            log.warning("capacity of %s (provider %s): %r", t.name, t.provider.name, exc)
            error = f"the provider could not be asked ({exc.__class__.__name__})"
        found[t.pk] = {"total": total, "claimed": claimed.get(t.pk, 0), "error": error}
    return found
