"""docs/production.md works as written: its blocks marked tested run in order, as one shell session, on a fresh
private PostgreSQL and Redis, with the product's pins alone (requirements.txt's virtual environment); its
`systemctl enable --now` starts the shipped units' ExecStart lines as child processes; the lab supplies the servers
and the tenant's Kubernetes API; and the session ends with the claim Available. Every shipped unit passes
`systemd-analyze verify`."""
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEMO

from .lab_conftest import gpu_pool
from .production_conftest import (ETC_DIR, INSTALL_DIR, ROOT, UNITS, free_port, private_postgres,  # noqa: F401
                                  private_redis, production_venv, unit_names,  # noqa: F401
                                  unit_service)

GUIDE = ROOT / "docs" / "production.md"
BLOCKS = ["environment", "shell", "keys", "migrate", "admin", "start", "dhcp", "claim"]
# The lab's quick polls and settle window (its servers power on within a second), beside the guide's settings.
QUICK = {"BMC_RETRY_S": "0.5", "POWER_POLL_S": "0.2", "NODE_READY_POLL_S": "2", "DRIVE_STALE_EVERY_S": "2",
         "RECONCILE_EVERY_S": "5", "BOOT_SETTLE_S": "2", "BOOT_SETTLE_MARGIN_S": "1", "REPAIR_LADDER": "0"}


def guide_blocks() -> dict[str, tuple[str, str]]:
    """name → (language, body) of each fenced block that follows a `<!-- tested: NAME -->` line."""
    found = re.findall(r"^<!-- tested: ([a-z-]+) -->\n```(\w+)\n(.*?)^```$", GUIDE.read_text(), re.M | re.S)
    assert len(found) == GUIDE.read_text().count("<!-- tested:"), "every tested marker is right above its block"
    return {name: (language, body) for name, language, body in found}


def test_the_guide_marks_the_blocks_this_test_runs_in_its_order():
    assert list(guide_blocks()) == BLOCKS


def test_the_readme_points_to_the_guide():
    assert "(docs/production.md)" in (ROOT / "README.md").read_text()


