"""The lab's BMCs: sushy-tools' Redfish emulator (fake driver) run as a subprocess, with power
changes that land seconds later, per-BMC credentials, injected faults and power-on notices.

    with RedfishLab([{"name": "gpu-01", "mac": "52:54:00:00:00:01"}], "admin", "secret",
                    power_delay=(0.2, 0.5), notify_url="http://127.0.0.1:9000/power") as lab:
        lab.system_address("gpu-01")   # redfish+http://127.0.0.1:PORT/redfish/v1/Systems/<uuid>
        lab.set_fault("gpu-01", "bmc-500", requests=2)

One process serves every BMC. Each system gets its own port, as real BMCs each have their own
address (so `bmc-down` is a closed port), and one shared port serves all systems by path (like
sushy-tools' usual single endpoint, e.g. the demo's :8001) plus the lab's control API under /lab/.

What the subprocess adds around sushy-tools' Flask app (`python -m lab.redfish serve --config F`):

- power: the fake driver already defers power changes (1–11 s, whole seconds) but applies them
  only when someone next reads the system. Here the delay range is configurable (floats), a
  ticker applies due changes on time, and every landing is recorded as an event and, when
  `notify_url` is set, POSTed there as JSON {"system", "uuid", "power_state", "boot_target",
  "boot_once", "virtual_media", "macs", "cause", "request" (the Redfish ResetType asked for, e.g.
  GracefulShutdown), "seq", "time"}: the boot target is the one in
  force at the moment of power-on. A "Once" boot override is consumed by that power-on (target
  back to Hdd), which sushy-tools itself does not do (it treats every override as Continuous).
- the machine's own power changes (POST /lab/power, `RedfishLab.power_changed`): a lab VM whose
  guest powered itself off is Off at once, with an event of that cause (lab/site.py).
- virtual media named by QEMU's address of this host (10.0.2.2, what the lab's VMs use) is downloaded
  from 127.0.0.1: the BMC runs on the host.
- credentials: sushy-tools' htpasswd check (bcrypt), one file per BMC: a request for a system
  with another system's password, or any wrong one, gets 401 like a real BMC.
- faults, one per system, set at start or at run time (POST /lab/faults): `bmc-500` (500 for
  every request, for N requests or S seconds or until cleared), `bmc-down` (its port closed:
  connection refused; on the shared port its requests are cut without an answer), `bmc-hang`
  (requests are accepted and never answered), `slow-power` (power changes land after 60 s, or
  `delay`).
- BIOS and firmware (sushy-tools' fake driver keeps neither): Systems/<id>/Bios shows the attributes in force,
  its Settings object takes a PATCH of attributes (an unknown name is refused with 400) and shows them pending;
  they take effect when the server next powers on or resets, as a real BIOS applies them at POST. A BMC with
  `bios_no_stick` drops the named attributes (["*"]: all) at that reboot: the setting never sticks.
  UpdateService/FirmwareInventory lists the server's components (BIOS, BMC, NICs, GPUs) with their versions,
  each related to its system; SimpleUpdate (ImageURI, Targets: one inventory item) answers 202 with a Task
  (TaskService/Tasks/N) that runs `update_s` seconds, then Completed with the version the image's file name
  carries (bios-2.4.0.bin → 2.4.0), or Exception with `update_fails`' message (the version unchanged).

sushy-tools' own "external notifier" is not used: per system (`external_notifier: True`) it PUTs
the whole system dict to the one EXTERNAL_NOTIFICATION_URL synchronously, inside the Redfish
request, with no timeout, on *every* change (power request, boot device, boot image), and a
pending power change lands only when someone reads the system, so a power-on nobody polls is never
announced; a notifier that is down turns the BMC's answer into a 500.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import logging
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid as uuidlib
import weakref
from pathlib import Path

FAULT_KINDS = ("bmc-500", "bmc-down", "bmc-hang", "slow-power")
SLOW_POWER_DELAY_S = 60.0
GUEST_HOST = "10.0.2.2"  # the host as a lab VM sees it (QEMU user-mode network; lab/vm.py)
ROOT = Path(__file__).resolve().parent.parent
SYSTEM_PATH = re.compile(r"^/redfish/v1/Systems/([^/]+)")
DRIVE_PATH = re.compile(r"^/redfish/v1/Systems/[^/]+/Storage/[^/]+/Drives/([^/]+)/?$")
PROCESSOR_PATH = re.compile(r"^/redfish/v1/Systems/[^/]+/Processors/([^/]+)/?$")
NIC_PATH = re.compile(r"^/redfish/v1/Systems/[^/]+/EthernetInterfaces/([^/]+)/?$")
STORAGE_ID = "1"  # each lab BMC has one storage subsystem holding its server's drives
BOOT_ENABLED = ("Once", "Continuous", "Disabled")
# A lab server's BIOS attributes and firmware components unless its spec gives its own (the names Dell's and
# Supermicro's BIOSes use; inventory ids as such BMCs list them).
LAB_BIOS = {"ProcVirtualization": "Disabled", "SriovGlobalEnable": "Disabled", "LogicalProc": "Enabled",
            "BootMode": "Uefi", "PowerProfile": "Balanced"}
LAB_FIRMWARE = {"BIOS": "2.3.1", "BMC": "1.10.2", "NIC.1": "22.31.1014"}
BIOS_PATH = re.compile(r"^/redfish/v1/Systems/[^/]+/BIOS/Settings/?$", re.I)
INVENTORY = "/redfish/v1/UpdateService/FirmwareInventory"
SIMPLE_UPDATE = "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
TASKS = "/redfish/v1/TaskService/Tasks"
LOG = logging.getLogger("lab.redfish")


class LabError(RuntimeError):
    """The emulator could not be started, or refused a control request."""


def system_uuid(name: str) -> str:
    """A stable UUID per system name, so addresses survive a lab restart."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"vmetal-lab/{name}"))


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP port can be bound now (a lab restart asks for the ports it had)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _htpasswd(username: str, password: str) -> str:
    import bcrypt

    # Cost 4: sushy-tools checks the hash on every request, and this guards a loopback lab.
    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    return f"{username}:{digest}\n"


