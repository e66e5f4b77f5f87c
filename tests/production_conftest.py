"""The console as production runs it, for tests: a private PostgreSQL cluster and a private Redis (Debian's
`initdb`/`pg_ctl` and `redis-server`, on ports of their own, which a test may restart), and the console's processes
started from the systemd units shipped in deploy/systemd/ (their ExecStart lines, as child processes)."""
import fcntl
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
INSTALL_DIR = "/opt/vmetal"  # where the units and docs/production.md install the console
ETC_DIR = "/etc/vmetal"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


# --- the servers -------------------------------------------------------------------------------------------------

class PrivatePostgres:
    """A PostgreSQL cluster of its own (a temp directory, a free port), run as `postgres` when the tests run as root
    (initdb refuses root). `stop()` and `start()` restart it; the data stays."""

    def __init__(self):
        binaries = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not binaries:
            pytest.fail("needs PostgreSQL's server binaries: apt-get install postgresql")
        self.bin = Path(binaries[-1]).parent
        self.dir = Path(tempfile.mkdtemp(prefix="vmetal-pg-"))
        self.port = free_port()
        self.user = "postgres" if os.getuid() == 0 else None
        if self.user:
            shutil.chown(self.dir, self.user)
        self._run("initdb", "-D", str(self.dir / "data"), "-A", "trust", "-U", "vmetal", "--no-sync", "-E", "UTF8")
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "vmetal", "vmetal")
        self.url = f"postgres://vmetal@127.0.0.1:{self.port}/vmetal"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.dir)
        assert done.returncode == 0, f"{tool}: {done.stdout}{done.stderr}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-o", options, "-l", str(self.dir / "log"), "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")

    def query(self, sql: str, *params) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5) as connection:
            return connection.execute(sql, params).fetchall()

    def remove(self) -> None:
        try:
            self.stop()
        except AssertionError:
            pass  # stopped already
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A redis-server of its own (a free port, nothing saved): a restart loses every queued message, the worst
    case for the broker."""

    def __init__(self, directory: Path):
        if shutil.which("redis-server") is None:
            pytest.fail("needs redis-server: apt-get install redis-server")
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc = None
        self.url = f"redis://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir)], stdout=open(self.dir / "redis.log", "a"), stderr=subprocess.STDOUT,
            start_new_session=True)
        from conftest import wait_for

        wait_for(lambda: port_open(self.port), timeout=20)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def private_postgres(spawn):
    server = PrivatePostgres()
    yield server
    server.remove()


@pytest.fixture
def private_redis(spawn, tmp_path):
    server = PrivateRedis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def production_venv() -> Path:
    """A fresh virtual environment with requirements.txt alone, made once for these pins (shared by the xdist
    workers and later runs: its folder is named by the file's hash, outside pytest's basetemp, which concurrent
    pytest sessions prune); pip reads the machine's own configuration (its index), as an operator's install would.
    Returns its python."""
    pins = hashlib.sha256((ROOT / "requirements.txt").read_bytes()).hexdigest()[:16]
    venv = Path(tempfile.gettempdir()) / f"vmetal-production-venv-{pins}"
    python = venv / "bin" / "python"
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "installed").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
            install = subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(ROOT / "requirements.txt")],
                                     capture_output=True, text=True, timeout=1500)
            assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
            (venv / "installed").touch()
    return python


# --- the units -----------------------------------------------------------------------------------------------------

def unit_names() -> list[str]:
    return sorted(path.stem for path in UNITS.glob("*.service"))


def unit_service(name: str, units: Path = UNITS) -> dict[str, list[str]]:
    """The [Service] section of deploy/systemd/NAME.service: each key with every value it is given, in order (systemd
    keeps repeated keys such as Environment=)."""
    service, section = {}, None
    for line in (units / f"{name}.service").read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            service.setdefault(key.strip(), []).append(value.strip())
    return service


def unit_environment(name: str, environment_file: Path, units: Path = UNITS) -> dict[str, str]:
    """What systemd gives the unit's process: its Environment= defaults, overridden by its EnvironmentFile."""
    service = unit_service(name, units)
    env = {}
    for line in service.get("Environment", []):
        for item in shlex.split(line):
            key, _, value = item.partition("=")
            env[key] = value
    assert service["EnvironmentFile"] == [f"{ETC_DIR}/vmetal.env"], name
    env.update(read_environment_file(environment_file))
    return env


def read_environment_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip().strip('"').strip("'")
    return env


def unit_command(name: str, env: dict[str, str], venv_bin: Path, units: Path = UNITS) -> list[str]:
    """The unit's ExecStart, with ${VAR} expanded as systemd does and the install's virtual environment replaced by
    `venv_bin`; run it in ROOT (the unit's WorkingDirectory)."""
    service = unit_service(name, units)
    assert service["WorkingDirectory"] == [INSTALL_DIR], name
    (line,) = service["ExecStart"]
    words = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word) for word in shlex.split(line)]
    prefix = f"{INSTALL_DIR}/.venv/bin/"
    assert words[0].startswith(prefix), f"{name}: ExecStart runs the install's virtual environment"
    return [str(venv_bin / words[0][len(prefix):]), *words[1:]]


class Console:
    """The console's processes, each started from its unit (unit_command) with the unit's environment, logging
    to `logs/NAME.log`; stop() ends them all."""

    def __init__(self, *, environment_file: Path, venv_bin: Path, logs: Path, extra: dict[str, str] | None = None,
                 units: Path = UNITS):
        self.environment_file, self.venv_bin, self.logs, self.units = environment_file, venv_bin, logs, units
        self.extra = extra or {}
        self.procs: dict[str, subprocess.Popen] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def env(self, name: str) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
                **unit_environment(name, self.environment_file, self.units), **self.extra}

    def start(self, name: str) -> subprocess.Popen:
        env = self.env(name)
        command = unit_command(name, env, self.venv_bin, self.units)
        Path(env["VMETAL_VAR_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)  # systemd's StateDirectory=
        self.procs[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=open(self.log(name), "a"),
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self.procs[name]

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def running(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def tails(self, lines: int = 40) -> str:
        return "\n".join(f"--- {name} ---\n" + "\n".join(self.log(name).read_text().splitlines()[-lines:])
                         for name in self.procs)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def http(url: str, *, method: str = "GET", body: dict | None = None, headers: dict | None = None,
         timeout: float = 10) -> tuple[int, dict, str]:
    """(status, headers, body text) of one request; an HTTP error status is an answer too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode(errors="replace")


def lab_power_requests(lab_dir: Path) -> dict[str, list[str]]:
    """Every power request each of the lab's BMCs got (lab/redfish.py), by server name."""
    ports = json.loads((lab_dir / "ports.json").read_text())
    _, _, text = http(f"http://127.0.0.1:{ports['shared']}/lab/systems")
    return {name: system["power_requests"] for name, system in json.loads(text).items()}


def main(argv: list[str]) -> None:
    """`python -m tests.production_conftest UNITS ENV_FILE VENV_BIN LOGS PIDS NAME...`: start units as a detached
    child process each and append their pids to PIDS (the production guide's test: its `systemctl enable --now`)."""
    units, environment_file, venv_bin, logs, pids, *names = argv
    console = Console(environment_file=Path(environment_file), venv_bin=Path(venv_bin), logs=Path(logs),
                      units=Path(units))
    with open(pids, "a") as out:
        for name in names:
            out.write(f"{console.start(name.removesuffix('.service')).pid}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
