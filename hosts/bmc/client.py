"""The console's one door to BMCs: Redfish through sushy, with timeouts, retries and plain errors."""
# The console's one door to BMCs: Redfish through sushy, with timeouts, retries and plain errors (IPMI: hosts/bmc/
# ipmi.py, the same interface and error kinds; hosts/bmc/factory.py picks the client by the address's scheme).
#
# It takes plain arguments and imports no Django models, so Celery tasks call it outside any
# transaction. Every HTTP call has a timeout; transient failures (connection errors, timeouts, 5xx)
# are retried with exponential back-off; a 401 never is. A BMCError says whether it may heal by itself
# (`transient`): a step retries those until its deadline and fails at once on the rest. A BMC object is not thread-safe: one task
# uses it at a time.
#
#     bmc = BMC("redfish+http://127.0.0.1:8001/redfish/v1/Systems/gpu-01", "admin", "secret")
#     bmc.set_boot_once("pxe"); bmc.power_on(); bmc.wait_power("on", deadline_s=60)
#
# `BMC.kept(...)` is the same, kept in the process between uses (a worker drives a host every few
# seconds while its power changes): the service root and the system's path are read once, not on
# every drive; `close()` gives it back, with its HTTP connections closed (an idle console must not hold
# a BMC's few connection slots). Any failure discards it, so the next use reads everything anew.
from __future__ import annotations

import errno
import http.client
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from urllib.parse import urlsplit

import requests
import sushy
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_exc

from . import vendors

LOG = logging.getLogger(__name__)

KINDS = ("auth", "unreachable", "timeout", "not_found", "server_error", "unsupported", "mismatch", "tls")
# The kinds that may heal by themselves (the BMC rebooting, busy or away): worth asking again. Wrong credentials,
# a missing system, a boot MAC the system lacks, an address the console cannot use and a TLS failure never do.
TRANSIENT_KINDS = frozenset({"unreachable", "timeout", "server_error"})

# scheme → (transport, virtual media boot). The URL path is the Redfish system (Metal3's rule). Vendors' schemes
# (idrac-*, ilo5-*) and their quirks: hosts/bmc/vendors.py. ipmi://HOST[:PORT] is driven by hosts/bmc/ipmi.py (the
# factory picks the client by scheme).
SCHEMES = {**vendors.redfish_schemes(), "ipmi": ("ipmi", False)}
SCHEME_LIST = ", ".join(s + "://" for s in SCHEMES)


def is_ipmi(address: str | None) -> bool:
    """An ipmi:// address: what only Redfish does (virtual media, secure boot, BIOS, firmware, out-of-band
    inventory) is refused for it."""
    return (address or "").strip().lower().startswith("ipmi://")
BOOT_TARGETS = {"pxe": sushy.BootSource.PXE, "disk": sushy.BootSource.HDD, "cd": sushy.BootSource.CD}
POWER_STATES = {sushy.PowerState.ON: "on", sushy.PowerState.OFF: "off"}
CD_MEDIA = {sushy.VirtualMediaType.CD, sushy.VirtualMediaType.DVD}
TRANSIENT_STATUS = {500, 502, 503, 504}
IPMI_PORT = 623  # RMCP's own
KEEP_IDLE_S = 120  # a kept BMC unused this long is read anew (replaced board, new firmware)
KEEP_MAX = 2000  # kept BMCs per process; the least recently used go first
_kept: "OrderedDict[tuple, BMC]" = OrderedDict()
_kept_lock = threading.Lock()


class BMCError(Exception):
    """A BMC operation failed; `kind` says how (one of KINDS), the message says it for people."""

    def __init__(self, kind: str, message: str):
        if kind not in KINDS:
            raise ValueError(f"unknown BMCError kind {kind!r}")
        super().__init__(message)
        self.kind, self.message = kind, message

    def __str__(self) -> str:
        return self.message

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT_KINDS

    def __reduce__(self):  # picklable with both arguments (Celery results, multiprocessing)
        return (type(self), (self.kind, self.message))


