"""The console's keys at startup: a production console (DATABASE_URL naming PostgreSQL) does not start without
SECRET_KEY, FIELD_ENCRYPTION_KEY and the certificate signing key, nor with DEBUG on; `manage.py check` fails,
naming the setting, when the field key is malformed or cannot read what the database holds; the embedded mode
makes its keys once under var/keys/; field keys rotate; a 404 shows no debug page."""
import io
import os
import stat
import subprocess
import sys

import pytest
from cryptography.fernet import Fernet
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from conftest import ROOT
from hosts.models import BareMetalHost

PRODUCTION_DB = "postgres://nobody@127.0.0.1:1/production"  # never reached: settings are read, nothing more
KEY_NAMES = ("SECRET_KEY", "FIELD_ENCRYPTION_KEY", "CERTIFICATE_SIGNING_KEY")


def run(args: list[str], env: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**env, "DJANGO_SETTINGS_MODULE": "vmetal_console.settings", "LOG_LEVEL": "WARNING"},
                          **kwargs)


def without(*names: str, **changes: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in names and not k.endswith("_FILE") and k != "DEBUG"}
    return {**env, **changes}


def test_without_its_keys_a_production_console_does_not_start_and_says_which_are_missing():
    started = run(["-c", "import django; django.setup()"], without(*KEY_NAMES, DATABASE_URL=PRODUCTION_DB))
    assert started.returncode != 0
    assert "Traceback" not in started.stderr, started.stderr
    assert "vMetal Console cannot start" in started.stderr
    for name in KEY_NAMES:
        assert f"{name} (or {name}_FILE)" in started.stderr

    check = run(["manage.py", "check"], without("FIELD_ENCRYPTION_KEY", DATABASE_URL=PRODUCTION_DB))
    assert check.returncode != 0 and "Traceback" not in check.stderr
    assert "these keys must be set and are not: FIELD_ENCRYPTION_KEY (or FIELD_ENCRYPTION_KEY_FILE)." in check.stderr


def test_debug_on_with_a_production_database_is_refused():
    started = run(["-c", "import django; django.setup()"], without(DATABASE_URL=PRODUCTION_DB, DEBUG="1"))
    assert started.returncode != 0 and "DEBUG is on" in started.stderr and "Traceback" not in started.stderr


def test_the_keys_may_come_from_files_and_a_file_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "signing.pem").write_text(os.environ["CERTIFICATE_SIGNING_KEY"])
    code = "import django; django.setup(); from hosts.gate import certificates; print(certificates.sign({})[1])"
    env = without("CERTIFICATE_SIGNING_KEY", DATABASE_URL=PRODUCTION_DB,
                  CERTIFICATE_SIGNING_KEY_FILE=str(tmp_path / "signing.pem"))
    assert run(["-c", code], env).returncode == 0
    env["CERTIFICATE_SIGNING_KEY_FILE"] = str(tmp_path / "missing.pem")
    refused = run(["-c", code], env)
    assert refused.returncode != 0
    assert f"CERTIFICATE_SIGNING_KEY_FILE={tmp_path / 'missing.pem'} cannot be read" in refused.stderr


