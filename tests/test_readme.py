"""The README's commands work as written on a fresh install, and it documents what bin/run reads."""
import io
import re
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from hosts.models import BareMetalHost

from .api_conftest import ISSUED_KEYS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def readme_line(start: str) -> str:
    lines = [line for line in README.splitlines() if line.startswith(start)]
    assert len(lines) == 1, f"one README line starts with {start!r}"
    return lines[0]


@pytest.mark.django_db(transaction=True)
def test_the_token_example_works_on_a_fresh_database_and_prints_no_axes_line(subprocess_env):
    example = readme_line("KEY=$(")
    command = re.fullmatch(r"KEY=\$\((.+?)\)\s+#.*", example).group(1)  # exactly what the reader runs
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=subprocess_env, capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    ISSUED_KEYS.add(key)  # the leak check knows it from here on
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    assert "AXES" not in done.stderr  # django-axes is quiet on every manage.py command
    client = APIClient()  # the README's curl lines: the pools, the metrics
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    paths = [re.search(r"http://127\.0\.0\.1:8000(\S+)", line).group(1)
             for line in README.splitlines() if line.startswith("curl ")]
    assert paths == ["/api/v1/pools/", "/metrics"]
    assert client.get(paths[0]).status_code == 200
    call_command("apply", "-f", str(ROOT / "demo" / "site.yaml"), "-f", str(ROOT / "demo" / "hosts.yaml"),
                 stdout=io.StringIO())
    metrics = client.get(paths[1])
    assert metrics.status_code == 200
    hosts = [float(line.rsplit(" ", 1)[1]) for line in metrics.content.decode().splitlines()
             if line.startswith("vmetal_hosts{")]
    assert sum(hosts) == BareMetalHost.objects.count() == 8


def test_every_setting_bin_run_reads_is_documented():
    names = set(re.findall(r"\$\{([A-Z_]+):-", (ROOT / "bin" / "run").read_text())) - {"VMETAL_VAR_DIR"}
    assert names >= {"PORT", "AGENT_PORT", "LAB_HOSTS"}
    assert not [name for name in names if f"`{name}`" not in README]


def test_the_readme_fits_on_a_page():
    assert len(README.splitlines()) <= 200


def test_the_readme_layout_names_every_app_directory():
    layout = README.split("## Layout", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"^([a-z_]+)/", layout, flags=re.M)) | set(re.findall(r"\b([a-z_]+)/", layout))
    apps = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests"}
    assert apps >= {"core", "events", "pools", "hosts", "claims", "autonodes", "manifests", "console", "lab", "agent",
                    "vmetal_console"}
    assert not sorted(apps - named), "every app directory is in the README's layout"
    assert "access" in named  # API tokens and their authentication, a room of their own


def test_the_readme_shows_the_two_commands_and_both_test_lanes():
    commands = README.split("## Two commands", 1)[1].split("```", 2)[1].split()
    assert commands == ["./bin/run", "./bin/test"]
    lanes = README.split("## Test lanes", 1)[1].split("\n## ", 1)[0]
    assert "`./bin/test`" in lanes and "`./bin/test --fast`" in lanes


def test_the_lanes_example_names_a_test_file_and_a_test_in_it():
    example = re.search(r"`\./bin/test (tests/\S+\.py) -k (\w+)`", README)
    path, keyword = ROOT / example.group(1), example.group(2)
    assert re.search(rf"def test_\w*{keyword}\w*\(", path.read_text())
