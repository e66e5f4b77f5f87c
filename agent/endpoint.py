"""Can this machine reach a TLS endpoint? DNS, a TCP connect and a TLS handshake verified against a given CA,
each bounded by one timeout, with what failed named in words an operator can act on. Plain Python: the agent's
`check_endpoint` command runs it from the server's network, the console (claims.tenant_check) from its own."""
from __future__ import annotations

import base64
import binascii
import errno
import socket
import ssl
import time

# What failed, a closed set: the step and the pages show the words, the kind sorts them.
DNS, TCP_REFUSED, TCP_TIMEOUT, TCP_UNREACHABLE, TLS_VERIFY, TLS_NAME, TLS_TIMEOUT, TLS_ERROR, BAD_INPUT = (
    "dns", "refused", "timeout", "unreachable", "tls-verify", "tls-name", "tls-timeout", "tls", "input")


def probe(host: str, port: int, *, ca_data: str | None = None, tls: bool = True, timeout: float = 3.0) -> dict:
    """{"ok", "endpoint", "kind" (on failure), "reason", "tls", "elapsed_ms"}; never raises.

    `ca_data`: the CA as a kubeconfig holds it (base64 PEM); without it the machine's trusted CAs verify.
    `tls` False: a plain-HTTP API, the TCP connect is all there is to check. The certificate must match `host`
    (as the join command's curl checks it)."""
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    started = time.monotonic()

    def result(ok: bool, kind: str = "", reason: str = "", detail: str = "") -> dict:
        out = {"ok": ok, "endpoint": endpoint, "tls": tls, "elapsed_ms": round((time.monotonic() - started) * 1000)}
        return out if ok else {**out, "kind": kind, "reason": reason, **({"detail": detail} if detail else {})}

    if not host or not isinstance(port, int) or not 0 < port < 65536:
        return result(False, BAD_INPUT, "not a host:port endpoint")
    context = None
    if tls:
        try:
            context = _context(ca_data)
        except ValueError as exc:
            return result(False, BAD_INPUT, str(exc))
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return result(False, DNS, f"DNS: {host} does not resolve", _words(exc))
    deadline = started + timeout
    sock, failure = None, None
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            sock.connect(address)
            break
        except TimeoutError:
            failure = (TCP_TIMEOUT, f"connection timed out after {timeout:g}s")
        except ConnectionRefusedError:
            failure = (TCP_REFUSED, "connection refused")
        except OSError as exc:
            unreachable = exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)
            failure = (TCP_UNREACHABLE if unreachable else TCP_REFUSED, _words(exc))
        sock.close()
        sock = None
    if sock is None:
        return result(False, *(failure or (DNS, f"DNS: {host} has no address")))
    try:
        if context is None:
            return result(True)
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            with context.wrap_socket(sock, server_hostname=host) as wrapped:
                wrapped.getpeercert()
            return result(True)
        except ssl.SSLCertVerificationError as exc:
            if exc.verify_code == 62 or "match" in (exc.verify_message or ""):  # X509_V_ERR_HOSTNAME_MISMATCH
                return result(False, TLS_NAME, f"TLS certificate does not name {host}")
            what = "the tenant's CA" if ca_data else "a trusted CA"
            return result(False, TLS_VERIFY, f"TLS certificate not signed by {what}", exc.verify_message or "")
        except TimeoutError:
            return result(False, TLS_TIMEOUT, f"TLS handshake timed out after {timeout:g}s")
        except (ssl.SSLError, OSError) as exc:
            return result(False, TLS_ERROR, "TLS handshake failed", _words(exc))
    finally:
        sock.close()


def _context(ca_data: str | None) -> ssl.SSLContext:
    if not ca_data:
        return ssl.create_default_context()
    try:
        pem = base64.b64decode("".join(ca_data.split()), validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("the CA is not base64 PEM") from None
    try:
        return ssl.create_default_context(cadata=pem)
    except ssl.SSLError:
        raise ValueError("the CA is not a PEM certificate") from None


def _words(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc) or type(exc).__name__