class RedfishLab:
    """N fake BMCs in one sushy-tools subprocess on 127.0.0.1; see the module docstring.

    systems: [{"name", "mac", "uuid"?, "username"?, "password"?, "power_state"? ("Off"),
               "power_delay"? ((lo, hi) s), "fault"? (kind or {"kind", "seconds", "requests",
               "delay"}), "extra_macs"? [...], "tls"? (serve HTTPS on its own port with a self-signed
               certificate, as many BMCs ship: `redfish+https://` addresses), "drives"? [{"id", "serial",
               "model", "size_bytes", "manufacturer"?, "media_type"?}] (its Storage/1/Drives; none: the BMC
               reports an empty storage collection), "ipmi"? (its own port is an IPMI LAN server instead of
               Redfish: `ipmi://` addresses, lab/ipmi.py), "ipmi_ciphers"? (False: it refuses every cipher suite),
               "sel"? [{"sensor_type", "offset"?, "sensor"?, "deasserted"?}] (its IPMI system event log),
               "inventory"? {"cpu": {"model", "vendor", "sockets", "cores", "threads"}, "memory_gib",
               "gpus": [{"model", "manufacturer"}], "nic_speed_gbps"?} (its Processors, CPUs and GPUs,
               MemorySummary and its NICs' SpeedMbps: the
               console's out-of-band inspection reads them; none: the BMC lists no processors),
               "bios"? {attribute: value} (LAB_BIOS by default), "bios_no_stick"? [attribute, ...] (["*"]: every
               one), "firmware"? {inventory id: version} (LAB_FIRMWARE by default), "update_fails"? (a message:
               every SimpleUpdate's task ends in Exception with it), "update_s"? (how long an update runs; 1 s)}]
    """

    def __init__(self, systems: list[dict], username: str = "admin", password: str = "password",
                 power_delay: tuple[float, float] = (1, 11), notify_url: str | None = None,
                 port: int = 0, host: str = "127.0.0.1", startup_timeout: float = 20.0):
        self.username, self.password = username, password
        self.power_delay = _delay_range(power_delay)
        self.notify_url, self.host, self.port = notify_url, host, port
        self.startup_timeout = startup_timeout
        self._systems: dict[str, dict] = {}
        for spec in systems:
            name, mac = spec["name"], spec["mac"].lower()
            if name in self._systems:
                raise ValueError(f"duplicate system name {name!r}")
            self._systems[name] = {
                "name": name, "mac": mac, "uuid": spec.get("uuid") or system_uuid(name),
                "username": spec.get("username") or username,
                "password": spec.get("password") or password,
                "power_state": spec.get("power_state", "Off"),
                "power_delay": _delay_range(spec["power_delay"]) if spec.get("power_delay") else None,
                "fault": _fault_spec(spec["fault"]) if spec.get("fault") else None,
                "macs": [mac] + [m.lower() for m in spec.get("extra_macs", ())],
                "port": int(spec.get("port") or 0),  # 0: a free one
                "tls": bool(spec.get("tls")),
                "drives": [dict(d) for d in spec.get("drives") or ()],
                "ipmi": bool(spec.get("ipmi")), "ipmi_ciphers": spec.get("ipmi_ciphers", True),
                "sel": [dict(e) for e in spec.get("sel") or ()],
                "inventory": dict(spec["inventory"]) if spec.get("inventory") else None,
                "bios": dict(spec.get("bios") or LAB_BIOS), "bios_no_stick": list(spec.get("bios_no_stick") or ()),
                "firmware": dict(spec.get("firmware") or LAB_FIRMWARE),
                "update_fails": spec.get("update_fails") or "", "update_s": float(spec.get("update_s", 1.0)),
            }
        self._proc: subprocess.Popen | None = None
        self._dir: str | None = None
        self._ports: dict[str, int] = {}
        self._finalizer = None

    # life cycle

    def start(self) -> "RedfishLab":
        if self._proc is not None:
            return self
        self._dir = tempfile.mkdtemp(prefix="vmetal-redfish-")
        config = self.write_config(self._dir)
        log = open(os.path.join(self._dir, "emulator.log"), "wb")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.pop("SUSHY_EMULATOR_CONFIG", None)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "lab.redfish", "serve", "--config", config,
                 "--parent-pid", str(os.getpid())],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        # Stops the emulator even when the caller forgets to (garbage collection, interpreter exit).
        self._finalizer = weakref.finalize(self, _terminate, self._proc, self._dir)
        ready = os.path.join(self._dir, "ready.json")
        deadline = time.monotonic() + self.startup_timeout
        while not os.path.exists(ready):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise LabError(f"Redfish emulator did not start: {tail or 'no output'}")
            time.sleep(0.05)
        with open(ready) as f:
            info = json.load(f)
        self.port, self._ports = info["port"], info["ports"]
        return self

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._proc, self._finalizer, self._ports = None, None, {}

    def __enter__(self) -> "RedfishLab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(os.path.join(self._dir or "", "emulator.log"), "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except OSError:
            return ""

    def write_config(self, directory: str) -> str:
        """The emulator config: sushy-tools' own options (a plain `sushy-emulator --config` run
        works with the lab's credentials) plus the LAB_* options that only `serve` reads."""
        state = os.path.join(directory, "state")  # fresh per lab: the fake driver persists here
        global_auth = os.path.join(directory, "htpasswd")
        with open(global_auth, "w") as f:
            f.write(_htpasswd(self.username, self.password))
        lab_systems = {}
        for s in self._systems.values():
            auth = global_auth
            if (s["username"], s["password"]) != (self.username, self.password):
                auth = os.path.join(directory, f"htpasswd-{s['uuid']}")
                with open(auth, "w") as f:
                    f.write(_htpasswd(s["username"], s["password"]))
            lab_systems[s["uuid"]] = {"name": s["name"], "auth_file": auth, "port": s["port"],
                                      "power_delay": s["power_delay"], "fault": s["fault"],
                                      "tls": _self_signed(directory) if s["tls"] else None,
                                      "drives": {d["id"]: d for d in s["drives"]},
                                      "inventory": s["inventory"],
                                      "bios": s["bios"], "bios_no_stick": s["bios_no_stick"],
                                      "firmware": s["firmware"], "update_fails": s["update_fails"],
                                      "update_s": s["update_s"]}
            if s["ipmi"]:  # the lab's private directory (0700), as its htpasswd files
                lab_systems[s["uuid"]].update(ipmi=True, ipmi_credentials=[s["username"], s["password"]],
                                              ipmi_ciphers=s["ipmi_ciphers"], sel=s["sel"])
        options = {
            "SUSHY_EMULATOR_LISTEN_IP": self.host,
            "SUSHY_EMULATOR_LISTEN_PORT": self.port,
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_FAKE_SYSTEMS": [
                {"uuid": s["uuid"], "name": s["name"], "power_state": s["power_state"],
                 "external_notifier": False,
                 "nics": [{"mac": mac} for mac in s["macs"]]}
                for s in self._systems.values()],
            # sushy-tools' static storage: one subsystem per BMC with its server's drives (an empty collection
            # for a BMC that reports none); the drives' serial, model and maker are the lab's (_LabApp.drive).
            "SUSHY_EMULATOR_STORAGE": {
                s["uuid"]: [{"Id": STORAGE_ID, "Name": "Local Storage", "Drives": [d["id"] for d in s["drives"]],
                             "StorageControllers": [{"MemberId": "0", "Name": "NVMe", "SpeedGbps": 32}]}]
                if s["drives"] else [] for s in self._systems.values()},
            "SUSHY_EMULATOR_DRIVES": {
                (s["uuid"], STORAGE_ID): [{"Id": d["id"], "Name": d["id"], "CapacityBytes": int(d["size_bytes"]),
                                           "Protocol": "NVMe"} for d in s["drives"]]
                for s in self._systems.values() if s["drives"]},
            "SUSHY_EMULATOR_STATE_DIR": state,
            "SUSHY_EMULATOR_AUTH_FILE": global_auth,
            "SUSHY_EMULATOR_VMEDIA_VERIFY_SSL": False,
            "SUSHY_EMULATOR_FEATURE_SET": "full",
            "LAB_POWER_DELAY": self.power_delay,
            "LAB_NOTIFY_URL": self.notify_url,
            "LAB_SYSTEMS": lab_systems,
            "LAB_READY_FILE": os.path.join(directory, "ready.json"),
        }
        path = os.path.join(directory, "emulator.conf")
        with open(path, "w") as f:
            f.write("# Generated by lab.redfish: sushy-tools emulator config (Python syntax).\n")
            for key, value in options.items():
                f.write(f"{key} = {value!r}\n")
        return path

    # addresses

    @property
    def url(self) -> str:
        """The shared endpoint: every system by path, and the control API under /lab/."""
        return f"http://{self.host}:{self.port}"

    def system_id(self, name: str) -> str:
        return self._system(name)["uuid"]

    def system_port(self, name: str) -> int:
        self._system(name)
        return self._ports[name]

    def is_ipmi(self, name: str) -> bool:
        return self._system(name)["ipmi"]

    def ipmi_address(self, name: str) -> str:
        """An IPMI system's BMC: ipmi://HOST:PORT (UDP)."""
        if not self.is_ipmi(name):
            raise LabError(f"lab system {name!r} has a Redfish BMC, not IPMI")
        return f"ipmi://{self.host}:{self.system_port(name)}"

    def system_address(self, name: str, scheme: str = "redfish+http", shared: bool = False) -> str:
        """The BMC address a host is registered with: its own port, or the shared one (an IPMI system: its
        ipmi:// address, unless `shared`)."""
        if self.is_ipmi(name) and not shared:
            return self.ipmi_address(name)
        port = self.port if shared else self.system_port(name)
        return f"{scheme}://{self.host}:{port}/redfish/v1/Systems/{self.system_id(name)}"

    def bmc_address(self, name: str, scheme: str = "redfish+http") -> str:
        """The system's own BMC without a system path: the console finds it by boot MAC."""
        if self.is_ipmi(name):
            return self.ipmi_address(name)
        return f"{scheme}://{self.host}:{self.system_port(name)}/redfish/v1/Systems"

    # faults

    def set_fault(self, name: str, kind: str, seconds: float | None = None,
                  requests: int | None = None, delay: float | None = None) -> dict:
        """Replace the system's fault. seconds: how long it lasts (None: until cleared);
        requests: bmc-500 only, how many requests fail; delay: slow-power only (default 60 s)."""
        body = {"system": name, **_fault_spec({"kind": kind, "seconds": seconds,
                                                "requests": requests, "delay": delay})}
        return self._call("POST", "/lab/faults", body)

    def power_changed(self, name: str, power_state: str, cause: str = "machine") -> dict:
        """The server changed its own power (a VM guest powered itself off): the BMC shows it now, and a power
        event with this cause is recorded."""
        self._system(name)
        return self._call("POST", "/lab/power", {"system": name, "power_state": power_state, "cause": cause})

    def add_sel(self, name: str, sensor_type: int, offset: int = 0, sensor: int = 1,
                deasserted: bool = False) -> int:
        """An entry in an IPMI system's event log (sensor type and event offset: IPMI 2.0, table 42-3); its record
        id."""
        if not self.is_ipmi(name):
            raise LabError(f"lab system {name!r} has a Redfish BMC: no IPMI event log")
        return self._call("POST", "/lab/sel", {"system": name, "sensor_type": sensor_type, "offset": offset,
                                               "sensor": sensor, "deasserted": deasserted})["id"]

    def clear_fault(self, name: str) -> None:
        self._system(name)
        self._call("DELETE", f"/lab/faults/{urllib.parse.quote(name)}")

    def faults(self) -> dict:
        return self._call("GET", "/lab/faults")

    # observation

    def state(self, name: str | None = None) -> dict:
        """Power state, pending change, boot override, virtual media and fault, per system."""
        systems = self._call("GET", "/lab/systems")
        return systems[name] if name else systems

    def events(self, since: int = 0) -> list[dict]:
        """Power landings with seq > since, oldest first (the same documents notify_url gets)."""
        return self._call("GET", f"/lab/events?since={int(since)}")

    def wait_event(self, name: str | None = None, power_state: str | None = None,
                   since: int = 0, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events(since):
                if name in (None, event["system"]) and power_state in (None, event["power_state"]):
                    return event
            if time.monotonic() > deadline:
                raise LabError(f"no power event {name or ''} {power_state or ''} within {timeout}s")
            time.sleep(0.05)

    # helpers

    def _system(self, name: str) -> dict:
        try:
            return self._systems[name]
        except KeyError:
            raise LabError(f"no lab system named {name!r}") from None

    def _call(self, method: str, path: str, body: dict | None = None):
        if not self.running:
            raise LabError("the Redfish lab is not running")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raise LabError(f"{method} {path}: {exc.code} {exc.read().decode(errors='replace')}") from None
        return json.loads(text) if text else None


def _self_signed(directory: str) -> list[str]:
    """A self-signed certificate for 127.0.0.1 (made once per lab): [cert file, key file]."""
    cert, key = os.path.join(directory, "bmc-cert.pem"), os.path.join(directory, "bmc-key.pem")
    if not os.path.exists(cert):
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        private = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lab-bmc")])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                       .public_key(private.public_key()).serial_number(x509.random_serial_number())
                       .not_valid_before(now - datetime.timedelta(days=1))
                       .not_valid_after(now + datetime.timedelta(days=365))
                       .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                      critical=False)
                       .sign(private, hashes.SHA256()))
        with open(key, "wb") as f:
            f.write(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
        with open(cert, "wb") as f:
            f.write(certificate.public_bytes(serialization.Encoding.PEM))
    return [cert, key]


def _delay_range(value) -> tuple[float, float]:
    if isinstance(value, (int, float)):
        value = (value, value)
    lo, hi = (float(v) for v in value)
    if lo < 0 or hi < lo:
        raise ValueError(f"bad power delay range {value!r}")
    return lo, hi


def _fault_spec(fault) -> dict:
    spec = {"kind": fault} if isinstance(fault, str) else dict(fault)
    if spec.get("kind") not in FAULT_KINDS:
        raise ValueError(f"unknown fault {spec.get('kind')!r}; expected one of {', '.join(FAULT_KINDS)}")
    return {"kind": spec["kind"], "seconds": spec.get("seconds"), "requests": spec.get("requests"),
            "delay": spec.get("delay")}


def _terminate(proc: subprocess.Popen, directory: str) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The subprocess: `python -m lab.redfish serve --config FILE`.


class _Site:
    """Everything the emulator process shares between its servers, the ticker and the driver."""

    def __init__(self, config, app, inner):
        self.lock = threading.RLock()
        self.app, self.inner = app, inner  # inner: sushy-tools' Flask app without its own auth
        self.host = config["SUSHY_EMULATOR_LISTEN_IP"]
        self.global_auth = config["SUSHY_EMULATOR_AUTH_FILE"]
        self.systems = config["LAB_SYSTEMS"]
        self.by_name = {s["name"]: u for u, s in self.systems.items()}
        self.power_delay = tuple(config["LAB_POWER_DELAY"])
        self.notify_url = config.get("LAB_NOTIFY_URL")
        self.workdir = os.path.dirname(config["LAB_READY_FILE"])
        self.faults: dict[str, dict] = {}
        self.pending: dict[str, float] = {}
        # Every power request each system got, in order ("On", "ForceOff", "ForceRestart", ...): what a test counts
        # to show that no change was sent twice (a repeated power-on of a server already on lands as nothing).
        self.power_requests: dict[str, list[str]] = {}
        self.events: list[dict] = []
        self.seq = 0
        self.servers: dict[str, object] = {}
        self.ports: dict[str, int] = {}
        self.auth_ok: set = set()
        self.notices: queue.Queue = queue.Queue()
        self.driver = None
        self.ipmi = None  # lab/ipmi.py's servers, when a system has an IPMI BMC
        self.tasks: dict[str, dict] = {}  # SimpleUpdate's tasks, by id

    def resolve(self, identity: str | None) -> str | None:
        if identity in self.systems:
            return identity
        return self.by_name.get(identity)

    # power

    def delay_for(self, uuid: str) -> float:
        fault = self.active_fault(uuid, consume=False)
        if fault and fault["kind"] == "slow-power":
            return fault["delay"] or SLOW_POWER_DELAY_S
        lo, hi = self.systems[uuid]["power_delay"] or self.power_delay
        return random.uniform(lo, hi)

    def emit(self, event: dict) -> None:
        with self.lock:
            self.seq += 1
            event["seq"] = self.seq
            self.events.append(event)
            del self.events[:-10000]
        LOG.info("power %s %s (boot %s)", event["system"], event["power_state"], event["boot_target"])
        if self.ipmi is not None and event.get("uuid") in self.ipmi.bmcs:
            # An IPMI BMC logs its power unit's changes in its SEL (sensor type 0x09, "Power off" asserted, or
            # deasserted: on), as real ones do.
            self.ipmi.add_sel(event["uuid"], sensor_type=0x09, offset=0, deasserted=event["power_state"] == "On")
        if self.notify_url:
            self.notices.put(event)

    def notifier(self) -> None:
        while True:
            event = self.notices.get()
            request = urllib.request.Request(self.notify_url, data=json.dumps(event).encode(),
                                             method="POST", headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(request, timeout=5).close()
            except Exception as exc:  # the lab goes on; the receiver can read /lab/events
                LOG.warning("power notice to %s failed: %s", self.notify_url, exc)

    def ticker(self, parent_pid: int | None) -> None:
        while True:
            time.sleep(0.05)
            if parent_pid and os.getppid() != parent_pid:  # the lab's owner died without stopping us
                if os.path.basename(self.workdir).startswith("vmetal-redfish-"):
                    shutil.rmtree(self.workdir, ignore_errors=True)
                os._exit(0)
            try:
                self.tick(time.time())
            except Exception:  # keep ticking: one bad tick must not freeze every BMC's power
                LOG.exception("lab ticker")

    def tick(self, now: float) -> None:
        with self.lock:
            faults = list(self.faults.items())
        for uuid, fault in faults:
            if fault.get("until") and now >= fault["until"]:
                self.clear_fault(uuid)
        with self.lock:
            for uuid in [u for u, at in self.pending.items() if at <= now]:
                self.driver._get(uuid)  # applies the change and emits the event

    # faults

    def set_fault(self, uuid: str, kind: str, seconds=None, requests=None, delay=None) -> dict:
        fault = {"kind": kind, "until": time.time() + float(seconds) if seconds else None,
                 "requests": int(requests) if requests is not None else None,
                 "delay": float(delay) if delay is not None else
                 (SLOW_POWER_DELAY_S if kind == "slow-power" else None)}
        with self.lock:
            old = self.faults.get(uuid)
            self.faults[uuid] = fault
        if self.systems[uuid].get("ipmi"):  # its UDP port drops packets while down (lab/ipmi.py)
            return fault
        if kind == "bmc-down":
            self.close_port(uuid)
        elif old and old["kind"] == "bmc-down":
            self.open_port(uuid)
        return fault

    def clear_fault(self, uuid: str) -> None:
        with self.lock:
            old = self.faults.pop(uuid, None)
        if old and old["kind"] == "bmc-down" and not self.systems[uuid].get("ipmi"):
            self.open_port(uuid)

    def active_fault(self, uuid: str, consume: bool = True) -> dict | None:
        with self.lock:
            fault = self.faults.get(uuid)
            if fault is None:
                return None
            expired = fault["until"] and time.time() >= fault["until"]
            if not expired and fault["requests"] is not None and consume:
                fault["requests"] -= 1
                expired = fault["requests"] < 0
            if not expired:
                return dict(fault)
        self.clear_fault(uuid)
        return None

    def wait_cleared(self, uuid: str, limit: float = 600) -> None:
        deadline = time.time() + limit
        while time.time() < deadline:
            fault = self.active_fault(uuid, consume=False)
            if not fault or fault["kind"] != "bmc-hang":
                return
            time.sleep(0.1)

    # ports

    def open_port(self, uuid: str | None, port: int | None = None) -> int:
        from werkzeug.serving import make_server

        port = port if port is not None else self.ports.get(uuid, 0)
        tls = self.systems[uuid].get("tls") if uuid else None
        server = make_server(self.host, port, _LabApp(self, uuid), threaded=True,
                             ssl_context=tuple(tls) if tls else None)
        threading.Thread(target=server.serve_forever, name=f"bmc-{uuid}", daemon=True).start()
        with self.lock:
            self.servers[uuid] = server
            self.ports[uuid] = server.server_port
        return server.server_port

    def close_port(self, uuid: str) -> None:
        with self.lock:
            server = self.servers.pop(uuid, None)
        if server is not None:
            server.shutdown()
            server.server_close()

    # credentials

    def authorize(self, environ, files: list[str]):
        """None when the request's Basic credentials match one of the htpasswd files, else the
        error response sushy-tools would give (401 with WWW-Authenticate, 400 if malformed)."""
        from sushy_tools import error
        from sushy_tools.emulator import auth_basic

        try:
            username, password = auth_basic.parse_token(auth_basic.parse_header(environ))
            key = (tuple(files), username, hashlib.sha256(password).hexdigest())
            if key in self.auth_ok:
                return None
            for path in files:
                try:
                    auth_basic.authenticate(path, username, password)
                except error.Unauthorized:
                    continue
                self.auth_ok.add(key)
                return None
            auth_basic.unauthorized()
        except error.FishyError as exc:
            headers = list(getattr(exc, "headers", {}).items())
            return functools.partial(_json_response, exc.code, _redfish_error(str(exc)), headers)

    # the control API

    def control(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        try:
            if path == "/lab/ping":
                return _json_response(200, {"ok": True}, [], environ, start_response)
            if path == "/lab/systems" and method == "GET":
                return _json_response(200, self.snapshot(), [], environ, start_response)
            if path == "/lab/events" and method == "GET":
                query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""))
                since = int(query.get("since", ["0"])[0])
                with self.lock:
                    events = [e for e in self.events if e["seq"] > since]
                return _json_response(200, events, [], environ, start_response)
            if path == "/lab/faults" and method == "GET":
                with self.lock:
                    faults = {self.systems[u]["name"]: dict(f) for u, f in self.faults.items()}
                return _json_response(200, faults, [], environ, start_response)
            if path == "/lab/faults" and method == "POST":
                body = json.loads(_read_body(environ) or b"{}")
                uuid = self.resolve(body.get("system"))
                if uuid is None:
                    return _json_response(404, {"error": f"no system {body.get('system')!r}"}, [],
                                          environ, start_response)
                spec = _fault_spec(body)
                fault = self.set_fault(uuid, spec["kind"], spec["seconds"], spec["requests"],
                                       spec["delay"])
                return _json_response(200, fault, [], environ, start_response)
            if path == "/lab/power" and method == "POST":
                body = json.loads(_read_body(environ) or b"{}")
                uuid = self.resolve(body.get("system"))
                if uuid is None:
                    return _json_response(404, {"error": f"no system {body.get('system')!r}"}, [],
                                          environ, start_response)
                if body.get("power_state") not in ("On", "Off"):
                    raise ValueError("power_state must be On or Off")
                event = self.driver.power_changed_by_machine(uuid, body["power_state"],
                                                             str(body.get("cause") or "machine"))
                return _json_response(200, event or {}, [], environ, start_response)
            if path == "/lab/sel" and method == "POST":
                body = json.loads(_read_body(environ) or b"{}")
                uuid = self.resolve(body.get("system"))
                if uuid is None or self.ipmi is None or uuid not in self.ipmi.bmcs:
                    return _json_response(404, {"error": f"no IPMI system {body.get('system')!r}"}, [],
                                          environ, start_response)
                record = self.ipmi.add_sel(uuid, sensor_type=int(body["sensor_type"]),
                                           offset=int(body.get("offset") or 0), sensor=int(body.get("sensor") or 1),
                                           deasserted=bool(body.get("deasserted")))
                return _json_response(200, {"id": record}, [], environ, start_response)
            if path.startswith("/lab/faults/") and method == "DELETE":
                uuid = self.resolve(urllib.parse.unquote(path.rsplit("/", 1)[1]))
                if uuid is None:
                    return _json_response(404, {"error": "no such system"}, [], environ, start_response)
                self.clear_fault(uuid)
                return _json_response(204, None, [], environ, start_response)
        except (ValueError, KeyError, TypeError) as exc:
            return _json_response(400, {"error": str(exc)}, [], environ, start_response)
        return _json_response(404, {"error": f"no control endpoint {method} {path}"}, [], environ,
                              start_response)

    def snapshot(self) -> dict:
        result = {}
        with self.lock:
            for uuid, spec in self.systems.items():
                system = self.driver._get(uuid)
                result[spec["name"]] = {
                    "uuid": uuid, "port": self.ports.get(uuid),
                    "power_state": system["power_state"],
                    "pending_power": system.get("pending_power"),
                    "power_requests": list(self.power_requests.get(uuid, ())),
                    "boot_target": system.get("boot_device", "Hdd"),
                    "boot_enabled": system.get("boot_enabled", "Continuous"),
                    "virtual_media": self.virtual_media(uuid),
                    "fault": dict(self.faults[uuid]) if uuid in self.faults else None,
                    "macs": [nic["mac"] for nic in system.get("nics", ())],
                    "bios": self.driver.get_bios(uuid), "bios_pending": dict(system.get("bios_pending") or {}),
                    "firmware": self.driver.get_firmware(uuid),
                }
        return result

    def virtual_media(self, uuid: str) -> dict | None:
        try:
            info = self.app.vmedia.get_device_image_info(uuid, "Cd")
            local = self.app.vmedia._get_device(uuid, "Cd").get("_local_file") if info.inserted else None
        except Exception:
            return None
        # file: the BMC's downloaded copy of the image (sushy-tools fetches it on insert), which the server boots
        return {"image": info.image_url or None, "inserted": bool(info.inserted), "file": local or None}


class _LabApp:
    """The WSGI app of one port: faults, credentials and boot-once semantics around sushy-tools.
    own: the system this port is the BMC of; None for the shared port."""

    def __init__(self, site: _Site, own: str | None):
        self.site, self.own = site, own

    def __call__(self, environ, start_response):
        site = self.site
        path = environ.get("PATH_INFO") or "/"
        if self.own is None and path.startswith("/lab/"):
            return site.control(environ, start_response)
        match = SYSTEM_PATH.match(path)
        named = urllib.parse.unquote(match.group(1)) if match else None
        target = site.resolve(named) if named else None
        if self.own and named and target != self.own:
            return _json_response(404, _redfish_error(f"System {named} not found"), [],
                                  environ, start_response)
        faulty = self.own or target
        fault = site.active_fault(faulty) if faulty else None
        if fault and fault["kind"] == "bmc-500":
            return _json_response(500, _redfish_error("Injected lab fault: bmc-500", "InternalError"),
                                  [], environ, start_response)
        if fault and fault["kind"] == "bmc-hang":
            site.wait_cleared(faulty)
            return _drop(environ, start_response)
        if fault and fault["kind"] == "bmc-down":
            return _drop(environ, start_response)

        if path.strip("/") not in ("", "redfish", "redfish/v1"):  # the service root is public
            if self.own:
                files = [site.systems[self.own]["auth_file"]]
            elif target:
                files = [site.systems[target]["auth_file"]]
            else:  # collections and managers on the shared port: any of the lab's credentials
                files = [site.global_auth] + sorted({s["auth_file"] for s in site.systems.values()}
                                                    - {site.global_auth})
            denied = site.authorize(environ, files)
            if denied:
                return denied(environ, start_response)

        method = environ.get("REQUEST_METHOD", "GET")
        is_system = target and match.group(0) == path.rstrip("/")
        if is_system and method == "PATCH":
            return self.patch_system(target, environ, start_response)
        if is_system and method == "GET":
            return self.rewrite(environ, start_response, functools.partial(self.show_enabled, target))
        if self.own and method == "GET" and path.rstrip("/") == "/redfish/v1/Systems":
            return self.rewrite(environ, start_response, self.only_own)
        if target and method == "GET" and BIOS_PATH.match(path):
            return self.rewrite(environ, start_response, functools.partial(self.bios_pending, target))
        if method == "GET" and path.rstrip("/").startswith(INVENTORY):
            return self.inventory(path.rstrip("/"), environ, start_response)
        if method == "POST" and path.rstrip("/") == SIMPLE_UPDATE:
            return self.simple_update(environ, start_response)
        if method == "GET" and path.startswith(TASKS + "/"):
            return self.task(path.rstrip("/").rsplit("/", 1)[-1], environ, start_response)
        drive = DRIVE_PATH.match(path) if target and method == "GET" else None
        if drive:
            return self.rewrite(environ, start_response,
                                functools.partial(self.drive, target, urllib.parse.unquote(drive.group(1))))
        if target and method == "GET" and NIC_PATH.match(path):
            return self.rewrite(environ, start_response, functools.partial(self.nic, target))
        processor = PROCESSOR_PATH.match(path) if target and method == "GET" else None
        if processor:
            return self.rewrite(environ, start_response,
                                functools.partial(self.processor, target, path.rstrip("/"),
                                                  urllib.parse.unquote(processor.group(1))))
        return site.inner(environ, start_response)

    def nic(self, uuid, doc):
        """sushy-tools' interface has no speed: the lab server's NIC speed, where the lab gives one."""
        speed = (self.site.systems[uuid].get("inventory") or {}).get("nic_speed_gbps")
        if speed:
            doc["SpeedMbps"] = int(speed * 1000)
        return doc

    def processor(self, uuid, path, processor_id, doc):
        """sushy-tools' processor template says every processor is a CPU and leaves its path out: a GPU is a GPU."""
        doc["@odata.id"] = path
        gpus = (self.site.systems[uuid].get("inventory") or {}).get("gpus") or []
        if processor_id.startswith("GPU"):
            gpu = gpus[int(processor_id[3:])]
            doc.update(ProcessorType="GPU", ProcessorArchitecture="OEM", InstructionSet="OEM",
                       Manufacturer=gpu.get("manufacturer") or "", Model=gpu.get("model") or "")
            for key in ("TotalCores", "TotalThreads"):
                doc.pop(key, None)
        return doc

    def patch_system(self, uuid, environ, start_response):
        """sushy-tools ignores BootSourceOverrideEnabled; remember it so "Once" is consumed by
        the next power-on."""
        body = _read_body(environ)
        try:
            boot = json.loads(body or b"{}").get("Boot") or {}
        except (ValueError, AttributeError):
            boot = {}
        enabled = boot.get("BootSourceOverrideEnabled") if isinstance(boot, dict) else None
        if enabled is not None and enabled not in BOOT_ENABLED:
            return _json_response(400, _redfish_error(f"Invalid BootSourceOverrideEnabled {enabled!r}"),
                                  [], environ, start_response)
        if enabled and set(boot) == {"BootSourceOverrideEnabled"} and b"IndicatorLED" not in body:
            self.site.driver.set_boot_enabled(uuid, enabled)
            return _json_response(204, None, [], environ, start_response)
        status, headers, out = _capture(self.site.inner, environ)
        if enabled and status.startswith("2"):
            self.site.driver.set_boot_enabled(uuid, enabled)
        start_response(status, headers)
        return [out]

    def show_enabled(self, uuid, doc):
        if isinstance(doc.get("Boot"), dict):
            doc["Boot"]["BootSourceOverrideEnabled"] = self.site.driver.boot_enabled(uuid)
        return doc

    def drive(self, uuid, drive_id, doc):
        """sushy-tools' drive template has one fixed serial and model for every drive: the lab's own."""
        facts = self.site.systems[uuid].get("drives", {}).get(drive_id)
        if facts:
            doc.update(SerialNumber=facts["serial"], Model=facts.get("model") or "",
                       Manufacturer=facts.get("manufacturer") or "", MediaType=facts.get("media_type") or "SSD",
                       CapacityBytes=int(facts["size_bytes"]))
            for key in ("RotationSpeedRPM", "HotspareType", "PartNumber"):
                doc.pop(key, None)
        return doc

    def bios_pending(self, uuid, doc):
        """sushy-tools shows the attributes in force as the pending ones too: the lab's pending changes on top."""
        pending = self.site.driver._get(uuid).get("bios_pending") or {}
        doc["Attributes"] = {**doc.get("Attributes", {}), **pending}
        return doc

    # firmware: the inventory, SimpleUpdate and its tasks (sushy-tools has neither inventory nor tasks)

    def _components(self) -> list[tuple[str, str, str]]:
        """(system uuid, component id, inventory id) for every component this port's BMC lists: its own server's;
        on the shared port every server's, named SYSTEM.ID."""
        systems = [self.own] if self.own else list(self.site.systems)
        return [(uuid, fid, fid if self.own else f"{self.site.systems[uuid]['name']}.{fid}")
                for uuid in systems for fid in self.site.driver.get_firmware(uuid)]

    def _component_doc(self, uuid: str, fid: str, item: str) -> dict:
        kind, _, number = fid.partition(".")
        names = {"BIOS": "BIOS", "BMC": "BMC Firmware", "NIC": f"NIC {number} Firmware", "GPU": f"GPU {number} VBIOS"}
        return {"@odata.id": f"{INVENTORY}/{item}", "@odata.type": "#SoftwareInventory.v1_2_0.SoftwareInventory",
                "Id": item, "Name": names.get(kind, fid), "Version": self.site.driver.get_firmware(uuid)[fid],
                "Updateable": True, "Status": {"State": "Enabled", "Health": "OK"},
                "RelatedItem": [{"@odata.id": f"/redfish/v1/Systems/{uuid}"}]}

    def inventory(self, path, environ, start_response):
        components = self._components()
        if path == INVENTORY:
            members = [{"@odata.id": f"{INVENTORY}/{item}"} for _, _, item in components]
            return _json_response(200, {"@odata.id": INVENTORY, "@odata.type":
                                        "#SoftwareInventoryCollection.SoftwareInventoryCollection",
                                        "Name": "Firmware Inventory", "Members": members,
                                        "Members@odata.count": len(members)}, [], environ, start_response)
        wanted = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        for uuid, fid, item in components:
            if item == wanted:
                return _json_response(200, self._component_doc(uuid, fid, item), [], environ, start_response)
        return _json_response(404, _redfish_error(f"No firmware component {wanted}", "ResourceMissingAtURI"), [],
                              environ, start_response)

    def simple_update(self, environ, start_response):
        """UpdateService.SimpleUpdate of one inventory item: a task that ends as the server's spec says."""
        try:
            body = json.loads(_read_body(environ) or b"{}")
        except ValueError:
            body = None
        image = body.get("ImageURI") if isinstance(body, dict) else None
        targets = body.get("Targets") if isinstance(body, dict) else None
        if not isinstance(image, str) or not image or not isinstance(targets, list) or len(targets) != 1:
            return _json_response(400, _redfish_error("ImageURI and one Target are required", "PropertyMissing"),
                                  [], environ, start_response)
        wanted = str(targets[0]).rstrip("/").rsplit("/", 1)[-1]
        found = next(((uuid, fid) for uuid, fid, item in self._components() if item == wanted), None)
        if found is None:
            return _json_response(400, _redfish_error(f"Target {targets[0]} is not in the firmware inventory",
                                                      "PropertyValueNotInList"), [], environ, start_response)
        uuid, fid = found
        spec = self.site.systems[uuid]
        match = re.search(r"[-_]v?(\d[\w.]*?)(?:\.(?:bin|img|exe|fwpkg|hpm|zip|iso))?$",
                          urllib.parse.urlsplit(image).path)
        with self.site.lock:
            task_id = str(len(self.site.tasks) + 1)
            self.site.tasks[task_id] = {
                "id": task_id, "uuid": uuid, "component": fid, "image": image, "started": time.time(),
                "until": time.time() + float(spec.get("update_s", 1.0)), "fails": spec.get("update_fails") or "",
                "version": match.group(1) if match else None, "done": False}
        doc = self.task_doc(task_id)
        return _json_response(202, doc, [("Location", doc["@odata.id"])], environ, start_response)

    def task_doc(self, task_id: str) -> dict | None:
        site = self.site
        with site.lock:
            task = site.tasks.get(task_id)
            if task is None:
                return None
            if not task["done"] and time.time() >= task["until"]:
                task["done"] = True
                if not task["fails"]:
                    current = site.driver.get_firmware(task["uuid"])[task["component"]]
                    task["version"] = task["version"] or _bumped(current)
                    site.driver.set_firmware(task["uuid"], task["component"], task["version"])
            task = dict(task)
        if not task["done"]:
            state, status, message, percent = "Running", "OK", f"Updating {task['component']} from {task['image']}", 50
        elif task["fails"]:
            state, status, message, percent = "Exception", "Critical", task["fails"], 100
        else:
            state, status, percent = "Completed", "OK", 100
            message = f"{task['component']} updated to {task['version']}; it takes effect at the next reboot"
        return {"@odata.id": f"{TASKS}/{task_id}", "@odata.type": "#Task.v1_4_3.Task", "Id": task_id,
                "Name": f"Firmware update of {task['component']}", "TaskState": state, "TaskStatus": status,
                "PercentComplete": percent,
                "Messages": [{"MessageId": "Update.1.0.UpdateInProgress" if state == "Running" else
                              ("Update.1.0.ApplyFailed" if state == "Exception" else "Update.1.0.UpdateSuccessful"),
                              "Message": message, "Severity": status}]}

    def task(self, task_id, environ, start_response):
        doc = self.task_doc(task_id)
        if doc is None:
            return _json_response(404, _redfish_error(f"No task {task_id}", "ResourceMissingAtURI"), [],
                                  environ, start_response)
        return _json_response(200, doc, [], environ, start_response)

    def only_own(self, doc):
        """A real BMC lists only its own system."""
        members = [m for m in doc.get("Members", [])
                   if self.site.resolve(m.get("@odata.id", "").rstrip("/").rsplit("/", 1)[-1]) == self.own]
        doc["Members"], doc["Members@odata.count"] = members, len(members)
        return doc

    def rewrite(self, environ, start_response, change):
        status, headers, out = _capture(self.site.inner, environ)
        if status.startswith("200"):
            try:
                out = json.dumps(change(json.loads(out)), indent=4).encode()
            except ValueError:
                pass
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Content-Length", str(len(out))))
        start_response(status, headers)
        return [out]


def _bumped(version: str) -> str:
    """The next version when an image's name carries none: the last number one higher (2.3.1 → 2.3.2)."""
    parts = version.split(".")
    return ".".join(parts[:-1] + [str(int(parts[-1]) + 1)]) if parts[-1].isdigit() else version + ".1"


def _redfish_error(message: str, code: str = "GeneralError") -> dict:
    return {"error": {"code": f"Base.1.0.{code}", "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": f"Base.1.0.{code}", "Message": message,
                                                 "Severity": "Critical"}]}}


