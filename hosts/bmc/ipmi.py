"""IPMI BMCs (`ipmi://host[:port]`, Metal3's form) through pyghmi, behind the same interface as the Redfish client."""
# IPMI over LAN (RMCP+) through pyghmi, with the Redfish client's interface (hosts/bmc/client.py: BMC), so the flows,
# preflight and the BMC checks drive either without knowing which. Same error kinds, same rule: transient ones
# (no answer, a busy BMC) are retried here with back-off and by the step until its deadline; a wrong password, an
# unknown user, no common cipher suite or a command the BMC lacks fail at once.
#
# What IPMI cannot do: virtual media (no standard command), the system's NIC MACs (registration cannot check the
# boot MAC against the BMC) and a drive census (the release gate's census of an IPMI host is its inventory of
# record alone). A session is opened per use and closed after it (no keep-alive: an idle console holds none of a
# BMC's few session slots).
from __future__ import annotations

import datetime
import logging
import struct
import time
import uuid as uuidlib

from .client import BMCError, PowerWait, _tell, parse_ipmi_address

LOG = logging.getLogger(__name__)

BOOT_DEVICES = {"pxe": "network", "disk": "hd"}
# Completion codes (IPMI 2.0, table 5-2) → error kind. Anything else a BMC answers is "unsupported".
TRANSIENT_CODES = {0xC0: "node busy", 0xC3: "timed out while processing", 0xCE: "cannot answer now",
                   0xFF: "unspecified error"}
AUTH_CODES = {0xD4: "insufficient privilege"}
# pyghmi's session errors (constants.rmcp_codes and its own) by what they mean for the console.
AUTH_ERRORS = ("Incorrect password", "Unauthorized name", "Invalid username length", "Unauthorized role",
               "Invalid integrity check value", "Unauthorized GUID")
CIPHER_ERRORS = ("Cipher suite", "Invalid authentication algorithm", "Invalid integrity algorithm",
                 "Invalid confidentiality algorithm", "No matching integrity payload")
BUSY_ERRORS = ("Insufficient resources",)
SEL_MAX = 256  # entries read per host: the newest are kept


def _session_error(message: str, where: str) -> BMCError:
    if any(m in message for m in AUTH_ERRORS):
        what = ("incorrect password" if "password" in message or "check value" in message
                else "unknown user" if "name" in message else message)
        return BMCError("auth", f"BMC rejected credentials (IPMI: {what})")
    if any(m in message for m in CIPHER_ERRORS):
        return BMCError("unsupported", f"the BMC offers no IPMI cipher suite this console speaks (IPMI: {message}): "
                                       "enable cipher suite 3 or 17 for the user on the BMC")
    if any(m in message for m in BUSY_ERRORS):
        return BMCError("server_error", f"BMC busy: {message}")
    if message in ("timeout", "Session no longer connected", "None", "") or "Unable to transmit" in message \
            or "Session failed to initialize" in message:
        return BMCError("unreachable", f"BMC unreachable: no IPMI answer from {where}")
    return BMCError("server_error", f"BMC error: {message}")


def _code_error(code: int, what: str) -> BMCError:
    if code in TRANSIENT_CODES:
        return BMCError("server_error", f"BMC error {code:#04x} ({TRANSIENT_CODES[code]}) on {what}")
    if code in AUTH_CODES:
        return BMCError("auth", f"BMC refused {what}: {AUTH_CODES[code]}")
    return BMCError("unsupported", f"BMC does not support {what} (completion code {code:#04x})")


