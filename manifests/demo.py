"""The demo data (demo/*.yaml): loaded once, into an empty database, so a restart never undoes an admin's changes."""
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

from events.models import Event

from .apply import apply_files
from .export import export_documents

DEMO = Path(settings.BASE_DIR) / "demo"


def database_in_use() -> bool:
    """Anything `export` would write, or any Event: someone (an admin, the lab, an earlier demo) has been here."""
    return Event.objects.exists() or next(iter(export_documents()), None) is not None


def demo_load(*, hosts: bool, actor: str = "system:demo") -> int:
    """Apply the demo site (and its hosts when asked), its KubeVirt provider, tenant `one`'s static pools (one of
    them on KubeVirt) and tenant `two`'s dynamic pool; the number of objects changed. Applied as `apply` does: over whatever is there, so the callers decide whether
    the database may take it."""
    files = [DEMO / "site.yaml"] + ([DEMO / "hosts.yaml"] if hosts else []) + [DEMO / "kubevirt.yaml"]
    changed = apply_files([(str(f), f.read_text()) for f in files], actor=actor).changed
    for tenant in ("one", "two"):
        path = DEMO / f"tenant-{tenant}.yaml"
        changed += apply_files([(str(path), path.read_text())], actor=actor, tenant=tenant).changed
    return changed


def admin_login_ensure() -> str | None:
    """Make the `admin` superuser once, with a generated password kept in var/admin-password; that password."""
    password_file = settings.VAR_DIR / "admin-password"
    User = get_user_model()
    if not User.objects.filter(username="admin").exists():
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", "admin@example.invalid", password)
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
    return password_file.read_text().strip() if password_file.exists() else None
