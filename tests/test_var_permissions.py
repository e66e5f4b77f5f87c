"""What the embedded console keeps under var/ is its owner's only: the directory (0700), the SQLite database
(0600: sessions, boot secrets), a new one and one an older start left readable alike."""
import os
import stat
import subprocess
import sys

from conftest import ROOT

CONNECT = "import django; django.setup(); from django.db import connection; connection.ensure_connection()"


def start_embedded(var, database):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_FILE")}
    env.update(DATABASE_URL=f"sqlite:///{database}", VMETAL_VAR_DIR=str(var),
               DJANGO_SETTINGS_MODULE="vmetal_console.settings", LOG_LEVEL="WARNING")
    started = subprocess.run([sys.executable, "-c", CONNECT], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 0, started.stderr


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_embedded_database_and_var_are_readable_by_their_owner_only(tmp_path):
    var = tmp_path / "var"
    start_embedded(var, var / "vmetal.sqlite3")
    assert mode(var) == 0o700
    assert mode(var / "vmetal.sqlite3") == 0o600
    for wal in (var / "vmetal.sqlite3-wal", var / "vmetal.sqlite3-shm"):
        assert not wal.exists() or mode(wal) == 0o600


def test_a_database_and_var_an_older_start_left_readable_are_closed(tmp_path):
    var = tmp_path / "var"
    var.mkdir(mode=0o755)
    var.chmod(0o755)
    database = var / "vmetal.sqlite3"
    database.touch()
    database.chmod(0o644)
    start_embedded(var, database)
    assert mode(var) == 0o700 and mode(database) == 0o600
