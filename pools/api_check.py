"""Whether a tenant's API answers, from the console's side and from its servers' (the last provision check),
for the tenant's API answer. The claims app, which checks it, registers the source (claims.tenant_check)."""
_source = None


def tenant_api_check_source(fn) -> None:
    global _source
    _source = fn


def tenant_api_check(tenant, *, probe_now: bool) -> dict | None:
    """{"console": {...} | None, "server": {...} | None}; `probe_now` False: the console's last result only."""
    if _source is None:
        return None
    return _source(tenant, probe_now=probe_now)
