"""Erase certificates: the signed document, its one file rendering, and its verification."""
# Erase certificates: the signed document, its one file rendering, and its verification.
#
# The console signs the canonical JSON of the certificate (sorted keys, no spaces, ASCII) with Ed25519 under
# settings.CERTIFICATE_SIGNING_KEY, a PEM private key; without one it refuses to sign. Anyone verifies a
# certificate with the public key alone: the console publishes it, with the public keys of the keys it signed with
# before a rotation (settings.CERTIFICATE_VERIFY_KEYS), at /certificates/signing-keys.pem. A key's id, in each
# signature, is the first 16 hex digits of the SHA-256 of its raw 32-byte public key.
#
# The file a user downloads is one exact rendering of {certificate, signature}; `verify-certificate` accepts a file
# only when the signature matches the content *and* the file is byte-for-byte that rendering, so any changed byte,
# inside the signed content or in the formatting around it, reads as tampered.
from __future__ import annotations

import hashlib
import json
import re

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from django.conf import settings

ALG = "Ed25519"
SIGNATURE = re.compile(r"[0-9a-f]{128}")  # 64 bytes, lower-case hex: one spelling per signature
PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z ]+)-----.+?-----END \1-----", re.S)


class SigningUnavailable(Exception):
    """This console cannot sign: no signing key is configured, or it is not an Ed25519 private key."""


def _pem(text: str) -> bytes:
    # An environment variable may carry the PEM on one line, its line breaks written as \n.
    return (text if "\n" in text.strip() else text.replace("\\n", "\n")).encode()


def signing_key() -> Ed25519PrivateKey:
    text = settings.CERTIFICATE_SIGNING_KEY
    if not text:
        raise SigningUnavailable("erase certificates cannot be signed: no signing key is configured (set "
                                 "CERTIFICATE_SIGNING_KEY, or CERTIFICATE_SIGNING_KEY_FILE, to an Ed25519 private "
                                 "key in PEM form)")
    try:
        key = serialization.load_pem_private_key(_pem(text), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningUnavailable("erase certificates cannot be signed: CERTIFICATE_SIGNING_KEY is not an Ed25519 "
                                 "private key in PEM form, unencrypted (`manage.py certificate-key generate` or "
                                 "`openssl genpkey -algorithm ed25519` makes one)")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    """Names a key by its public half: anyone holding the public key can compute it."""
    return hashlib.sha256(public_key.public_bytes(serialization.Encoding.Raw,
                                                  serialization.PublicFormat.Raw)).hexdigest()[:16]


def public_keys_from_pem(text: str, source: str) -> dict[str, Ed25519PublicKey]:
    """Every Ed25519 public key in a PEM text (one or more blocks), by key id; ValueError names the bad block."""
    found = {}
    for number, block in enumerate(PEM_BLOCK.finditer(_pem(text).decode()), 1):
        try:
            key = serialization.load_pem_public_key(block.group(0).encode())
        except (ValueError, TypeError, UnsupportedAlgorithm):
            key = None
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError(f"{source}: PEM block {number} is not an Ed25519 public key")
        found[key_id(key)] = key
    if text.strip() and not found:
        raise ValueError(f"{source}: no PEM public key in it")
    return found


def retired_keys() -> dict[str, Ed25519PublicKey]:
    return public_keys_from_pem(settings.CERTIFICATE_VERIFY_KEYS, "CERTIFICATE_VERIFY_KEYS")


def _current() -> Ed25519PublicKey | None:
    try:
        return signing_key().public_key()
    except SigningUnavailable:
        return None


def verify_keys() -> dict[str, Ed25519PublicKey]:
    """The keys this console accepts certificates from: its signing key's public half first, then retired ones."""
    current = _current()
    keys = {key_id(current): current} if current else {}
    for kid, key in retired_keys().items():
        keys.setdefault(kid, key)
    return keys


def published_keys() -> str:
    """The public keys as the console publishes them: a PEM bundle, each block under a line that names it."""
    current = _current()
    parts = []
    for kid, key in verify_keys().items():
        pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        role = "current" if current and kid == key_id(current) else "retired"
        parts.append(f"vMetal Console erase certificate key {kid} ({ALG}, {role})\n{pem}")
    return "\n".join(parts)


def canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(body: dict) -> tuple[str, str]:
    """(signature, key id); SigningUnavailable when this console has no usable signing key."""
    key = signing_key()
    return key.sign(canonical(body)).hex(), key_id(key.public_key())


def render(body: dict, signature: str, signed_with: str) -> str:
    """The downloadable file: the one rendering a verification accepts."""
    doc = {"certificate": body, "signature": {"alg": ALG, "key_id": signed_with, "value": signature}}
    return json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True) + "\n"


def render_certificate(cert) -> str:
    return render(cert.document, cert.signature, cert.key_id)


def verify_text(text: str, public_keys: dict[str, Ed25519PublicKey] | None = None
                ) -> tuple[bool, list[str], dict | None]:
    """(valid, reasons, certificate body), checked against `public_keys` (by key id), else the keys this console
    accepts. Reasons say what is wrong when it is not valid."""
    keys = verify_keys() if public_keys is None else public_keys
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
    key = keys.get(sig.get("key_id"))
    value = sig.get("value")
    if key is None:
        reasons.append(f"signed with key {sig.get('key_id')!r}, which is not among the keys checked "
                       f"({', '.join(keys) or 'none'}): a different console, a retired key missing from "
                       "CERTIFICATE_VERIFY_KEYS, or a tampered key id")
    elif not isinstance(value, str) or not SIGNATURE.fullmatch(value):
        reasons.append("the signature is not an Ed25519 signature in hex: the certificate was changed after signing")
    else:
        try:
            key.verify(bytes.fromhex(value), canonical(body))
        except InvalidSignature:
            reasons.append("the signature does not match the content: the certificate was changed after signing")
    if not reasons and text != render(body, value, sig["key_id"]):
        reasons.append("the file differs from the signed rendering: bytes were changed outside the signed content")
    return not reasons, reasons, body