class IpmiBMC(PowerWait):
    """One server's IPMI BMC; see the module's doc. `verify_tls` and `boot_mac` are accepted for the factory's
    sake (IPMI has no TLS, and its BMC does not list the host's NICs); so is `timeout`: pyghmi resends a packet on
    its own schedule and gives up on a BMC that does not answer after about 5 s."""

    scheme = "ipmi"
    virtual_media_boot = False
    lists_inventory = False  # no out-of-band inventory: inventory() is None without asking the BMC

    def __init__(self, address: str, username: str, password: str, verify_tls: bool = True,
                 timeout: float = 10, retries: int = 3, backoff: float = 0.5, boot_mac: str | None = None,
                 uefi: bool = True):
        self.address = address
        self.host, self.port = parse_ipmi_address(address)
        self.username, self.password = username, password
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.boot_mac = boot_mac
        self.uefi = uefi  # the boot mode a boot device is set with (IPMI has no "keep the mode")
        self._command = None

    @classmethod
    def kept(cls, address: str, username: str, password: str, **options) -> "IpmiBMC":
        return cls(address, username, password, **options)  # a session per use (module doc)

    def __enter__(self) -> "IpmiBMC":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            try:
                command.ipmi_session.logout()
            except Exception as exc:  # a BMC gone away: its session expires by itself
                LOG.info("IPMI logout from %s:%s failed: %s", self.host, self.port, type(exc).__name__)

    # the session and the calls

    def _session(self):
        if self._command is None:
            from pyghmi import exceptions as pyghmi_exc
            from pyghmi.ipmi import command

            try:
                # As bytes: pyghmi keys its sessions being opened by the arguments as given and forgets them by the
                # encoded ones, so a str pair would hand the next use a session already logged out.
                self._command = command.Command(bmc=self.host, userid=self.username.encode(),
                                                password=self.password.encode(), port=self.port, keepalive=False)
            except pyghmi_exc.IpmiException as exc:
                raise _session_error(str(exc), f"{self.host}:{self.port}") from None
        return self._command

    def _call(self, what: str, fn):
        """fn(command) with the retries of transient failures; every outcome told to the metrics."""
        from pyghmi import exceptions as pyghmi_exc

        for attempt in range(self.retries + 1):
            try:
                result = fn(self._session())
            except BMCError as exc:
                error = exc
            except pyghmi_exc.IpmiException as exc:
                error = _session_error(str(exc), f"{self.host}:{self.port}")
            except OSError as exc:  # the socket itself (no route, a name that does not resolve)
                error = BMCError("unreachable", f"BMC unreachable: {exc}")
            else:
                _tell("ok")
                return result
            if error.transient:
                self._drop_session()
            if not error.transient or attempt >= self.retries:
                _tell(error.kind)
                raise error
            delay = self.backoff * 2 ** attempt
            LOG.info("IPMI %s on %s:%s failed (%s); retry %d/%d in %.2fs", what, self.host, self.port, error.kind,
                     attempt + 1, self.retries, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _drop_session(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            try:
                command.ipmi_session._mark_broken()  # pyghmi hands a broken session to no later caller
            except Exception:
                pass

    def _raw(self, command, netfn: int, cmd: int, data=(), what: str = "") -> list[int]:
        response = command.raw_command(netfn=netfn, command=cmd, data=list(data))
        if response.get("error"):
            code = response.get("code")
            if isinstance(code, int) and code not in (0, 0xFFFF):
                raise _code_error(code, what or f"command {netfn:#04x}/{cmd:#04x}")
            raise _session_error(str(response["error"]), f"{self.host}:{self.port}")
        return list(response.get("data") or ())

    # registration and preflight

    def check(self, boot_mac: str | None = None) -> dict:
        """Registration's test: the session opens with these credentials and the chassis answers. IPMI lists no
        NICs, so the boot MAC cannot be checked against the BMC (the boot itself proves it)."""
        def read(command):
            power = self._power(command)
            try:
                guid = self._raw(command, 6, 0x37, what="Get System GUID")
                uuid = str(uuidlib.UUID(bytes_le=bytes(guid[:16]))) if len(guid) >= 16 else ""
            except BMCError as exc:
                if exc.kind != "unsupported":
                    raise
                uuid = ""
            return {"system_id": uuid or f"{self.host}:{self.port}", "system_path": "", "name": "",
                    "uuid": uuid, "power_state": power, "macs": []}
        return self._call("check", read)

    def quirks(self) -> dict:
        """What preflight records: no virtual media; boot override once or persistent, PXE or disk; the boot mode
        the BMC reports for its current override (UEFI or Legacy, "" when none is set)."""
        def read(command):
            flags = self._boot_flags(command)
            mode = "" if not flags["valid"] else ("UEFI" if flags["uefi"] else "Legacy")
            return {"virtual_media": False, "boot_once": True, "pxe_boot": True, "boot_mode": mode,
                    "boot_targets": ["Pxe", "Hdd"]}
        return self._call("quirks", read)

    def drives(self) -> None:
        """IPMI reports no drives: the release gate's census of an IPMI host is its inventory of record alone."""
        return None

    def inventory(self) -> None:
        """IPMI has no out-of-band inventory (CPUs, memory, drives, NICs): an IPMI host is inspected by its agent."""
        return None

    # power

    @staticmethod
    def _power(command) -> str:
        state = command.get_power().get("powerstate")
        return state if state in ("on", "off") else "unknown"

    def power_state(self) -> str:
        return self._call("power state", self._power)

    def _chassis(self, what: str, directive: int) -> None:
        self._call(what, lambda command: self._raw(command, 0, 2, [directive], what=what))

    def power_on(self) -> None:
        self._chassis("power on", 1)

    def power_off(self, force: bool = True) -> None:
        """force: power down at once; else a soft off (ACPI shutdown: the OS powers the server off)."""
        self._chassis("power off" if force else "soft off", 0 if force else 5)

    def reset(self) -> None:
        self._chassis("reset", 3)

    # boot

    def set_boot_once(self, target: str) -> None:
        self.set_boot_device(target, persistent=False)

    def set_boot_device(self, target: str, *, persistent: bool = False, uefi: bool | None = None) -> None:
        """Boot override: 'pxe' or 'disk', for the next boot only or persistent, UEFI or legacy (the client's
        mode unless given)."""
        if target == "cd":
            raise BMCError("unsupported", "IPMI cannot boot virtual media: use a redfish-virtualmedia:// address")
        try:
            device = BOOT_DEVICES[target]
        except KeyError:
            raise ValueError(f"boot target must be one of {', '.join(BOOT_DEVICES)}, not {target!r}") from None
        uefi = self.uefi if uefi is None else uefi
        self._call("set boot device", lambda command: command.set_bootdev(device, persist=persistent, uefiboot=uefi))

    def boot_device(self) -> dict:
        """{"target": "pxe" | "disk" | "" (none set), "persistent", "uefi"} as the BMC reports its override."""
        def read(command):
            flags = self._boot_flags(command)
            target = {0x4: "pxe", 0x8: "disk"}.get(flags["device"], "") if flags["valid"] else ""
            return {"target": target, "persistent": flags["persistent"], "uefi": flags["uefi"]}
        return self._call("boot device", read)

    def _boot_flags(self, command) -> dict:
        data = self._raw(command, 0, 9, [5, 0, 0], what="Get System Boot Options")
        flags = data[2] if len(data) > 2 else 0
        return {"valid": bool(flags & 0x80), "persistent": bool(flags & 0x40), "uefi": bool(flags & 0x20),
                "device": (data[3] & 0x3C) if len(data) > 3 else 0}

    def insert_virtual_media(self, image_url: str) -> None:
        raise BMCError("unsupported", "IPMI cannot insert virtual media: use a redfish-virtualmedia:// address")

    def eject_virtual_media(self) -> None:
        return None  # nothing was ever inserted

    # the system event log

    def event_log(self, limit: int = 64) -> list[dict]:
        """The SEL's newest `limit` entries, oldest first: [{"id", "time" (ISO, or None before the BMC's clock was
        set), "sensor_type", "sensor", "event", "direction", "raw"}]."""
        from pyghmi.ipmi.private import constants

        def read(command):
            info = self._raw(command, 0x0A, 0x40, what="Get SEL Info")
            count = struct.unpack("<H", bytes(info[1:3]))[0] if len(info) >= 3 else 0
            entries, record = [], 0
            while record != 0xFFFF and len(entries) < min(count, SEL_MAX):
                data = self._raw(command, 0x0A, 0x43, [0, 0, record & 0xFF, record >> 8, 0, 0xFF],
                                 what="Get SEL Entry")
                if len(data) < 18:
                    break
                record = struct.unpack("<H", bytes(data[0:2]))[0]
                entries.append(_sel_entry(bytes(data[2:18]), constants))
            return entries[-limit:]
        return self._call("event log", read)


def _sel_entry(raw: bytes, constants) -> dict:
    record_id, kind = struct.unpack("<HB", raw[0:3])
    entry = {"id": record_id, "time": None, "sensor_type": "", "sensor": None, "event": "", "direction": "",
             "raw": raw.hex()}
    if kind != 0x02:  # an OEM record: its bytes only
        entry["event"] = f"OEM record type {kind:#04x}"
        return entry
    stamp = struct.unpack("<I", raw[3:7])[0]
    if stamp > 0x20000000:  # below: seconds since the BMC's start, its clock not set
        entry["time"] = datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat()
    sensor_type, sensor, dir_type, data1 = raw[10], raw[11], raw[12], raw[13]
    entry["sensor_type"] = constants.sensor_type_codes.get(sensor_type, f"type {sensor_type:#04x}")
    entry["sensor"] = sensor
    entry["direction"] = "deasserted" if dir_type & 0x80 else "asserted"
    offset, event_type = data1 & 0x0F, dir_type & 0x7F
    table = (constants.sensor_type_offsets.get(sensor_type, {}) if event_type == 0x6F
             else constants.generic_type_offsets.get(event_type, {}))
    described = table.get(offset, {})
    entry["event"] = ((dir_type & 0x80 and described.get("deassertion_desc")) or described.get("desc")
                      or f"offset {offset}")
    return entry