def _json_response(code, doc, headers, environ, start_response):
    from http import HTTPStatus

    out = b"" if doc is None else json.dumps(doc).encode()
    headers = list(headers) + [("Content-Type", "application/json"), ("Content-Length", str(len(out)))]
    start_response(f"{code} {HTTPStatus(code).phrase}", headers)
    return [out]


def _read_body(environ) -> bytes:
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _capture(app, environ):
    chunks, captured = [], {}

    def start_response(status, headers, exc_info=None):
        captured["status"], captured["headers"] = status, list(headers)
        return chunks.append

    result = app(environ, start_response)
    try:
        chunks.extend(result)
    finally:
        getattr(result, "close", lambda: None)()
    return captured["status"], captured["headers"], b"".join(chunks)


def _drop(environ, start_response):
    """Cut the connection without an answer: the client sees the BMC go away mid-request."""
    sock = environ.get("werkzeug.socket")
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    start_response("503 Service Unavailable", [("Content-Length", "0")])
    return [b""]


def _lab_driver_class(base, site: _Site, error):
    """sushy-tools' FakeDriver with float delays, on-time landings, events and boot-once."""

    def locked(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            with site.lock:  # the driver's state is read-modify-write over sqlite
                return fn(self, *args, **kwargs)
        return wrapper

    class LabFakeDriver(base):
        @locked
        def set_power_state(self, identity, state):
            system = self._get(identity)
            uuid = system["uuid"]
            site.power_requests.setdefault(uuid, []).append(state)
            if "Restart" in state:
                if system["power_state"] != "Off":
                    self._update(system, power_state="Off")
                    site.emit(self.event(system, "reset", request=state))
                target, cause = "On", "reset"
            elif "On" in state:
                target, cause = "On", "power-on"
            elif state in ("ForceOff", "GracefulShutdown"):
                target, cause = "Off", "power-off"
            else:
                raise error.NotSupportedError(f"Power state {state} is not supported")
            if system["power_state"] == target:
                if system.get("pending_power"):  # e.g. off then on again before the off landed
                    self._update(system, pending_power=None)
                site.pending.pop(uuid, None)
                return
            apply_time = time.time() + site.delay_for(uuid)
            self._update(system, pending_power={"power_state": target, "apply_time": apply_time,
                                                "cause": cause, "request": state})
            site.pending[uuid] = apply_time

        @locked
        def _update_if_needed(self, system):
            pending = system.get("pending_power")
            if not pending:
                site.pending.pop(system["uuid"], None)
                return system
            if time.time() < pending["apply_time"]:
                return system
            site.pending.pop(system["uuid"], None)
            state = "On" if "Restart" in pending["power_state"] else pending["power_state"]
            changes = {"power_state": state, "pending_power": None}
            system["power_state"] = state
            event = self.event(system, pending.get("cause") or ("power-on" if state == "On" else "power-off"),
                               request=pending.get("request"))
            if state == "On" and system.get("boot_enabled") == "Once":
                changes.update(boot_device="Hdd", boot_enabled="Disabled")
            if state == "On" and system.get("bios_pending"):
                changes.update(self._bios_applied(system))
            self._update(system, **changes)
            site.emit(event)
            return system

        def event(self, system, cause, request=None):
            return {"system": system["name"], "uuid": system["uuid"],
                    "power_state": system["power_state"], "cause": cause, "request": request,
                    "boot_target": system.get("boot_device", "Hdd"),
                    "boot_once": system.get("boot_enabled") == "Once",
                    "virtual_media": site.virtual_media(system["uuid"]),
                    "macs": [nic["mac"] for nic in system.get("nics", ())], "time": time.time()}

        @locked
        def power_changed_by_machine(self, identity, state, cause):
            """The server changed its own power (a VM guest powered off): no delay, no boot override spent."""
            system = self._get(identity)
            if system["power_state"] == state:
                return None
            self._update(system, power_state=state)
            system["power_state"] = state
            event = self.event(system, cause)
            site.emit(event)
            return event

        def _inventory(self, identity):
            inventory = (site.systems.get(self._get(identity)["uuid"]) or {}).get("inventory")
            if not inventory:
                raise error.NotSupportedError("this BMC lists no processors or memory")
            return inventory

        def get_total_memory(self, identity):
            return self._inventory(identity).get("memory_gib")

        def get_total_cpus(self, identity):
            return self._inventory(identity)["cpu"].get("threads")

        def get_processors(self, identity):
            """CPUs (one per socket) and GPUs, in sushy-tools' processor shape (LabApp.processor makes GPUs GPUs)."""
            inventory = self._inventory(identity)
            cpu, sockets = inventory["cpu"], int(inventory["cpu"].get("sockets") or 1)
            cpus = [{"id": f"CPU{i}", "socket": f"CPU {i}", "vendor": cpu.get("vendor") or "", "model": cpu["model"],
                     "cores": int(cpu["cores"]) // sockets, "threads": int(cpu["threads"]) // sockets}
                    for i in range(sockets)]
            gpus = [{"id": f"GPU{i}", "socket": f"GPU {i}", "vendor": g.get("manufacturer") or "",
                     "model": g.get("model") or "", "cores": "", "threads": ""}
                    for i, g in enumerate(inventory.get("gpus") or ())]
            return cpus + gpus

        def _bios_applied(self, system) -> dict:
            """The pending BIOS changes at power-on: in force, but those this BIOS never keeps."""
            stuck = site.systems[system["uuid"]].get("bios_no_stick") or ()
            kept = {k: v for k, v in system["bios_pending"].items() if "*" not in stuck and k not in stuck}
            current = system.get("bios") or site.systems[system["uuid"]]["bios"]  # not _get: it lands this change
            return {"bios": {**current, **kept}, "bios_pending": None}

        @locked
        def get_bios(self, identity):
            system = self._get(identity)
            return dict(system.get("bios") or site.systems[system["uuid"]]["bios"])

        @locked
        def set_bios(self, identity, attributes):
            if not isinstance(attributes, dict) or not attributes:
                raise error.BadRequest("Attributes must be a non-empty object")
            current = self.get_bios(identity)
            unknown = sorted(set(attributes) - set(current))
            if unknown:
                raise error.BadRequest(f"unknown BIOS attribute(s): {', '.join(unknown)}")
            system = self._get(identity)
            self._update(system, bios_pending={**(system.get("bios_pending") or {}), **attributes})

        @locked
        def reset_bios(self, identity):
            self._update(identity, bios=None, bios_pending=None)

        @locked
        def get_firmware(self, identity):
            system = self._get(identity)
            return dict(system.get("firmware") or site.systems[system["uuid"]]["firmware"])

        @locked
        def set_firmware(self, identity, component, version):
            self._update(identity, firmware={**self.get_firmware(identity), component: version})

        def get_versions(self, identity):
            return {"BiosVersion": self.get_firmware(identity).get("BIOS")}

        @locked
        def set_boot_enabled(self, identity, enabled):
            self._update(identity, boot_enabled=enabled)

        @locked
        def boot_enabled(self, identity):
            return self._get(identity).get("boot_enabled", "Continuous")

    for name in ("uuid", "name", "get_power_state", "get_boot_device", "set_boot_device",
                 "get_boot_mode", "set_boot_mode", "get_secure_boot", "set_secure_boot",
                 "get_boot_image", "set_boot_image", "get_nics"):
        setattr(LabFakeDriver, name, locked(getattr(base, name)))
    return LabFakeDriver


def _download_from_guest_urls(app) -> None:
    """The console names its boot ISO by the address its servers use (AGENT_BOOT_URL). In a lab with VMs
    that is the host as QEMU's guests see it (10.0.2.2); the BMC runs on the host, so it downloads from
    127.0.0.1 instead, as a BMC on another network than the servers would have its own route."""
    from sushy_tools.emulator.resources import vmedia

    original = vmedia.BaseDriver._get_image
    if getattr(original, "lab_guest_urls", False):
        return

    def _get_image(self, image_url, *args, **kwargs):
        parts = urllib.parse.urlsplit(image_url)
        if parts.hostname == GUEST_HOST:
            image_url = parts._replace(netloc=parts.netloc.replace(GUEST_HOST, "127.0.0.1", 1)).geturl()
        return original(self, image_url, *args, **kwargs)

    _get_image.lab_guest_urls = True
    vmedia.BaseDriver._get_image = _get_image


def serve(config_path: str, parent_pid: int | None = None) -> None:
    from sushy_tools import error
    from sushy_tools.emulator import main as emulator
    from sushy_tools.emulator.resources.systems import fakedriver

    app = emulator.app
    app.configure(config_file=config_path)
    config = app.config
    inner = app.wsgi_app
    if isinstance(inner, emulator.RedfishAuthMiddleware):
        inner = inner.app  # _LabApp checks credentials per BMC, with sushy-tools' own helpers
    site = _Site(config, app, inner)
    # main.py looks the driver class up on the module when it first builds app.systems.
    fakedriver.FakeDriver = _lab_driver_class(fakedriver.FakeDriver, site, error)
    site.driver = app.systems
    _download_from_guest_urls(app)

    for uuid, spec in site.systems.items():
        if spec.get("ipmi"):
            from lab.ipmi import IpmiServers

            site.ipmi = site.ipmi or IpmiServers(site)
            site.ports[uuid] = site.ipmi.start(uuid, spec, site.host)
        else:
            site.open_port(uuid, spec.get("port") or None)
        if spec.get("fault"):
            f = spec["fault"]
            site.set_fault(uuid, f["kind"], f.get("seconds"), f.get("requests"), f.get("delay"))
    shared = site.open_port(None, int(config.get("SUSHY_EMULATOR_LISTEN_PORT") or 0))
    threading.Thread(target=site.ticker, args=(parent_pid,), daemon=True).start()
    if site.notify_url:
        threading.Thread(target=site.notifier, daemon=True).start()

    ready = {"pid": os.getpid(), "port": shared,
             "ports": {s["name"]: site.ports[u] for u, s in site.systems.items()}}
    path = config["LAB_READY_FILE"]
    with open(path + ".tmp", "w") as f:
        json.dump(ready, f)
    os.replace(path + ".tmp", path)
    LOG.warning("Redfish lab ready on %s: %s", shared, ready["ports"])

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.redfish")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="run the emulator with the lab's additions")
    run.add_argument("--config", required=True)
    run.add_argument("--parent-pid", type=int, help="exit when this process is gone (RedfishLab sets it)")
    run.add_argument("--log-level", default=os.environ.get("LAB_LOG_LEVEL", "WARNING"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    serve(args.config, args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
