"""Shared test fixtures: manifests applied the way users apply them, the demo site, database facts."""
import os
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection

ROOT = Path(__file__).resolve().parent
FIXTURES = ROOT / "tests" / "fixtures"
DEMO = ROOT / "demo"


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def pytest_collection_modifyitems(config, items):
    """`postgres` tests skip on SQLite for a newcomer's quick run, but never in CI: there they must run."""
    if os.environ.get("CI") or os.environ.get("DATABASE_URL", "").startswith("postgres"):
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def apply(tmp_path, capsys):
    """apply(text, tenant=None, name="manifest.yaml") → the command's output lines, as `manage.py apply`."""

    def run(*texts: str, tenant: str | None = None, dry_run: bool = False, names: list[str] | None = None):
        args = []
        for i, text in enumerate(texts):
            path = tmp_path / (names[i] if names else f"manifest{i}.yaml")
            path.write_text(text)
            args += ["-f", str(path)]
        if tenant:
            args += ["--tenant", tenant]
        if dry_run:
            args.append("--dry-run")
        capsys.readouterr()
        call_command("apply", *args)
        return capsys.readouterr().out.splitlines()

    return run


@pytest.fixture
def demo_site(apply):
    """The demo's provider, node types (gpu-server, cpu-server), image, network and 8 available hosts."""
    return apply((DEMO / "site.yaml").read_text(), (DEMO / "hosts.yaml").read_text())


@pytest.fixture
def seed_block() -> str:
    return (FIXTURES / "seed-private-nodes.yaml").read_text()


@pytest.fixture
def subprocess_env(settings):
    """Environment for a child process (manage.py, a Celery worker) that must use this test's database.
    Only committed rows are visible to it: use it with django_db(transaction=True)."""
    db = connection.settings_dict
    env = dict(os.environ)
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{db['NAME']}"
    else:
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    return env