def test_every_shipped_unit_passes_systemd_analyze_verify(tmp_path):
    """As installed: the install's virtual environment (here the tests' own, which has the same commands) and the
    environment file exist."""
    assert unit_names() == ["vmetal-agent-listener", "vmetal-beat", "vmetal-watch-pods", "vmetal-web", "vmetal-worker"]
    venv_bin = Path(sys.executable).parent
    (tmp_path / "vmetal.env").touch()
    for name in unit_names():
        text = (UNITS / f"{name}.service").read_text()
        text = text.replace(f"{INSTALL_DIR}/.venv/bin/", f"{venv_bin}/").replace(INSTALL_DIR, str(ROOT))
        (tmp_path / f"{name}.service").write_text(text.replace(f"{ETC_DIR}/vmetal.env", str(tmp_path / "vmetal.env")))
        (command,) = unit_service(name)["ExecStart"]
        assert (venv_bin / Path(command.split()[0]).name).exists(), name  # a real command
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    verify = subprocess.run(["systemd-analyze", "verify", *sorted(map(str, tmp_path.glob("*.service")))],
                            capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr


def prelude(*, units: Path, environment_file: Path, venv_bin: Path, logs: Path, pids: Path) -> str:
    """What the test puts before the guide's blocks: `systemctl` starts the units (tests/production_conftest.py's
    main) instead of systemd."""
    start = [sys.executable, "-m", "tests.production_conftest", units, environment_file, venv_bin, logs, pids]
    return f"""set -eu
systemctl() {{
  case "$1" in
    daemon-reload) ;;
    enable) shift; [ "$1" = --now ] && shift; (cd {ROOT} && {" ".join(map(str, start))} "$@") ;;
    *) echo "systemctl $1: not in this test" >&2; return 1 ;;
  esac
}}
"""


@pytest.mark.postgres
@pytest.mark.timeout(900)
def test_the_guide_takes_an_empty_database_to_a_claim_available(private_postgres, private_redis, production_venv,
                                                                 lab_sites, tmp_path):
    web_port, agent_port = free_port(), free_port()
    etc, var, units, dnsmasq, logs = (tmp_path / name for name in ("etc", "var", "systemd", "dnsmasq", "log"))
    for folder in (etc, units, dnsmasq, logs):
        folder.mkdir()
    site = lab_sites(hosts=1, gpu_hosts=1, tenants=["one"], console_url=f"http://127.0.0.1:{agent_port}",
                     var_dir=tmp_path / "lab", power_delay=(0.2, 0.5))
    site.start()
    blocks = guide_blocks()

    # The environment file: this site's values for exactly the settings the guide's example sets.
    values = {
        "DATABASE_URL": private_postgres.url, "CELERY_BROKER_URL": f"{private_redis.url}/0",
        "REDIS_URL": f"{private_redis.url}/1", "VMETAL_VAR_DIR": str(var), "IMAGE_DIR": str(var / "images"),
        "CERTIFICATE_ARCHIVE_DIR": str(var / "certificates"),
        "ALLOWED_HOSTS": "127.0.0.1,localhost", "CSRF_TRUSTED_ORIGINS": f"http://127.0.0.1:{web_port}",
        "TRUSTED_PROXIES": "127.0.0.1", "SECURE_PROXY_SSL_HEADER": "true", "AGENT_LISTEN": f"127.0.0.1:{agent_port}",
        "AGENT_BOOT_URL": f"http://127.0.0.1:{agent_port}",
    }
    language, example = blocks["environment"]
    assert language == "ini"
    assert list(read_environment_file_text(example)) == list(values)
    environment_file = etc / "vmetal.env"
    environment_file.write_text("".join(f"{key}={value}\n" for key, value in {
        **values, "WEB_PORT": str(web_port), **QUICK}.items()))
    # What the guide's claim block applies: the catalogue, the lab's servers, the tenant's API and its pool.
    shutil.copy(DEMO / "site.yaml", etc / "site.yaml")
    (etc / "hosts.yaml").write_text(site.manifests())
    (etc / "tenant-one.kubeconfig").write_text(site.tenants["one"].kubeconfig())
    (etc / "tenant-one.yaml").write_text(gpu_pool(1))

    venv = production_venv.parent.parent
    paths = {f"{INSTALL_DIR}/.venv": str(venv), INSTALL_DIR: str(ROOT), "/etc/systemd/system": str(units),
             ETC_DIR: str(etc), "/etc/dnsmasq.d": str(dnsmasq), "https://console.example.com":
             f"http://127.0.0.1:{web_port}", "tenant-one.example.com:6443": site.tenants["one"].endpoint}
    script = prelude(units=units, environment_file=environment_file, venv_bin=venv / "bin", logs=logs,
                     pids=tmp_path / "pids")
    for name in BLOCKS[1:]:
        language, body = blocks[name]
        assert language == "sh", name
        for written, here in paths.items():
            body = body.replace(written, here)
        script += f"\n# --- {name}\n{body}\n"
    (tmp_path / "guide.sh").write_text(script)

    try:
        done = subprocess.run(["bash", str(tmp_path / "guide.sh")], cwd=tmp_path, input="Adm1n-passw0rd-for-tests\n",
                              env={"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the guide did not reach a claim Available:\n{exc.stdout}\n{exc.stderr}\n"
                             f"{unit_logs(logs)}") from None
    finally:
        stop_units(tmp_path / "pids")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{unit_logs(logs)}"
    assert re.search(r"^\S+ Available$", done.stdout, re.M), done.stdout
    assert "dhcp-range=" in (dnsmasq / "vmetal.conf").read_text()  # written before the servers were registered
    assert sorted(path.name for path in units.iterdir()) == [f"{name}.service" for name in unit_names()]
    started = (tmp_path / "pids").read_text().split()
    assert len(started) == len(unit_names())
    assert private_postgres.query("SELECT count(*) FROM auth_user WHERE is_superuser AND username = 'admin'") == [(1,)]


def read_environment_file_text(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def unit_logs(logs: Path) -> str:
    return "\n".join(f"--- {path.name} ---\n" + "\n".join(path.read_text().splitlines()[-40:])
                     for path in sorted(logs.glob("*.log")))


def stop_units(pids: Path) -> None:
    """TERM each unit's process group, then KILL what still runs after 20 s."""
    import time

    groups = [int(pid) for pid in pids.read_text().split()] if pids.exists() else []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in groups:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(pid) for pid in groups):
            time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent, the starter, is gone) counts as ended
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
