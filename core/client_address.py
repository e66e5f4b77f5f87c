"""The client's address, for login throttling (django-axes) and the agent rate limits: REMOTE_ADDR, unless
that is a proxy named in TRUSTED_PROXIES; then the address that proxy put in X-Forwarded-For.

X-Forwarded-For is read from the right: each proxy appends the address it got the request from, and anything
to the left of the nearest hop we trust may have been written by the client. So the client is the rightmost
address that is not a trusted proxy. Without TRUSTED_PROXIES the header is never read: behind no proxy, a
forged one changes nothing."""
import ipaddress
from functools import lru_cache

from django.conf import settings


@lru_cache(maxsize=8)
def _networks(proxies: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(p.strip(), strict=False) for p in proxies if p.strip())


def _ip(text: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address, networks) -> bool:
    return address is not None and any(address in network for network in networks)


def client_ip(request) -> str:
    remote = request.META.get("REMOTE_ADDR", "")
    networks = _networks(tuple(getattr(settings, "TRUSTED_PROXIES", ())))
    if not networks or not _trusted(_ip(remote), networks):
        return remote
    hops = [_ip(part) for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    for hop in reversed(hops):
        if hop is None:
            return remote  # a trusted proxy passed on something that is no address: take none of it
        if not _trusted(hop, networks):
            return str(hop)
    return remote  # no header, or only our own proxies
