"""hosts.bmc.client against the lab's real Redfish emulator: finding systems, power, boot, media, failures."""
import http.server
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from hosts.bmc.client import BMC, KINDS, BMCError, parse_address
from lab.redfish import RedfishLab

USER, PASSWORD = "admin", "lab-password"
SYSTEMS = [
    {"name": "gpu-01", "mac": "52:54:00:00:00:01"},
    {"name": "gpu-02", "mac": "52:54:00:00:00:02"},
    {"name": "gpu-03", "mac": "52:54:00:00:00:03"},
    {"name": "gpu-04", "mac": "52:54:00:00:00:04", "password": "gpu-04-password"},
    {"name": "gpu-05", "mac": "52:54:00:00:00:05"},
    {"name": "gpu-06", "mac": "52:54:00:00:00:06"},
]


class Notices:
    """The lab controller's side: an HTTP endpoint that receives the lab's power notices."""

    def __init__(self):
        self.received, self.cond = [], threading.Condition()
        notices = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with notices.cond:
                    notices.received.append(body)
                    notices.cond.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/power"

    def wait(self, system, power_state, after=0, timeout=10.0):
        """The first notice for system/power_state among those received after the first `after`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for notice in self.received[after:]:
                    if notice["system"] == system and notice["power_state"] == power_state:
                        return notice
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {power_state} notice for {system}: {self.received}")
                self.cond.wait(left)

    def count(self):
        with self.cond:
            return len(self.received)


@pytest.fixture(scope="module")
def notices():
    receiver = Notices()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


@pytest.fixture(scope="module")
def lab(notices):
    with RedfishLab(SYSTEMS, USER, PASSWORD, power_delay=(0.2, 0.5), notify_url=notices.url) as lab:
        yield lab


@pytest.fixture(autouse=True)
def no_faults_left(request):
    yield
    if "lab" in request.fixturenames:
        lab = request.getfixturevalue("lab")
        for name in lab.faults():
            lab.clear_fault(name)


@pytest.fixture(scope="module")
def image_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    (root / "agent.iso").write_bytes(b"\0" * 4096)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def bmc(lab, name, password=PASSWORD, **kwargs):
    kwargs.setdefault("backoff", 0.05)
    return BMC(lab.system_address(name), USER, password, **kwargs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# addresses

def test_it_parses_the_redfish_schemes():
    assert parse_address("redfish://10.0.0.5/redfish/v1/Systems/1") == (
        "redfish", "https://10.0.0.5", "/redfish/v1/Systems/1")
    assert parse_address("redfish+http://127.0.0.1:8001/redfish/v1/Systems/gpu-01/") == (
        "redfish+http", "http://127.0.0.1:8001", "/redfish/v1/Systems/gpu-01")
    assert parse_address("redfish-virtualmedia://bmc.example:8443/redfish/v1/Systems/x")[1] == "https://bmc.example:8443"
    assert parse_address("redfish-virtualmedia+http://10.0.0.5/redfish/v1/Systems") == (
        "redfish-virtualmedia+http", "http://10.0.0.5", "")


SCHEMES = ("redfish://, redfish+https://, redfish+http://, redfish-virtualmedia://, redfish-virtualmedia+https://, "
           "redfish-virtualmedia+http://, idrac-redfish://, idrac-redfish+https://, idrac-redfish+http://, "
           "idrac-virtualmedia://, idrac-virtualmedia+https://, idrac-virtualmedia+http://, ilo5-redfish://, "
           "ilo5-redfish+https://, ilo5-redfish+http://, ilo5-virtualmedia://, ilo5-virtualmedia+https://, "
           "ilo5-virtualmedia+http://, ipmi://")


@pytest.mark.parametrize("address", ["10.0.0.5", "bmc-01.example:623"])
def test_an_address_without_a_scheme_is_refused_asking_for_ipmi_written_out(address):
    with pytest.raises(BMCError) as error:
        parse_address(address)
    assert (error.value.kind, error.value.transient) == ("unsupported", False)
    assert str(error.value) == (f"BMC address {address!r} has no scheme: write ipmi://{address} for an IPMI BMC, "
                                f"or use one of {SCHEMES}")


@pytest.mark.parametrize("address, expected", [
    ("ipmi://10.0.0.5", ("ipmi", "ipmi://10.0.0.5:623", "")),
    ("IPMI://bmc-01.example:6230", ("ipmi", "ipmi://bmc-01.example:6230", "")),
    ("ipmi://[fd00::5]:623/", ("ipmi", "ipmi://[fd00::5]:623", "")),
])
def test_an_ipmi_address_is_metal3s_host_and_port_623_by_default(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize("address, message", [
    ("ipmi://10.0.0.5/redfish/v1/Systems/1", "an ipmi:// address is ipmi://HOST[:PORT], without a path"),
    ("ipmi://admin:secret@10.0.0.5", "an ipmi:// address carries no credentials: they come from the host's Secret"),
    ("ipmi://10.0.0.5:99999", "has a bad port"),
])
def test_an_ipmi_address_with_more_than_a_host_and_port_is_refused(address, message):
    with pytest.raises(BMCError) as error:
        parse_address(address)
    assert error.value.kind == "unsupported" and message in str(error.value)
    assert "secret" not in str(error.value)


def test_an_unknown_scheme_lists_the_schemes_the_console_drives():
    with pytest.raises(BMCError) as error:
        parse_address("idrac://10.0.0.5/redfish/v1/Systems/1")
    assert str(error.value) == f"BMC address scheme idrac:// is not supported: use one of {SCHEMES}"


def test_only_an_unreachable_slow_or_failing_bmc_is_transient():
    assert {kind for kind in KINDS if BMCError(kind, "x").transient} == {"unreachable", "timeout", "server_error"}


# finding the system

def test_it_finds_the_system_by_its_path(lab):
    found = bmc(lab, "gpu-01").check("52:54:00:00:00:01")
    assert found["name"] == "gpu-01"
    assert found["system_id"] == lab.system_id("gpu-01")
    assert found["macs"] == ["52:54:00:00:00:01"]


def test_it_finds_the_system_by_boot_mac_when_the_address_names_none(lab):
    own_bmc = BMC(lab.bmc_address("gpu-02"), USER, PASSWORD, boot_mac="52:54:00:00:00:02")
    assert own_bmc.system().name == "gpu-02"
    # On the shared endpoint other systems answer 401 to gpu-04's own password: skipped, not fatal.
    shared = BMC(f"redfish+http://127.0.0.1:{lab.port}/redfish/v1/Systems", USER, "gpu-04-password")
    assert shared.check("52-54-00-00-00-04")["name"] == "gpu-04"


def test_an_unknown_system_or_mac_is_not_found(lab):
    with pytest.raises(BMCError) as error:
        BMC(f"redfish+http://127.0.0.1:{lab.port}/redfish/v1/Systems/no-such-box", USER, PASSWORD).system()
    assert (error.value.kind, str(error.value)) == ("not_found", "system not found: no-such-box")
    with pytest.raises(BMCError) as error:
        BMC(f"redfish+http://127.0.0.1:{lab.port}/redfish/v1/Systems", USER, PASSWORD,
            boot_mac="52:54:00:ff:ff:ff").system()
    assert (error.value.kind, str(error.value)) == ("not_found", "system not found: 52:54:00:ff:ff:ff")


def test_check_refuses_a_boot_mac_the_system_does_not_have(lab):
    with pytest.raises(BMCError) as error:
        bmc(lab, "gpu-01").check("52:54:00:00:00:02")
    assert error.value.kind == "mismatch"
    assert str(error.value) == f"boot MAC 52:54:00:00:00:02 not found on system {lab.system_id('gpu-01')}"


# power and boot

def test_power_on_lands_after_a_delay_and_power_off_too(lab):
    host = bmc(lab, "gpu-02")
    assert host.power_state() == "off"
    started = time.monotonic()
    host.power_on()
    assert host.power_state() == "off"  # accepted at once, lands 0.2–0.5 s later
    host.wait_power("on", deadline_s=5, poll_s=0.05)
    assert time.monotonic() - started >= 0.2
    host.power_off()
    host.wait_power("off", deadline_s=5, poll_s=0.05)
    assert host.power_state() == "off"


def test_the_one_time_boot_target_is_seen_at_power_on(lab, notices):
    host = bmc(lab, "gpu-03")
    seen = notices.count()
    host.set_boot_once("pxe")
    host.power_on()
    assert notices.wait("gpu-03", "On", after=seen)["boot_target"] == "Pxe"
    assert lab.state("gpu-03")["boot_target"] == "Hdd"  # "Once" was used up by that boot

    seen = notices.count()
    host.set_boot_once("disk")
    host.reset()
    assert notices.wait("gpu-03", "Off", after=seen)["cause"] == "reset"
    booted = notices.wait("gpu-03", "On", after=seen)
    assert (booted["boot_target"], booted["cause"]) == ("Hdd", "reset")
    host.wait_power("on", deadline_s=5, poll_s=0.05)


def test_virtual_media_is_inserted_and_ejected(lab, image_server):
    host = bmc(lab, "gpu-05")
    host.insert_virtual_media(f"{image_server}/agent.iso")
    media = lab.state("gpu-05")["virtual_media"]
    assert (media["image"], media["inserted"]) == (f"{image_server}/agent.iso", True)
    with open(media["file"], "rb") as f:  # the BMC downloaded it, as a real one does on insert
        assert f.read(16)
    host.eject_virtual_media()
    assert lab.state("gpu-05")["virtual_media"] == {"image": None, "inserted": False, "file": None}


# failures

def test_a_wrong_password_is_an_auth_error_and_is_not_retried(lab):
    started = time.monotonic()
    with pytest.raises(BMCError) as error:
        bmc(lab, "gpu-01", password="wrong", retries=3, backoff=1.0).power_state()
    assert (error.value.kind, str(error.value)) == ("auth", "BMC rejected credentials (401)")
    assert time.monotonic() - started < 1.0
    # Each BMC has its own credentials: the lab's default password is wrong for gpu-04.
    with pytest.raises(BMCError, match=r"^BMC rejected credentials \(401\)$"):
        bmc(lab, "gpu-04").check("52:54:00:00:00:04")
    assert bmc(lab, "gpu-04", password="gpu-04-password").check("52:54:00:00:00:04")["name"] == "gpu-04"


def test_https_to_a_bmc_that_speaks_http_is_a_tls_error_and_is_not_retried(lab):
    started = time.monotonic()
    with pytest.raises(BMCError) as error:
        BMC(lab.system_address("gpu-01", scheme="redfish+https"), USER, PASSWORD, retries=3, backoff=1.0).power_state()
    assert (error.value.kind, error.value.transient) == ("tls", False)
    assert str(error.value) == ("BMC TLS error: the BMC does not speak TLS on this port: if it serves plain HTTP, "
                                "use a redfish+http:// address")
    assert time.monotonic() - started < 1.0


def test_nothing_listening_is_connection_refused(lab):
    nowhere = BMC(f"redfish+http://127.0.0.1:{free_port()}/redfish/v1/Systems/1", USER, PASSWORD,
                  retries=1, backoff=0.05)
    with pytest.raises(BMCError) as error:
        nowhere.power_state()
    assert (error.value.kind, str(error.value)) == ("unreachable", "BMC unreachable: connection refused")

    lab.set_fault("gpu-06", "bmc-down")
    with pytest.raises(BMCError, match="^BMC unreachable: connection refused$"):
        bmc(lab, "gpu-06", retries=1).power_state()
    lab.clear_fault("gpu-06")
    assert bmc(lab, "gpu-06").power_state() in ("on", "off")


def test_a_few_server_errors_are_retried_then_succeed(lab):
    lab.set_fault("gpu-01", "bmc-500", requests=2)
    assert bmc(lab, "gpu-01", retries=3).power_state() in ("on", "off")
    assert "gpu-01" not in lab.faults()


def test_server_errors_that_last_fail_after_the_retries(lab):
    lab.set_fault("gpu-01", "bmc-500", requests=100)
    with pytest.raises(BMCError) as error:
        bmc(lab, "gpu-01", retries=2).power_state()
    assert (error.value.kind, str(error.value)) == ("server_error", "BMC error 500: Injected lab fault: bmc-500")
    assert lab.faults()["gpu-01"]["requests"] == 97  # one try and two retries, then it gave up


def test_slow_power_misses_a_short_deadline(lab):
    lab.set_fault("gpu-06", "slow-power")  # lands after 60 s
    host = bmc(lab, "gpu-06")
    host.power_on()
    with pytest.raises(BMCError) as error:
        host.wait_power("on", deadline_s=1, poll_s=0.1)
    assert (error.value.kind, str(error.value)) == ("timeout", "power on not reached within 1s")


def test_a_bmc_that_never_answers_times_out(lab):
    lab.set_fault("gpu-01", "bmc-hang")
    started = time.monotonic()
    with pytest.raises(BMCError) as error:
        bmc(lab, "gpu-01", timeout=0.5, retries=1).power_state()
    assert (error.value.kind, str(error.value)) == ("timeout", "BMC timed out after 0.5s")
    assert time.monotonic() - started < 3  # two tries of 0.5 s and a back-off, not a hang


def test_a_port_that_accepts_but_never_reads_times_out():
    with socket.socket() as listener:  # the kernel completes the handshake; nobody ever answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(BMCError) as error:
            BMC(f"redfish+http://127.0.0.1:{port}/redfish/v1/Systems/1", USER, PASSWORD,
                timeout=0.5, retries=0).power_state()
    assert (error.value.kind, str(error.value)) == ("timeout", "BMC timed out after 0.5s")
    assert time.monotonic() - started < 2


def test_the_emulator_is_gone_after_the_lab_stops(redfish_labs):
    lab = redfish_labs(SYSTEMS[:1], USER, PASSWORD, power_delay=(0.2, 0.5)).start()
    address = lab.system_address("gpu-01")
    assert BMC(address, USER, PASSWORD).power_state() == "off"
    lab.stop()
    with pytest.raises(BMCError, match="connection refused"):
        BMC(address, USER, PASSWORD, retries=0).power_state()
    assert not Path(lab._dir).exists()


# a step's BMC errors, driven through the register flow against the emulator: what never heals fails at once

def registered(lab, name: str, *, password: str = PASSWORD, address: str | None = None):
    from hosts.services import host_create

    mac = next(s["mac"] for s in SYSTEMS if s["name"] == name)
    return host_create(values={"name": f"host-{name}", "bmc_address": address or lab.system_address(name),
                               "bmc_username": USER, "bmc_password": password, "boot_mac": mac}, actor="test")


def drive(host):
    from hosts.engine.drive import drive as engine_drive

    started = time.monotonic()
    engine_drive(host.pk)
    host.refresh_from_db()
    return time.monotonic() - started


@pytest.mark.django_db
@pytest.mark.parametrize("name, password, address, reason", [
    ("gpu-01", "wrong", None, "BMC rejected credentials (401)"),
    ("gpu-01", PASSWORD, "redfish+http://127.0.0.1:{port}/redfish/v1/Systems/no-such-box", "system not found: no-such-box"),
    ("gpu-01", PASSWORD, "gpu-02's", "boot MAC 52:54:00:00:00:01 not found on system {gpu-02}"),
    ("gpu-02", PASSWORD, "https", "BMC TLS error: the BMC does not speak TLS on this port: if it serves plain HTTP, "
                                  "use a redfish+http:// address"),
])
def test_a_bmc_error_that_never_heals_fails_the_step_at_once_with_its_reason(lab, name, password, address, reason):
    from events.models import Event

    if address == "https":
        address = lab.system_address(name, scheme="redfish+https")
    elif address == "gpu-02's":
        address = lab.system_address("gpu-02")
    elif address:
        address = address.format(port=lab.port)
    reason = reason.replace("{gpu-02}", lab.system_id("gpu-02"))
    host = registered(lab, name, password=password, address=address)
    assert drive(host) < 2  # one drive, no retries
    assert (host.state, host.error_type, host.error_message) == (
        "error", "register error", f"register failed at bmc_check: {reason}")
    assert "last_error" not in host.flow
    assert Event.objects.filter(host=host, kind="step", step="bmc_check", message=f"failed: {reason}").exists()


@pytest.mark.django_db
def test_a_bmc_that_is_down_is_retried_with_its_last_error_until_the_step_deadline(lab, settings):
    from datetime import timedelta

    from django.utils import timezone

    from hosts.models import BareMetalHost

    settings.BMC_TIMEOUT_S = 1
    host = registered(lab, "gpu-06")
    lab.set_fault("gpu-06", "bmc-down")
    for _ in range(2):
        drive(host)
        assert host.state == "registering" and host.error_message == ""
        assert host.flow["step"] == "bmc_check"
        assert host.flow["last_error"] == "BMC unreachable: connection refused"
    # The step's own deadline passes (POWER_DEADLINE_S) with the BMC still away.
    started = timezone.now() - timedelta(seconds=settings.POWER_DEADLINE_S + 1)
    BareMetalHost.objects.filter(pk=host.pk).update(flow={**host.flow, "step_started_at": started.isoformat()})
    drive(host)
    assert (host.state, host.error_type) == ("error", "register error")
    assert host.error_message == (f"register failed at bmc_check: bmc_check did not finish within "
                                  f"{int(settings.POWER_DEADLINE_S)}s; last error: BMC unreachable: connection refused")


@pytest.mark.django_db
def test_a_host_stored_with_an_address_without_a_scheme_fails_registration_cleanly(lab, caplog):
    from hosts.models import BareMetalHost

    # Stored by a console that did not check addresses (no validation on the way in).
    host = BareMetalHost.objects.create(name="old-ipmi", bmc_address="10.0.0.5:623", bmc_username=USER,
                                        bmc_password=PASSWORD, boot_mac="52:54:00:00:00:99", state="registering")
    drive(host)
    assert (host.state, host.error_type) == ("error", "register error")
    assert host.error_message == ("register failed at bmc_check: BMC address '10.0.0.5:623' has no scheme: write "
                                  f"ipmi://10.0.0.5:623 for an IPMI BMC, or use one of {SCHEMES}")
    assert not [r for r in caplog.records if r.exc_info]  # no traceback logged


@pytest.mark.django_db
def test_an_agent_that_looks_up_before_the_power_on_is_seen_landed_is_found_by_the_lookup(lab, agent_client):
    """A fast agent: the server boots and its agent looks up before any drive sees the power on land. The boot
    the power request started is recorded with the request, so the lookup step takes that agent's session."""
    from hosts.models import AgentSession

    from .factories import lookup

    host = registered(lab, "gpu-05")
    drive(host)  # the BMC answers: the host goes on to inspection
    for _ in range(20):
        if "on" in host.flow.get("data", {}).get("power_on_pxe", {}):
            break
        assert host.flow.get("step") == "power_on_pxe", host.flow
        bmc(lab, "gpu-05").wait_power("off", deadline_s=10, poll_s=0.05)  # were it on, it is powered off first
        drive(host)
    else:
        raise AssertionError(f"the power-on was never sent: {host.flow}")
    # The agent, booted from what the boot path gave it, looks up before the console sees the power land.
    script = agent_client.get(f"/boot/{host.boot_mac.replace(':', '-')}.ipxe").content.decode()
    kernel = next(line for line in script.splitlines() if line.startswith("kernel "))
    secret = dict(word.split("=", 1) for word in kernel.split() if word.startswith("vmetal."))["vmetal.boot_secret"]
    lookup(agent_client, host, secret)
    assert AgentSession.objects.filter(host=host, active=True).count() == 1
    bmc(lab, "gpu-05").wait_power("on", deadline_s=10, poll_s=0.05)
    drive(host)  # the power is on, and the lookup step finds the agent's session
    assert "agent_lookup" in host.flow["done"], host.flow