def parse_address(address: str) -> tuple[str, str, str]:
    """'redfish+http://127.0.0.1:8001/redfish/v1/Systems/x' → ('redfish+http',
    'http://127.0.0.1:8001', '/redfish/v1/Systems/x'). The path is '' when the address names no
    system (no path, /redfish/v1 or the Systems collection): the system is then found by MAC.

    The one check of a BMC address (BareMetalHost.clean calls it, so apply, the API and the admin refuse
    alike): BMCError("unsupported") for an address the console cannot drive."""
    address = (address or "").strip()
    parts = urlsplit(address)
    scheme = parts.scheme.lower()
    if address and "://" not in address:  # Metal3 reads it as IPMI; the console asks for the scheme written out
        raise BMCError("unsupported", f"BMC address {address!r} has no scheme: write ipmi://{address} for an IPMI BMC, "
                                      f"or use one of {SCHEME_LIST}")
    if scheme not in SCHEMES:
        raise BMCError("unsupported", f"BMC address scheme {scheme + '://' if scheme else '(none)'} is not "
                                      f"supported: use one of {SCHEME_LIST}")
    if not parts.hostname:
        raise BMCError("unsupported", f"BMC address {address!r} has no host")
    if scheme == "ipmi":
        ipmi_host, port = parse_ipmi_address(address)
        return scheme, f"ipmi://[{ipmi_host}]:{port}" if ":" in ipmi_host else f"ipmi://{ipmi_host}:{port}", ""
    host = parts.netloc.rsplit("@", 1)[-1]  # never carry credentials in the URL
    path = parts.path.rstrip("/")
    if path in ("", "/redfish/v1", "/redfish/v1/Systems"):
        path = ""
    return scheme, f"{SCHEMES[scheme][0]}://{host}", path


def parse_ipmi_address(address: str) -> tuple[str, int]:
    """'ipmi://10.0.0.5:6230' → ('10.0.0.5', 6230); port 623 by default. BMCError("unsupported") for a path, a
    query or credentials in the address (Metal3's ipmi:// names a host and port only)."""
    parts = urlsplit((address or "").strip())
    if "@" in parts.netloc:
        raise BMCError("unsupported", "an ipmi:// address carries no credentials: they come from the host's Secret")
    if not parts.hostname:
        raise BMCError("unsupported", f"BMC address {address!r} has no host")
    if parts.path.strip("/") or parts.query:
        raise BMCError("unsupported", f"an ipmi:// address is ipmi://HOST[:PORT], without a path: {address!r}")
    try:
        port = parts.port or IPMI_PORT
    except ValueError:
        raise BMCError("unsupported", f"BMC address {address!r} has a bad port") from None
    return parts.hostname, port


def normalize_mac(mac: str) -> str:
    return mac.strip().lower().replace("-", ":")


class _RetryingConnector(sushy_connector.Connector):
    """sushy's connector with one retry policy: sushy's own (3 tries, 2 s apart, on connection
    errors; 10 tries on GET 5xx) is switched off and this one wraps every request."""

    def __init__(self, url: str, *, verify, timeout: float, retries: int, backoff: float):
        super().__init__(url, verify=verify, server_side_retries=1, server_side_retries_delay=0,
                         default_request_timeout=timeout, connect_timeout=timeout)
        self.retries, self.backoff = retries, backoff
        self._local = threading.local()

    def _op(self, method, path="", data=None, headers=None, blocking=False, timeout=None,
            server_side_retries_left=None, allow_reauth=True, **kwargs):
        call = lambda: super(_RetryingConnector, self)._op(  # noqa: E731
            method, path, data=data, headers=headers, blocking=blocking, timeout=timeout,
            server_side_retries_left=0, allow_reauth=allow_reauth, **kwargs)
        if getattr(self._local, "busy", False):  # sushy re-entering (e.g. a retry it decided itself)
            return call()
        self._local.busy = True
        try:
            for attempt in range(self.retries + 1):
                try:
                    return call()
                except (sushy_exc.ConnectionError, sushy_exc.ServerSideError) as exc:
                    if attempt >= self.retries or not _transient(exc):
                        raise
                    delay = self.backoff * 2 ** attempt
                    LOG.info("BMC %s %s failed (%s); retry %d/%d in %.2fs", method, path,
                             _describe(exc), attempt + 1, self.retries, delay)
                    time.sleep(delay)
        finally:
            self._local.busy = False


