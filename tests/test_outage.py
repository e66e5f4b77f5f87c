"""The database and the broker may restart: PostgreSQL goes away while one host is provisioning, Redis while the
next one is. Meanwhile the web server and the agent listener answer 503 with Retry-After and a short body, never a
traceback; afterwards the processes carry on by themselves (none is restarted), every claim goes Available (a task
Redis lost is sent again by the periodic re-drive and reconcile) and no BMC got a power change twice."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEMO, wait_for

from .lab_conftest import gpu_pool
from .production_conftest import (ROOT, Console, free_port, http, lab_power_requests, port_open,  # noqa: F401
                                  private_postgres, private_redis)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]

HOSTS = 2
# The power requests of one provisioning, by the host's power when it is claimed: off after its checks (on into the
# agent's ramdisk, off, on from its disk), left on (switched off first), warm (its agent still running: off, on
# from its disk). A change sent twice would show as a repeat.
ONE_PROVISIONING = (["On", "ForceOff", "On"], ["ForceOff", "On", "ForceOff", "On"], ["ForceOff", "On"])
# The lab's quick deadlines and polls (tests/lab_conftest.py's FAST), but the power and agent limits production
# has: an outage of seconds must not be long enough for the console to ask a BMC again or give up on an agent.
SETTINGS = {
    "BMC_TIMEOUT_S": "2", "BMC_RETRY_S": "0.5", "POWER_POLL_S": "0.2", "NODE_READY_POLL_S": "2",
    "DRIVE_STALE_EVERY_S": "2", "RECONCILE_EVERY_S": "5", "REPAIR_LADDER": "0", "BOOT_SETTLE_S": "2",
    "BOOT_SETTLE_MARGIN_S": "1", "WARM_POLL_S": "3", "LOG_LEVEL": "INFO",
    # A request waits this long for a connection while PostgreSQL is away, then answers 503 (10 s by default).
    "DATABASE_POOL_TIMEOUT_S": "3",
}


@pytest.fixture
def consoles():
    """Console processes stopped when the test ends (tests/production_conftest.py's Console)."""
    made = []
    yield made
    for console in made:
        console.stop()


def provisioning_console(tmp_path: Path, postgres, redis) -> tuple[Console, dict]:
    web_port, agent_port = free_port(), free_port()
    signing_key = tmp_path / "signing-key.pem"
    signing_key.write_text(os.environ["CERTIFICATE_SIGNING_KEY"])
    env = {
        "DATABASE_URL": postgres.url, "CELERY_BROKER_URL": f"{redis.url}/0", "REDIS_URL": f"{redis.url}/1",
        # This run's keys (tests/run_keys.py); the signing key as a file, as a multi-line PEM cannot be a line of the
        # environment file.
        **{name: os.environ[name] for name in ("SECRET_KEY", "FIELD_ENCRYPTION_KEY")},
        "CERTIFICATE_SIGNING_KEY_FILE": str(signing_key),
        "ALLOWED_HOSTS": "127.0.0.1,localhost", "AGENT_LISTEN": f"127.0.0.1:{agent_port}",
        "AGENT_BOOT_URL": f"http://127.0.0.1:{agent_port}", "VMETAL_VAR_DIR": str(tmp_path / "var"),
        "WEB_PORT": str(web_port), **SETTINGS,
    }
    environment_file = tmp_path / "vmetal.env"
    environment_file.write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    console = Console(environment_file=environment_file, venv_bin=Path(sys.executable).parent, logs=tmp_path / "log")
    return console, {"web": f"http://127.0.0.1:{web_port}", "agent": f"http://127.0.0.1:{agent_port}",
                     "agent_port": agent_port, "web_port": web_port}


def manage(console: Console, *args: str, lab: bool = False) -> str:
    env = {**console.env("vmetal-web"), **({"VMETAL_LAB": "1"} if lab else {})}
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def assert_unavailable(status: int, headers: dict, body: str, *, json_body: bool) -> None:
    assert status == 503, (status, body[:500])
    assert int(headers["Retry-After"]) > 0
    assert "Traceback" not in body and len(body) < 500
    if json_body:
        assert json.loads(body)["error"] == "service unavailable"
    else:
        assert "Service unavailable" in body


def test_postgresql_and_redis_restart_mid_provisioning_and_nothing_is_lost_or_sent_twice(
        private_postgres, private_redis, tmp_path, spawn, consoles):
    console, urls = provisioning_console(tmp_path, private_postgres, private_redis)
    consoles.append(console)
    manage(console, "migrate", "-v", "0")
    manage(console, "apply", "-f", str(DEMO / "site.yaml"))
    key = manage(console, "token", "create", "ops", "--service-user", "admin").strip()
    for unit in ("vmetal-web", "vmetal-agent-listener", "vmetal-worker", "vmetal-beat"):
        console.start(unit)
    lab_dir = tmp_path / "var" / "lab"
    lab_log = open(tmp_path / "log" / "lab.log", "w")
    lab = spawn([sys.executable, "manage.py", "lab", "--hosts", str(HOSTS), "--gpu-hosts", str(HOSTS), "--tenants",
                 "one", "--boot-url", urls["agent"], "--power-delay", "0.2-0.5"], cwd=ROOT,
                env={**console.env("vmetal-web"), "VMETAL_LAB": "1"}, stdout=lab_log, stderr=subprocess.STDOUT)
    db = private_postgres

    def states() -> dict[str, str]:
        return dict(db.query("SELECT name, state FROM hosts_baremetalhost"))

    def report() -> str:
        return f"hosts {states()}\nclaims {db.query('SELECT name, phase, message FROM claims_nodeclaim')}\n" + \
            console.tails() + "\n--- lab ---\n" + (tmp_path / "log" / "lab.log").read_text()[-3000:]

    try:
        wait_for(lambda: list(states().values()) == ["available"] * HOSTS, timeout=240)
    except AssertionError:
        raise AssertionError(f"the lab's hosts were not inspected:\n{report()}") from None
    registered = lab_power_requests(lab_dir)
    pool = tmp_path / "pool.yaml"
    api = f"{urls['web']}/api/v1/pools/"
    token = {"Authorization": f"Token {key}"}

    def provision(quantity: int) -> None:
        """The pool grows to `quantity`: one more host starts provisioning."""
        pool.write_text(gpu_pool(quantity))
        manage(console, "apply", "-f", str(pool), "--tenant", "one")
        wait_for(lambda: "provisioning" in states().values(), timeout=60)

    def available(quantity: int) -> None:
        try:
            wait_for(lambda: db.query("SELECT count(*) FROM claims_nodeclaim WHERE phase = 'Available'")[0][0]
                     == quantity, timeout=240)
        except AssertionError:
            raise AssertionError(f"not {quantity} claim(s) Available after the outage:\n{report()}") from None

    # PostgreSQL goes away while the first host is provisioning.
    provision(1)
    db.stop()
    assert_unavailable(*http(api, headers=token), json_body=True)
    page = {"Cookie": "sessionid=" + "s" * 32, "Accept": "text/html"}  # a session: read from the database
    assert_unavailable(*http(f"{urls['web']}/hosts/", headers=page), json_body=False)
    assert_unavailable(*http(f"{urls['agent']}/agent/lookup", method="POST", body={"macs": ["52:54:00:1a:00:00"]}),
                       json_body=True)
    assert_unavailable(*http(f"{urls['agent']}/boot/52-54-00-1a-00-00.ipxe"), json_body=True)
    time.sleep(3)  # the outage itself: drives, heartbeats and beat's tasks fail meanwhile
    db.start()
    wait_for(lambda: http(api, headers=token)[0] == 200, timeout=30)
    # The agent listener reconnects by itself too (its own pool: it may answer 503 a moment longer than the web).
    wait_for(lambda: http(f"{urls['agent']}/agent/lookup", method="POST",
                          body={"macs": ["00:00:00:00:00:01"]})[0] == 403, timeout=30)

    available(1)

    # Redis goes away, and with it every queued task (nothing is saved), while the second host is provisioning.
    provision(2)
    private_redis.stop()
    assert port_open(urls["web_port"])
    time.sleep(3)  # the outage itself
    private_redis.start()
    available(2)

    assert all(console.running(name) for name in console.procs), report()  # each reconnected by itself
    assert lab.poll() is None
    assert set(states().values()) == {"provisioned"}
    # Each server got the power changes of one provisioning, none twice.
    after = lab_power_requests(lab_dir)
    for name, requests in after.items():
        assert requests[len(registered[name]):] in ONE_PROVISIONING, (name, after, report())
