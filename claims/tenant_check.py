"""The tenant API's VIP, checked from both sides: from the server's network before the image is written, and
from the console's when the tenant page or the API asks."""
# The tenant API's VIP, checked from both sides: from the server's network by the agent before the image is
# written (the provision flow's `check_tenant_api` step, claims.steps), and from the console's when the tenant page
# or the API asks. A failed server-side check is the tenant's fault, not the host's: the host is back in the pool
# (without an erase: nothing was written on it, hosts.flows.steps.untouched_begin), the claim waits (claims_allocate asks
# `tenant_api_holds`) until the tenant's API settings change or TENANT_API_RETRY_S passes. Results name the
# endpoint and what failed, never the kubeconfig or a token.
import hashlib
import re
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from agent.endpoint import probe
from events.choices import EventKind
from events.models import Event
from pools.models import Tenant

from .tenant_api import TenantAPI, TenantAPIError

CHECK_STEP = "check_tenant_api"
WAIT_REASON = "TenantAPIUnreachable"  # the claim's reason while it waits for the tenant to fix its VIP


class TargetError(ValueError):
    """The tenant's API settings say nothing that can be checked (no endpoint, a kubeconfig that does not parse)."""


def tenant_api_target(tenant: Tenant) -> dict:
    """What to check: {"host", "port", "endpoint", "tls", "ca_data"} from the tenant's api_endpoint (the VIP the
    join command uses; else its kubeconfig's server) and its kubeconfig's CA. A plain-HTTP API (an http://
    server) is checked for TCP only."""
    server = ""
    api = None
    if tenant.kubeconfig:
        try:
            api = TenantAPI(tenant.kubeconfig, timeout=settings.TENANT_API_TIMEOUT_S)
        except TenantAPIError as exc:
            raise TargetError(str(exc)) from None
        server = api.server if api.server != "?" else ""
    tls = not server.lower().startswith("http://")
    endpoint = re.sub(r"^https?://", "", (tenant.api_endpoint or server).strip()).split("/", 1)[0]
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([A-Za-z0-9.\-]+)(?::(\d{1,5}))?", endpoint)
    if not endpoint or match is None:
        raise TargetError(f"no tenant API endpoint to check ({endpoint or 'none set'})")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4) or (443 if tls else 80))
    if not 0 < port < 65536:
        raise TargetError(f"not a port: {port}")
    try:
        ca_data = api.ca_data() if api is not None and tls else None
    except TenantAPIError as exc:
        raise TargetError(str(exc)) from None
    return {"host": host, "port": port, "endpoint": endpoint if match.group(2) or match.group(4) else f"{endpoint}:{port}",
            "tls": tls, "ca_data": ca_data}


def unreachable_message(endpoint: str, reason: str) -> str:
    return f"tenant API {endpoint} not reachable from the server network ({reason})"


def _fingerprint(target: dict) -> str:
    return hashlib.sha256(f"{target['endpoint']}|{target['tls']}|{target['ca_data'] or ''}".encode()).hexdigest()[:16]


# --- the server's side: the provision step's last result -----------------------------------------------------

def _last_server_check(tenant_id: int) -> Event | None:
    return (Event.objects.filter(tenant_id=tenant_id, kind=EventKind.STEP, step=CHECK_STEP)
            .filter(message__regex=r"^(done|failed: )").order_by("-id").first())


def _server_result(event: Event | None) -> dict | None:
    if event is None:
        return None
    ok = event.message == "done"
    data = event.data or {}
    return {"ok": ok, "at": event.created_at.isoformat(), "host": event.object_name,
            "message": f"tenant API {data.get('endpoint', '')} reachable from {event.object_name}" if ok
            else event.message.removeprefix("failed: ")}


def tenant_api_server_check(tenant: Tenant) -> dict | None:
    """The last check made from a server's network (the provision step's Event), or None: never checked."""
    return _server_result(_last_server_check(tenant.pk))


def tenant_api_holds(*, tenant_ids) -> dict[int, tuple[str, str]]:
    """{tenant id: (reason, message)} for the tenants whose claims wait: the last server-side check failed, the
    tenant's API settings did not change since, and it is younger than TENANT_API_RETRY_S."""
    holds = {}
    retry = timedelta(seconds=settings.TENANT_API_RETRY_S)
    changed = dict(Tenant.objects.filter(pk__in=list(tenant_ids)).values_list("pk", "updated_at"))
    for tenant_id, updated_at in changed.items():
        event = _last_server_check(tenant_id)
        if event is None or event.message == "done" or event.created_at < updated_at:
            continue
        if timezone.now() - event.created_at > retry:
            continue
        retry_at = timezone.localtime(event.created_at + retry)
        message = (f"{event.message.removeprefix('failed: ')}, checked from {event.object_name}; waiting for "
                   f"the tenant's API endpoint or CA to be fixed (tried again at {retry_at:%H:%M:%S} if nothing "
                   f"changes)")
        holds[tenant_id] = (WAIT_REASON, message)
    return holds


# --- the console's side: asked for by the tenant page and the API --------------------------------------------

def tenant_api_console_check(tenant: Tenant, *, cached_only: bool = False) -> dict | None:
    """Does the tenant API answer (TCP, and TLS with its CA) from the console? Made when asked, reused for
    TENANT_API_CONSOLE_CHECK_TTL_S; `cached_only`: the last result, never a new check (None if none). Network
    I/O: call it outside any transaction."""
    try:
        target = tenant_api_target(tenant)
    except TargetError as exc:
        return {"ok": False, "reason": str(exc), "endpoint": tenant.api_endpoint, "at": timezone.now().isoformat()}
    key = f"tenant-api-console-check:{tenant.pk}:{_fingerprint(target)}"
    found = cache.get(key)
    if found is not None or cached_only:
        return found
    result = probe(target["host"], target["port"], ca_data=target["ca_data"], tls=target["tls"],
                   timeout=min(2.0, settings.TENANT_API_CHECK_TIMEOUT_S))
    found = {"ok": result["ok"], "endpoint": target["endpoint"], "tls": target["tls"],
             "reason": result.get("reason", ""), "at": timezone.now().isoformat()}
    cache.set(key, found, settings.TENANT_API_CONSOLE_CHECK_TTL_S)
    return found


def tenant_api_status(tenant: Tenant, *, probe_now: bool = True) -> dict:
    """Both sides, as the page and the API show them."""
    return {"console": tenant_api_console_check(tenant, cached_only=not probe_now),
            "server": tenant_api_server_check(tenant)}
