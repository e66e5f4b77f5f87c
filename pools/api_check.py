"""Whether a tenant's API answers, from the console's side and from its servers' (the last provision check),
for the tenant's API answer. The claims app, which checks it, registers the source (claims.tenant_check)."""
from django.core.exceptions import ImproperlyConfigured

_source = None


def tenant_api_check_source(fn) -> None:
    global _source
    _source = fn


def tenant_api_check(tenant, *, probe_now: bool) -> dict | None:
    """{"console": {...} | None, "server": {...} | None}; `probe_now` False: the console's last result only."""
    if _source is None:
        raise ImproperlyConfigured("pools.api_check: no tenant API check source registered (the claims app "
                                   "registers claims.tenant_check.tenant_api_status when it starts)")
    return _source(tenant, probe_now=probe_now)