@pytest.mark.django_db
def test_a_kept_bmc_reads_the_power_state_from_the_system_and_an_action_after_it_still_lands(lab):
    host = BMC.kept(lab.system_address("gpu-06"), USER, PASSWORD, backoff=0.05)
    with host:
        assert host.power_state() == "off"  # finds the system: its path is known from here on
    with BMC.kept(lab.system_address("gpu-06"), USER, PASSWORD, backoff=0.05) as again:
        assert again is host and again.power_state() == "off"  # the System's JSON alone
        again.power_on()  # the action reads the System it needs
        again.wait_power("on", deadline_s=5, poll_s=0.05)
        again.power_off()
        again.wait_power("off", deadline_s=5, poll_s=0.05)


@pytest.mark.django_db
def test_a_power_request_is_first_looked_at_when_the_hosts_power_landed_last_time(settings):
    from datetime import timedelta

    from django.core.cache import cache
    from django.utils import timezone

    from hosts.flows.steps import POWER_LANDS_KEY, _power_recheck_s, power_landed

    settings.POWER_POLL_S = 2
    cache.delete(POWER_LANDS_KEY.format(7, "on"))
    assert _power_recheck_s(7, "on", sent=True) == 2  # nothing learned: every POWER_POLL_S
    sent = {"on": (timezone.now() - timedelta(seconds=6)).isoformat()}
    power_landed(7, "on", sent)  # seen landed at the third look, 6 s after the request
    assert _power_recheck_s(7, "on", sent=True) == pytest.approx(4, abs=0.1)  # then 6 s: two looks, not three
    assert _power_recheck_s(7, "on", sent=False) == 2  # a request already out: looked at every POWER_POLL_S
    assert _power_recheck_s(7, "off", sent=True) == 2  # each direction learned apart
    power_landed(7, "on", {"on": (timezone.now() - timedelta(seconds=4.5)).isoformat()})  # landed by the first look
    assert _power_recheck_s(7, "on", sent=True) == 2  # it may have landed much earlier: half of it is learned
