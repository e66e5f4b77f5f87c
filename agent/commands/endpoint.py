"""`check_endpoint`: can this server reach a TLS endpoint (the tenant API's VIP) before anything is written."""
from __future__ import annotations

from agent import endpoint
from agent.commands.base import CommandError, Context, require


def check_endpoint(args: dict, ctx: Context) -> dict:
    """TCP connect and TLS handshake to host:port, verified with `ca_data` (base64 PEM); fails with the reason."""
    host = str(require(args, "host", "check_endpoint"))
    try:
        port = int(require(args, "port", "check_endpoint"))
        timeout = min(30.0, max(0.1, float(args.get("timeout_s") or 3)))
    except (TypeError, ValueError):
        raise CommandError("check_endpoint: port and timeout_s must be numbers") from None
    found = endpoint.probe(host, port, ca_data=args.get("ca_data") or None, tls=bool(args.get("tls", True)),
                           timeout=timeout)
    if not found["ok"]:
        raise CommandError(found["reason"], result=found)
    return found
