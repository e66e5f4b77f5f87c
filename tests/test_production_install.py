"""Production installs only what production runs: `requirements.txt` alone, in a fresh virtual environment, is
enough for `manage.py check --deploy` with production settings and every product module, and it brings no test
or lab package (those are requirements-test.txt's and requirements-lab.txt's)."""
import os
import subprocess
from pathlib import Path

import pytest

from .production_conftest import production_venv  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_APPS = ["core", "events", "pools", "hosts", "claims", "autonodes", "manifests", "console", "agent",
                "vmetal_console"]
NOT_IN_PRODUCTION = ["pytest", "playwright", "schemathesis", "hypothesis", "importlinter", "sushy_tools", "kmock",
                     "flask"]

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1800)]


def production_environment(subprocess_env: dict) -> dict:
    """What a production process is given: its database, broker and Redis, its keys (this run's: the test
    database was written with them) and its names; no DEBUG, no lab, nothing else of the test run."""
    given = ["DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "SECRET_KEY", "FIELD_ENCRYPTION_KEY",
             "CERTIFICATE_SIGNING_KEY"]
    return {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **{name: subprocess_env[name] for name in given},
            "ALLOWED_HOSTS": "console.example.com", "SECURE_SSL_REDIRECT": "1"}


def test_requirements_txt_alone_passes_the_deploy_checks_with_production_settings(production_venv, subprocess_env):
    env = production_environment(subprocess_env)
    assert env["DATABASE_URL"].startswith("postgres")

    check = subprocess.run([str(production_venv), "manage.py", "check", "--deploy"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)

    # Success: no error (warnings, such as drf-spectacular's enum names or HSTS preload left to the operator, pass).
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ERRORS:" not in check.stdout + check.stderr


def test_requirements_txt_alone_imports_every_product_module(production_venv, subprocess_env):
    code = ("import django, importlib, pkgutil; django.setup(); "
            f"[importlib.import_module(m.name) for p in {PRODUCT_APPS!r} for m in pkgutil.walk_packages([p], p + '.') "
            "if not m.name.endswith('__main__')]")  # a package's __main__ runs its command
    env = {**production_environment(subprocess_env), "DJANGO_SETTINGS_MODULE": "vmetal_console.settings"}

    imported = subprocess.run([str(production_venv), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)

    assert imported.returncode == 0, imported.stderr[-3000:]


def test_requirements_txt_brings_neither_the_tests_nor_the_labs_packages(production_venv):
    code = f"import importlib.util; print([m for m in {NOT_IN_PRODUCTION!r} if importlib.util.find_spec(m)])"

    found = subprocess.run([str(production_venv), "-c", code], cwd="/", env={"PATH": os.environ["PATH"]},
                           capture_output=True, text=True, timeout=60)

    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
