"""Erase certificates: the signed document, its one file rendering, and its verification.

The console signs the canonical JSON of the certificate (sorted keys, no spaces, ASCII) with HMAC-SHA256
under settings.CERTIFICATE_SIGNING_KEY, or under a key derived from SECRET_KEY when that is unset. The file a
user downloads is one exact rendering of {certificate, signature}; `verify-certificate` accepts a file only
when the signature matches the content *and* the file is byte-for-byte that rendering, so any changed byte,
inside the signed content or in the formatting around it, reads as tampered."""
from __future__ import annotations

import hashlib
import hmac
import json

from django.conf import settings

ALG = "HMAC-SHA256"
DERIVATION = b"vmetal erase certificate signing key v1"


def signing_key() -> bytes:
    configured = getattr(settings, "CERTIFICATE_SIGNING_KEY", "")
    if configured:
        return configured.encode()
    return hmac.new(settings.SECRET_KEY.encode(), DERIVATION, hashlib.sha256).digest()


def key_id(key: bytes | None = None) -> str:
    """Names the key without revealing it, so a certificate says which key signed it."""
    return hashlib.sha256(b"key-id:" + (key if key is not None else signing_key())).hexdigest()[:16]


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(body: dict, key: bytes | None = None) -> tuple[str, str]:
    key = key if key is not None else signing_key()
    return hmac.new(key, canonical(body), hashlib.sha256).hexdigest(), key_id(key)


def render(body: dict, signature: str, signed_with: str) -> str:
    """The downloadable file: the one rendering a verification accepts."""
    doc = {"certificate": body, "signature": {"alg": ALG, "key_id": signed_with, "value": signature}}
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def render_certificate(cert) -> str:
    return render(cert.document, cert.signature, cert.key_id)


def verify_text(text: str, key: bytes | None = None) -> tuple[bool, list[str], dict | None]:
    """(valid, reasons, certificate body). Reasons say what is wrong when it is not valid."""
    key = key if key is not None else signing_key()
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return False, [f"tampered or not a certificate: the file is not JSON ({exc})"], None
    if not isinstance(doc, dict) or not isinstance(doc.get("certificate"), dict) or \
            not isinstance(doc.get("signature"), dict):
        return False, ["tampered or not a certificate: no certificate and signature objects"], None
    body, sig = doc["certificate"], doc["signature"]
    reasons = []
    if sig.get("alg") != ALG:
        reasons.append(f"unknown signature algorithm {sig.get('alg')!r} (expected {ALG})")
    if sig.get("key_id") != key_id(key):
        reasons.append(f"signed with key {sig.get('key_id')!r}, this console's key is {key_id(key)!r} "
                       "(a different console, a rotated key, or a tampered key id)")
    expected = hmac.new(key, canonical(body), hashlib.sha256).hexdigest()
    if not isinstance(sig.get("value"), str) or not hmac.compare_digest(expected, sig["value"]):
        reasons.append("the signature does not match the content: the certificate was changed after signing")
    if not reasons and text != render(body, sig["value"], sig["key_id"]):
        reasons.append("the file differs from the signed rendering: bytes were changed outside the signed content")
    return not reasons, reasons, body
