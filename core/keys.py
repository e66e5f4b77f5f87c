"""The console's own keys (SECRET_KEY, FIELD_ENCRYPTION_KEY, CERTIFICATE_SIGNING_KEY): where settings read them,
the files the embedded mode keeps them in, and the refusal to start a production console without them (or without
ALLOWED_HOSTS: `allowed_hosts`).

Read by settings.py, so no Django here. Each key is read from its variable, else from a file named by
<NAME>_FILE (a Kubernetes secret or systemd credential mounted as a file). Keys are never printed."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

REQUIRED = ("SECRET_KEY", "FIELD_ENCRYPTION_KEY", "CERTIFICATE_SIGNING_KEY")


class StartupRefused(Exception):
    """A key that is missing or cannot be read, or DEBUG on in production: the console does not start."""


def new_secret_key() -> str:
    return secrets.token_urlsafe(50)


def new_field_key() -> str:
    return Fernet.generate_key().decode()


def new_signing_key() -> str:
    """An Ed25519 private key, PEM (PKCS#8), as `openssl genpkey -algorithm ed25519` writes it."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


NEW = {"SECRET_KEY": new_secret_key, "FIELD_ENCRYPTION_KEY": new_field_key, "CERTIFICATE_SIGNING_KEY": new_signing_key}
EMBEDDED_FILES = {"SECRET_KEY": "secret-key", "FIELD_ENCRYPTION_KEY": "field-encryption-key",
                  "CERTIFICATE_SIGNING_KEY": "certificate-signing-key.pem"}


def from_environment(name: str, environ=os.environ) -> str:
    """NAME, else the content of the file NAME_FILE, else ''."""
    value = environ.get(name, "")
    if value or not environ.get(f"{name}_FILE"):
        return value
    path = environ[f"{name}_FILE"]
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise StartupRefused(f"{name}_FILE={path} cannot be read: {exc.strerror}") from None


def load(*, var_dir: Path, embedded: bool, debug: bool, environ=os.environ) -> dict[str, str]:
    """The three keys. The embedded mode makes the ones the environment does not give, once, under var/keys/;
    production must be given all three, and DEBUG off."""
    found, problems = {}, []
    for name in REQUIRED:
        try:
            found[name] = from_environment(name, environ).strip()
        except StartupRefused as exc:
            found[name] = None
            problems.append(f"{exc}.")
    if embedded and not problems:
        return {name: value or _embedded(var_dir, name).strip() for name, value in found.items()}
    if not embedded:
        missing = [f"{name} (or {name}_FILE)" for name, value in found.items() if value == ""]
        if missing:
            problems.insert(0, "DATABASE_URL names a production database, so these keys must be set and are not: "
                               + ", ".join(missing) + ".")
        if debug:
            problems.append("DEBUG is on: a production console shows nobody Django's debug pages (unset DEBUG).")
    if problems:
        raise StartupRefused("\n  ".join([*problems, "docs/operations.md ('Keys and erase certificates') says how "
                                                       "to make each key."]))
    return found


LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]


def allowed_hosts(value: str, *, embedded: bool) -> list[str]:
    """ALLOWED_HOSTS (comma separated). The embedded mode answers to the loopback names unless told otherwise;
    production must name its hosts, and never `*` (any Host header, and any website's websocket, would pass)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if embedded:
        return names or list(LOOPBACK_HOSTS)
    if not names:
        raise StartupRefused("DATABASE_URL names a production database, so ALLOWED_HOSTS must name the console's "
                             "hosts (comma separated, e.g. console.example.com) and is not set.")
    if "*" in names:
        raise StartupRefused("ALLOWED_HOSTS=* accepts any Host header and websockets from any website's pages: "
                             "name the console's hosts instead (e.g. console.example.com).")
    return names


def _embedded(var_dir: Path, name: str) -> str:
    """The embedded mode's key `name`, made once under var/keys/ (readable by its owner only) and kept.
    The web, worker and beat processes start together: the first to get there writes it whole, the others
    read that one."""
    folder = var_dir / "keys"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / EMBEDDED_FILES[name]
    if not path.exists():
        temporary = folder / f".{path.name}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(NEW[name]())
        try:
            os.link(temporary, path)  # fails if another process was first: keep theirs
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    return path.read_text()


def throwaway_keys(environ=os.environ) -> dict[str, str]:
    """Keys made now for a test or benchmark run, for the names the environment sets neither way."""
    return {name: make() for name, make in NEW.items()
            if not environ.get(name) and not environ.get(f"{name}_FILE")}
