"""python manage.py demo: load the demo site and tenant `one` (the seed's pools), and an admin login."""
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from manifests.apply import apply_files

DEMO = Path(settings.BASE_DIR) / "demo"


class Command(BaseCommand):
    help = "Load the demo data (idempotent) and make sure an `admin` login exists."

    def add_arguments(self, parser):
        parser.add_argument("--no-hosts", action="store_true", help="leave the demo hosts out (the lab brings its own)")

    def handle(self, *args, no_hosts, **options):
        files = [DEMO / "site.yaml"] + ([] if no_hosts else [DEMO / "hosts.yaml"])
        result = apply_files([(str(f), f.read_text()) for f in files], actor="system:demo")
        result_one = apply_files([(str(DEMO / "tenant-one.yaml"), (DEMO / "tenant-one.yaml").read_text())],
                                 actor="system:demo", tenant="one")
        changed = result.changed + result_one.changed
        self.stdout.write(f"demo data: {changed} object(s) created or changed")
        password_file = settings.VAR_DIR / "admin-password"
        User = get_user_model()
        if not User.objects.filter(username="admin").exists():
            password = secrets.token_urlsafe(12)
            User.objects.create_superuser("admin", "admin@example.invalid", password)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        if password_file.exists():
            self.stdout.write(f"login: admin / {password_file.read_text().strip()}")