def _causes(exc: BaseException) -> list[BaseException]:
    """exc and everything it wraps: requests and urllib3 nest the socket error several deep."""
    seen, todo = [], [exc]
    while todo:
        e = todo.pop(0)
        # Not every `reason` is an exception: ssl.SSLError's is OpenSSL's code (a string).
        if not isinstance(e, BaseException) or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None)]
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
    return seen


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, sushy_exc.HTTPError):
        return exc.status_code in TRANSIENT_STATUS
    return not any(isinstance(e, requests.exceptions.SSLError) for e in _causes(exc))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, sushy_exc.HTTPError):
        return f"HTTP {exc.status_code}"
    return type(exc).__name__


def _tls_reason(causes: list[BaseException]) -> str | None:
    """Why TLS failed, for people; None when it did not. Never healed by asking again."""
    if not any(isinstance(e, (requests.exceptions.SSLError, ssl.SSLError)) for e in causes):
        return None
    for e in causes:
        if isinstance(e, ssl.SSLCertVerificationError):
            return (f"certificate verification failed ({e.verify_message or e.reason}): give the BMC a certificate "
                    "this console trusts, or disable certificate verification for this host")
    for e in causes:
        if isinstance(e, ssl.SSLError) and e.reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE",
                                                        "HTTP_REQUEST", "UNKNOWN_PROTOCOL"):
            return "the BMC does not speak TLS on this port: if it serves plain HTTP, use a redfish+http:// address"
    reason = next((e.reason for e in causes if isinstance(e, ssl.SSLError) and e.reason), None)
    return f"{reason or 'handshake failed'}: check the BMC's certificate and the address's scheme"


def _unreachable_reason(causes: list[BaseException]) -> str:
    for e in causes:
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
    for e in causes:
        if isinstance(e, socket.gaierror) or "NameResolutionError" in type(e).__name__:
            return "host name not resolved"
        if isinstance(e, ConnectionResetError):
            return "connection reset"
        if isinstance(e, (http.client.RemoteDisconnected, ConnectionAbortedError)):
            return "connection closed without a response"
        if isinstance(e, OSError) and e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to host"
    return str(causes[-1]) or type(causes[-1]).__name__


# Told the result of every BMC operation: "ok" or the error's kind. The console counts them for its metrics
# (hosts/apps.py); the client keeps no count of its own.
CALL_OBSERVERS: list = []


def _tell(result: str) -> None:
    for observer in CALL_OBSERVERS:
        observer(result)


class PowerWait:
    """What every BMC client does alike on top of its own power_state(): wait for a state."""

    def wait_power(self, state: str, deadline_s: float, poll_s: float = 0.5) -> None:
        """Poll until the power state is `state` ('on' or 'off'); BMCError(timeout) after deadline_s."""
        if state not in ("on", "off"):
            raise ValueError(f"power state must be 'on' or 'off', not {state!r}")
        end = time.monotonic() + deadline_s
        while self.power_state() != state:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise BMCError("timeout", f"power {state} not reached within {deadline_s:g}s")
            time.sleep(min(poll_s, remaining))