def test_the_embedded_mode_makes_its_keys_once_readable_by_its_owner_only_and_never_prints_them(tmp_path):
    env = without(*KEY_NAMES, DATABASE_URL=f"sqlite:///{tmp_path / 'console.sqlite3'}",
                  VMETAL_VAR_DIR=str(tmp_path / "var"))
    code = ("import django, json; django.setup(); from django.conf import settings as s; "
            "print(json.dumps([s.SECRET_KEY, s.FIELD_ENCRYPTION_KEYS, s.CERTIFICATE_SIGNING_KEY, s.DEBUG]))")
    first, second = run(["-c", code], env), run(["-c", code], env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout  # made once, then kept
    folder = tmp_path / "var" / "keys"
    assert sorted(p.name for p in folder.iterdir()) == ["certificate-signing-key.pem", "field-encryption-key",
                                                          "secret-key"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
    assert '"-----BEGIN PRIVATE KEY-----' in first.stdout and first.stdout.endswith("false]\n")  # DEBUG off
    checked = run(["manage.py", "check"], env)
    assert checked.returncode == 0, checked.stderr
    for path in folder.iterdir():
        assert path.read_text().strip() not in checked.stdout + checked.stderr


def test_manage_py_check_fails_naming_the_setting_when_the_field_key_cannot_read_the_database(tmp_path):
    env = without(DATABASE_URL=f"sqlite:///{tmp_path / 'console.sqlite3'}", VMETAL_VAR_DIR=str(tmp_path / "var"))
    assert run(["manage.py", "check"], env).returncode == 0  # an empty database: nothing to read yet
    assert run(["manage.py", "migrate", "-v", "0"], env).returncode == 0
    assert run(["manage.py", "check"], env).returncode == 0

    wrong = run(["manage.py", "check"], {**env, "FIELD_ENCRYPTION_KEY": Fernet.generate_key().decode()})
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert ("FIELD_ENCRYPTION_KEY cannot decrypt data stored in this database (the key is wrong, or was rotated "
            "without keeping the old one as a second entry)") in wrong.stderr


def test_a_malformed_field_key_is_a_check_error_naming_the_setting(db, settings):
    settings.FIELD_ENCRYPTION_KEYS = [Fernet.generate_key().decode(), "not-a-fernet-key"]
    with pytest.raises(SystemCheckError) as failed:
        call_command("check")
    assert ("FIELD_ENCRYPTION_KEY: entry 2 of 2 is not a Fernet key (32 url-safe base64-encoded bytes)"
            in str(failed.value))
    assert "not-a-fernet-key" not in str(failed.value)


def test_a_malformed_signing_key_is_a_check_error_naming_the_setting(db, settings):
    settings.CERTIFICATE_SIGNING_KEY = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    with pytest.raises(SystemCheckError, match="CERTIFICATE_SIGNING_KEY is not an Ed25519 private key"):
        call_command("check")


def test_field_keys_rotate_new_key_first_then_rotate_field_keys_then_the_old_key_goes(db, demo_site, settings):
    old = settings.FIELD_ENCRYPTION_KEYS[0]
    password = BareMetalHost.objects.get(name="gpu-01").bmc_password
    new = Fernet.generate_key().decode()
    settings.FIELD_ENCRYPTION_KEYS = [new]
    with pytest.raises(SystemCheckError, match="FIELD_ENCRYPTION_KEY cannot decrypt data stored in this database"):
        call_command("check")
    settings.FIELD_ENCRYPTION_KEYS = [new, old]
    call_command("check")
    call_command("rotate-field-keys", stdout=io.StringIO())
    settings.FIELD_ENCRYPTION_KEYS = [new]
    call_command("check")
    assert BareMetalHost.objects.get(name="gpu-01").bmc_password == password
    settings.FIELD_ENCRYPTION_KEYS = [old, new]  # back under this run's key, which the checks at teardown read with
    call_command("rotate-field-keys", stdout=io.StringIO())


@pytest.mark.django_db(transaction=True)
def test_a_404_with_a_production_configuration_shows_a_tenant_member_no_debug_page(subprocess_env):
    User.objects.create_user("member", password="unused-password-1")
    code = ("import django; django.setup(); from django.contrib.auth.models import User; from django.test import "
            "Client; c = Client(SERVER_NAME='localhost'); c.force_login(User.objects.get(username='member')); r = c.get('/no-such-page/'); "
            "print(r.status_code); print(r.content.decode())")
    answer = run(["-c", code], {k: v for k, v in subprocess_env.items() if k != "DEBUG"})
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("404\n")
    assert "Using the URLconf" not in answer.stdout and "DEBUG = True" not in answer.stdout


@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_whose_field_key_cannot_read_the_database_stops_at_once_with_the_reason(subprocess_env):
    env = {**subprocess_env, "FIELD_ENCRYPTION_KEY": Fernet.generate_key().decode(),
           "CELERY_QUEUE_PREFIX": f"keys-test-{os.getpid()}."}
    worker = run(["-m", "celery", "-A", "vmetal_console", "worker", "-P", "threads", "-c", "1", "--without-heartbeat",
                  "--without-gossip", "--without-mingle"], env)
    assert worker.returncode == 1
    assert "vMetal Console worker cannot start:\n  FIELD_ENCRYPTION_KEY cannot decrypt data stored in this " \
           "database" in worker.stderr