class BMC(PowerWait):
    """One server's BMC. The system comes from the address path, or (when the address names
    none) from `boot_mac` among the BMC's systems."""

    lists_inventory = True  # out-of-band inspection: inventory()

    def __init__(self, address: str, username: str, password: str, verify_tls: bool = True,
                 timeout: float = 10, retries: int = 3, backoff: float = 0.5,
                 boot_mac: str | None = None):
        self.address = address
        self.scheme, self.base_url, self.system_path = parse_address(address)
        self.username, self.password = username, password
        self.verify_tls, self.timeout = verify_tls, timeout
        self.retries, self.backoff = retries, backoff
        self.boot_mac = normalize_mac(boot_mac) if boot_mac else None
        self.vendor = vendors.vendor_of(self.scheme)
        self._root = None
        self._connector = None
        self._resolved: str | None = None  # the system's path once found
        self._system = None  # the System as last read during this use, for actions
        self._keep_key: tuple | None = None
        self._broken = False
        self._idle_since = 0.0

    @classmethod
    def kept(cls, address: str, username: str, password: str, **options) -> "BMC":
        """A BMC kept in this process between uses (see the module's doc); `close()` gives it back.
        Taken out of the keep while in use, so two threads never share one."""
        key = (address, username, password, tuple(sorted(options.items())))
        with _kept_lock:
            bmc = _kept.pop(key, None)
        if bmc is not None and time.monotonic() - bmc._idle_since < KEEP_IDLE_S:
            return bmc
        if bmc is not None:
            bmc._discard()
        bmc = cls(address, username, password, **options)
        bmc._keep_key = key
        return bmc

    @property
    def virtual_media_boot(self) -> bool:
        """The address asks for boot from virtual media (redfish-virtualmedia://) rather than PXE."""
        return SCHEMES[self.scheme][1]

    def close(self) -> None:
        self._system = None
        if self._keep_key is None or self._broken or self._root is None:
            self._discard()
            return
        self._connector.close()  # the HTTP connections only: requests opens new ones on the next use
        self._idle_since = time.monotonic()
        with _kept_lock:
            _kept[self._keep_key] = self
            _kept.move_to_end(self._keep_key)
            evicted = [_kept.popitem(last=False)[1] for _ in range(len(_kept) - KEEP_MAX)]
        for bmc in evicted:
            bmc._discard()

    def _discard(self) -> None:
        if self._connector is not None:
            self._connector.close()
        self._root = self._connector = self._resolved = self._system = None
        self._keep_key = None

    def __enter__(self) -> "BMC":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # finding the system

    def system(self):
        """The sushy System, freshly read (one GET once it has been found)."""
        self._system = self._call(self._find_system)
        return self._system

    def _recent_system(self):
        """The System as read earlier in this use (actions need its links, not a fresh power state)."""
        return self._system if self._system is not None else self.system()

    def check(self, boot_mac: str | None = None) -> dict:
        """Registration's test: the credentials work, the system exists and has the boot MAC."""
        mac = normalize_mac(boot_mac) if boot_mac else self.boot_mac
        if mac and not self.boot_mac:
            self.boot_mac = mac
        system = self.system()
        macs = self._call(lambda: self._macs(system))
        if mac and mac not in macs:
            raise BMCError("mismatch", f"boot MAC {mac} not found on system {system.identity}")
        return {"system_id": system.identity, "system_path": system.path, "name": system.name,
                "uuid": system.uuid, "power_state": POWER_STATES.get(system.power_state, "unknown"),
                "macs": sorted(macs)}

    def quirks(self) -> dict:
        """What this BMC reports it can do, as preflight records it: a virtual CD/DVD drive (virtual media
        boot), a one-time boot override ("Once" among BootSourceOverrideEnabled, or the field at all when the
        BMC lists no allowed values), PXE among the override targets, and BootSourceOverrideMode (UEFI or
        Legacy, "" when not reported). Reads the system as last found; one GET per collection."""
        system = self._recent_system()

        def read():
            boot = system.boot
            targets = [getattr(v, "value", v) for v in (boot.allowed_values or [])]
            enabled = getattr(boot.enabled, "value", boot.enabled)
            allowed_enabled = system.json.get("Boot", {}).get("BootSourceOverrideEnabled@Redfish.AllowableValues")
            try:
                self._cd_drives(system)
                vmedia = True
            except (BMCError, sushy_exc.SushyError):
                vmedia = False
            return {
                "virtual_media": vmedia,
                "boot_once": ("Once" in allowed_enabled) if allowed_enabled else enabled is not None,
                "pxe_boot": ("Pxe" in targets) if targets else True,
                "boot_mode": getattr(boot.mode, "value", boot.mode) or "",
                "boot_targets": targets,
            }
        return self._call(read)

    def _service(self):
        if self._connector is None:
            self._connector = _RetryingConnector(self.base_url, verify=self.verify_tls,
                                                 timeout=self.timeout, retries=self.retries,
                                                 backoff=self.backoff)
            # sushy reads the service root before it authenticates; a BMC that guards the root
            # too (not Redfish-compliant, but seen) then still gets credentials.
            self._connector.set_http_basic_auth(self.username, self.password)
        if self._root is None:
            # Basic auth, not sessions: a task lives seconds, and leaked sessions fill a BMC's
            # few session slots.
            self._root = sushy.Sushy(self.base_url, connector=self._connector,
                                     auth=sushy_auth.BasicAuth(self.username, self.password))
        return self._root

    def _find_system(self):
        root = self._service()
        if self._resolved:
            return root.get_system(self._resolved)
        if self.system_path:
            try:
                system = root.get_system(self.system_path)
            except sushy_exc.ResourceNotFoundError:
                raise BMCError("not_found", f"system not found: {self.system_path.rsplit('/', 1)[-1]}") from None
        elif self.boot_mac:
            system = self._find_by_mac(root, self.boot_mac)
        else:
            members = root.get_system_collection().get_members()
            if len(members) != 1:
                raise BMCError("not_found", "system not found: the address names no system and no "
                                            "boot MAC was given")
            system = members[0]
        self._resolved = system.path
        return system

    def _find_by_mac(self, root, mac: str):
        paths = root.get_system_collection().members_identities
        denied = []
        for path in paths:
            try:
                system = root.get_system(path)
                if mac in self._macs(system):
                    return system
            except sushy_exc.AccessError as exc:
                # A shared endpoint may guard each system with its own credentials: not ours.
                denied.append(exc)
        if paths and len(denied) == len(paths):
            raise denied[0]  # nothing readable with these credentials: an auth failure
        raise BMCError("not_found", f"system not found: {mac}")

    @staticmethod
    def _macs(system) -> set[str]:
        try:
            interfaces = system.ethernet_interfaces.get_members()
        except sushy_exc.MissingAttributeError:
            return set()
        return {normalize_mac(m) for nic in interfaces
                for m in (nic.mac_address, nic.permanent_mac_address) if m}

    # power

    def power_state(self) -> str:
        """'on', 'off', or 'unknown' (powering on/off, paused, not reported). Once the system's path is known (a kept
        BMC), from the System's JSON alone: sushy's parse of the whole System was most of a power poll's CPU. An
        action after it reads the System itself."""
        if not self._resolved:
            return POWER_STATES.get(self.system().power_state, "unknown")
        path = self._resolved

        def read():
            self._service()
            body = self._connector.get(path=path).json()
            return body.get("PowerState") if isinstance(body, dict) else None

        value = self._call(read)
        try:
            return POWER_STATES.get(sushy.PowerState(value), "unknown")
        except ValueError:
            return "unknown"

    def power_on(self) -> None:
        self._reset(sushy.ResetType.ON)

    def power_off(self, force: bool = True) -> None:
        self._reset(sushy.ResetType.FORCE_OFF if force else sushy.ResetType.GRACEFUL_SHUTDOWN)

    def reset(self) -> None:
        self._reset(sushy.ResetType.FORCE_RESTART)

    def _reset(self, kind) -> None:
        system = self._recent_system()
        self._call(lambda: system.reset_system(kind))

    # boot

    def set_boot_once(self, target: str) -> None:
        """One-time boot source override for the next power-on: 'pxe', 'disk' (or 'cd')."""
        try:
            source = BOOT_TARGETS[target]
        except KeyError:
            raise ValueError(f"boot target must be one of {', '.join(BOOT_TARGETS)}, not {target!r}") from None
        system = self._recent_system()

        def send():
            # A virtual CD boot the vendor's way first (IDRAC_VIRTUAL_CD_BOOT_OEM, ILO5_VMEDIA_BOOT_ON_NEXT_RESET).
            if target == "cd" and vendors.boot_virtual_cd_once(self.vendor, system, self._cd_drives(system)[0]):
                return
            system.set_system_boot_options(target=source, enabled=sushy.BootSourceOverrideEnabled.ONCE)
        self._call(send)

    def insert_virtual_media(self, image_url: str) -> None:
        """Put an ISO in the virtual CD/DVD drive (ejecting what was there first)."""
        def insert():
            device = self._cd_drives(self.system())[0]
            if device.inserted and device.image == image_url:
                return  # already there: many BMCs refuse a second insert
            if device.inserted:
                device.eject_media()
            device.insert_media(image_url, inserted=True, write_protected=True)
        self._call(insert)

    def eject_virtual_media(self) -> None:
        def eject():
            for device in self._cd_drives(self.system()):
                if device.inserted or device.image:
                    device.eject_media()
        self._call(eject)

    def drives(self) -> list[dict] | None:
        """The drives the BMC itself reports (Systems/<id>/Storage/*/Drives): [{name, serial, model, size_bytes,
        manufacturer, media_type, protocol}], or None when it reports no storage (no Storage link, none there, or no
        drive in it). One GET per storage subsystem and per drive."""
        system = self._recent_system()

        def read():
            try:
                subsystems = system.storage.get_members()
            except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError, sushy_exc.BadRequestError):
                return None  # a BMC without a storage service: the census rests on the inventory alone
            found = []
            for storage in subsystems:
                for drive in storage.drives:
                    found.append({"name": drive.identity, "serial": (drive.serial_number or "").strip(),
                                  "model": (drive.model or "").strip(), "size_bytes": drive.capacity_bytes or 0,
                                  "manufacturer": drive.manufacturer or "", "media_type": drive.media_type or "",
                                  "protocol": str(getattr(drive.protocol, "value", drive.protocol) or "")})
            return found or None
        return self._call(read)

    def inventory(self) -> dict:
        """Out-of-band inspection: what the BMC itself lists for the system, in the agent's inventory's shape where
        the two overlap: {"source": "bmc", "cpu": {model, count (threads), cores, sockets}, "ram_mib", "disks"
        (drives(): [{name, serial, model, size_bytes, type}] or None when the BMC reports no storage), "nics"
        [{name, mac, speed_gbps}], "gpus" [{name, manufacturer}] (processors of type GPU), "system" {manufacturer,
        model, serial, bios_version}}. A collection the BMC does not offer is left empty, never guessed."""
        system = self._recent_system()

        def members(attribute):
            try:
                return getattr(system, attribute).get_members()
            except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError, sushy_exc.BadRequestError):
                return []

        def read():
            processors = members("processors")
            kind = {p.identity: str(getattr(p.processor_type, "value", p.processor_type) or "CPU").upper()
                    for p in processors}
            cpus = [p for p in processors if kind[p.identity] == "CPU"]
            summary = system.memory_summary
            ram_gib = summary.size_gib if summary is not None else None
            ram_mib = int(ram_gib * 1024) if ram_gib else None
            nics = [{"name": n.identity, "mac": normalize_mac(n.mac_address or n.permanent_mac_address or ""),
                     "speed_gbps": (n.speed_mbps / 1000) if n.speed_mbps else None}
                    for n in members("ethernet_interfaces")]
            return {"source": "bmc",
                    "cpu": {"model": next((p.model for p in cpus if p.model), ""), "sockets": len(cpus),
                            "cores": sum(p.total_cores or 0 for p in cpus) or None,
                            "count": sum(p.total_threads or 0 for p in cpus) or None},
                    "ram_mib": ram_mib, "nics": nics,
                    "gpus": [{"name": p.model or p.identity, "manufacturer": p.manufacturer or ""}
                             for p in processors if kind[p.identity] == "GPU"],
                    "system": {"manufacturer": system.manufacturer or "", "model": system.model or "",
                               "serial": system.serial_number or "", "bios_version": system.bios_version or ""}}
        found = self._call(read)
        drives = self.drives()
        found["disks"] = None if drives is None else [
            {"name": d["name"], "serial": d["serial"], "model": d["model"], "size_bytes": d["size_bytes"],
             # The agent's type is the kernel's transport (nvme), the BMC's the protocol, else the medium (ssd, hdd).
             "type": "nvme" if d["protocol"].lower() == "nvme" else
             str(getattr(d["media_type"], "value", d["media_type"]) or "").lower()} for d in drives]
        return found

    def event_log(self) -> None:
        """None: the console reads no Redfish log service yet (an IPMI BMC's SEL: hosts/bmc/ipmi.py)."""
        return None

    def _cd_drives(self, system) -> list:
        try:
            devices = system.virtual_media.get_members()
        except sushy_exc.MissingAttributeError:
            # Older BMCs hang virtual media off the manager (IDRAC_VMEDIA_ON_MANAGER, and iLO 5's Managers/1).
            devices = [d for manager in system.managers for d in manager.virtual_media.get_members()]
        cds = [d for d in devices if CD_MEDIA & set(d.media_types or ())]
        if not cds:
            raise BMCError("unsupported", f"system {system.identity} has no virtual CD/DVD drive")
        return cds

    # errors

    def _call(self, fn):
        try:
            result = fn()
        except (sushy_exc.SushyError, requests.RequestException) as exc:
            self._broken = True  # not kept: the next use starts from the service root
            error = self._error(exc)
            _tell(error.kind)
            raise error from exc
        except BaseException as exc:
            self._broken = True
            if isinstance(exc, BMCError):
                _tell(exc.kind)
            raise
        _tell("ok")
        return result

    def _error(self, exc: Exception) -> BMCError:
        if isinstance(exc, sushy_exc.AccessError):
            return BMCError("auth", f"BMC rejected credentials ({exc.status_code})")
        if isinstance(exc, sushy_exc.ResourceNotFoundError):
            return BMCError("not_found", str(exc))
        if isinstance(exc, sushy_exc.HTTPError):
            code = exc.status_code
            reason = exc.detail or _http_phrase(code)
            kind = "server_error" if code >= 500 and code != 501 else "unsupported"
            return BMCError(kind, f"BMC error {code}: {reason}")
        causes = _causes(exc)
        if any(isinstance(e, requests.exceptions.Timeout) for e in causes):
            return BMCError("timeout", f"BMC timed out after {self.timeout:g}s")
        tls = _tls_reason(causes)
        if tls:
            return BMCError("tls", f"BMC TLS error: {tls}")
        if isinstance(exc, (sushy_exc.ConnectionError, requests.RequestException)):
            return BMCError("unreachable", f"BMC unreachable: {_unreachable_reason(causes)}")
        if isinstance(exc, (sushy_exc.MissingActionError, sushy_exc.MissingAttributeError,
                            sushy_exc.InvalidParameterValueError, sushy_exc.MalformedAttributeError,
                            sushy_exc.UnknownDefaultError)):
            return BMCError("unsupported", f"BMC does not support this: {exc}")
        return BMCError("server_error", f"BMC error: {exc}")

    # BIOS settings and firmware (Redfish's Bios and UpdateService; hosts/flows/firmware.py drives them)

    def bios_attributes(self) -> dict:
        """The BIOS attributes in force (Systems/<id>/Bios) and the changes waiting for the next reboot (its
        Settings object): {"attributes": {...}, "pending": {...}}. BMCError("unsupported") where the system has
        no Bios resource."""
        system = self._recent_system()

        def read():
            bios = system.bios
            attributes = dict(bios.attributes or {})
            try:
                waiting = dict(bios.pending_attributes or {})
            except (sushy_exc.MissingAttributeError, sushy_exc.ResourceNotFoundError):
                waiting = {}  # a BIOS without a Settings object: nothing is ever pending
            return {"attributes": attributes,
                    "pending": {k: v for k, v in waiting.items() if attributes.get(k, object()) != v}}
        return self._call(read)

    def bios_apply(self, changes: dict) -> None:
        """PATCH the BIOS's Settings object with `changes`; they take effect at the next reboot."""
        system = self._recent_system()
        self._call(lambda: system.bios.set_attributes(dict(changes)))

    def firmware_inventory(self) -> list[dict]:
        """UpdateService/FirmwareInventory, this system's components only (an item related to another system is
        left out): [{"id", "path", "name", "version", "updateable"}]. One GET per item."""
        system = self._recent_system()

        def read():
            inventory = self._service().get_update_service().firmware_inventory
            found = []
            for item in inventory.get_members():
                related = [str(r.get("@odata.id", "")).rstrip("/") for r in item.related_item or ()
                           if isinstance(r, dict)]
                systems = [r for r in related if "/Systems/" in r]
                if systems and system.path.rstrip("/") not in systems:
                    continue
                found.append({"id": item.identity, "path": item.path, "name": item.name or item.identity,
                              "version": str(item.version or ""), "updateable": bool(item.updateable)})
            return found
        return self._call(read)

    def firmware_update(self, image_url: str, target: str) -> str:
        """UpdateService.SimpleUpdate of one inventory item (`target`: its path) from `image_url`; the task's
        path, to follow with firmware_task()."""
        def send():
            protocol = "HTTPS" if image_url.lower().startswith("https:") else "HTTP"
            service = self._service().get_update_service()
            return service.simple_update(image_url, targets=[target], transfer_protocol=protocol).task_monitor_uri
        return self._call(send)

    def firmware_task(self, path: str) -> dict:
        """An update's task as the BMC reports it: {"state": TaskState ("Running", "Completed", "Exception", ...),
        "status", "percent", "messages": [text, ...]}."""
        def read():
            response = self._service()._conn.get(path=path)
            doc = response.json() if response.content else {}
            state = doc.get("TaskState") or ("Running" if response.status_code == 202 else "Completed")
            return {"state": state, "status": doc.get("TaskStatus") or "", "percent": doc.get("PercentComplete"),
                    "messages": [str(m.get("Message", "")) for m in doc.get("Messages") or [] if isinstance(m, dict)]}
        return self._call(read)


def _http_phrase(code: int) -> str:
    try:
        return http.client.responses[code]
    except KeyError:
        return "unknown error"
