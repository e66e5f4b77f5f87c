"""The lab's IPMI BMCs: real IPMI LAN (RMCP+) servers, pyghmi's BMC server class (as virtualbmc uses it), with
chassis control wired to the same lab system, power landings, boot override and events as its Redfish BMCs.

Runs inside the Redfish lab's process (`python -m lab.redfish serve`, lab/redfish.py): a system with `"ipmi": True`
gets a UDP port speaking IPMI instead of its own Redfish port. Its power requests go through the lab's driver
(the same delays, landings, events and power-on notices, so the lab's servers boot what an IPMI power-on asked
for), its boot override is the system's (PXE or disk, once or persistent, UEFI or legacy), and it keeps a system
event log (SEL) the lab adds entries to (`RedfishLab.add_sel`). Faults: `bmc-down` and `bmc-hang` drop every
packet (no answer: the client's timeout), `bmc-500` answers every command "node busy" (0xC0). A system with
`"ipmi_ciphers": False` refuses every cipher suite (a BMC whose suite 3 and 17 were disabled), an unknown user
gets RMCP+'s "unauthorized name", a wrong password the BMC's honest RAKP answer the client then rejects.
"""
from __future__ import annotations

import logging
import struct
import threading
import time
import uuid as uuidlib

LOG = logging.getLogger("lab.ipmi")

BOOT_DEVICES = {0x1: "Pxe", 0x2: "Hdd", 0x5: "Cd"}  # Set System Boot Options' device selector → Redfish's target
DEVICE_BITS = {v: k for k, v in BOOT_DEVICES.items()}
RMCP_NO_CIPHER = 0x11  # "No Cipher Suite match with proposed security algorithms"
RMCP_UNAUTHORIZED_NAME = 0x0D
SEL_MAX = 1024


def _session_class():
    from pyghmi.ipmi.private import constants, serversession

    class LabServerSession(serversession.ServerSession):
        """pyghmi's server session, refusing what a real BMC refuses instead of staying silent."""

        def create_open_session_response(self, request):
            response = super().create_open_session_response(request)
            # pyghmi's server speaks cipher suite 3 (HMAC-SHA1) only: refuse a proposal of anything else (17's
            # HMAC-SHA256) as a BMC does, so the client falls back, rather than answer with another suite.
            if not getattr(self.bmc, "ciphers", True) or (len(request) > 12 and request[12] != 1):
                return bytearray([request[0], RMCP_NO_CIPHER, 0, 0]) + self.clientsessionid
            return response

        def _got_rakp1(self, data):
            name = bytes(data[28:]).decode("utf-8", "replace") if len(data) > 28 and data[27] else ""
            if self.authdata.get(name) is None:
                self.send_payload(bytearray([data[0], RMCP_UNAUTHORIZED_NAME, 0, 0]) + self.clientsessionid,
                                  constants.payload_types["rakp2"], retry=False)
                return
            return super()._got_rakp1(data)

    return LabServerSession


def _bmc_class():
    from pyghmi.ipmi import bmc

    class LabIpmiBmc(bmc.Bmc):
        def __init__(self, site, uuid: str, username: str, password: str, host: str, port: int,
                     ciphers: bool = True, sel=()):
            self.site, self.system, self.ciphers = site, uuid, ciphers
            self.sel: list[bytes] = []
            self.sel_lock = threading.Lock()
            super().__init__({username: password}, port=port, bmcuuid=uuidlib.UUID(uuid), address=host)
            self.port = self.serversocket.getsockname()[1]  # pyghmi routes a session's packets by it
            for entry in sel:
                self.add_sel(**entry)

        # faults

        def _fault(self):
            fault = self.site.active_fault(self.system)
            return fault["kind"] if fault else None

        def sessionless_data(self, data, sockaddr):
            if self._fault() in ("bmc-down", "bmc-hang"):
                return
            return super().sessionless_data(data, sockaddr)

        def handle_raw_request(self, request, session):
            fault = self._fault()
            if fault in ("bmc-down", "bmc-hang"):
                return
            if fault == "bmc-500":
                return session.send_ipmi_response(code=0xC0)
            netfn, command = request["netfn"], request["command"]
            if netfn == 0x0A:
                return self.storage(command, request.get("data") or [], session)
            return super().handle_raw_request(request, session)

        # chassis: the lab driver's power and boot, as the Redfish BMC drives them

        def get_power_state(self):
            return "on" if self.site.driver.get_power_state(self.system) == "On" else "off"

        def _power(self, state):
            self.site.driver.set_power_state(self.system, state)

        def power_on(self):
            self._power("On")

        def power_off(self):
            self._power("ForceOff")

        def power_shutdown(self):
            self._power("GracefulShutdown")

        def power_reset(self):
            self._power("ForceRestart")

        def power_cycle(self):
            self._power("ForceRestart")

        def get_system_guid(self):
            return uuidlib.UUID(self.system)

        def set_system_boot_options(self, request, session):
            data = request.get("data") or []
            if data and data[0] & 0x7F == 5 and len(data) >= 3:
                flags, device = data[1], (data[2] >> 2) & 0x0F
                driver = self.site.driver
                if not flags & 0x80 or device == 0:  # the override cleared
                    driver.set_boot_enabled(self.system, "Disabled")
                    return session.send_ipmi_response()
                if device not in BOOT_DEVICES:
                    return session.send_ipmi_response(code=0xCC)
                driver.set_boot_device(self.system, BOOT_DEVICES[device])
                driver.set_boot_mode(self.system, "UEFI" if flags & 0x20 else "Legacy")
                driver.set_boot_enabled(self.system, "Continuous" if flags & 0x40 else "Once")
                return session.send_ipmi_response()
            return session.send_ipmi_response()  # set-in-progress, acknowledgements, the boot timer: nodded at

        def get_system_boot_options(self, request, session):
            data = request.get("data") or []
            if not data or data[0] & 0x7F != 5:
                return session.send_ipmi_response(code=0x80)  # parameter not supported
            driver = self.site.driver
            enabled = driver.boot_enabled(self.system)
            flags, device = 0, 0
            if enabled in ("Once", "Continuous"):
                flags = 0x80 | (0x40 if enabled == "Continuous" else 0)
                flags |= 0x20 if driver.get_boot_mode(self.system) == "UEFI" else 0
                device = DEVICE_BITS.get(driver.get_boot_device(self.system), 0) << 2
            return session.send_ipmi_response(data=[1, 5, flags, device, 0, 0, 0])

        # the system event log (IPMI 2.0, chapter 31)

        def add_sel(self, sensor_type: int, offset: int = 0, sensor: int = 1, deasserted: bool = False,
                    event_type: int = 0x6F) -> int:
            with self.sel_lock:
                record_id = (self.sel and struct.unpack("<H", self.sel[-1][:2])[0] or 0) + 1
                record = struct.pack("<HBIHBBBBBBB", record_id, 0x02, int(time.time()), 0x0020, 0x04,
                                     int(sensor_type), int(sensor), (0x80 if deasserted else 0) | int(event_type),
                                     int(offset) & 0x0F, 0xFF, 0xFF)
                self.sel.append(record)
                del self.sel[:-SEL_MAX]
            return record_id

        def storage(self, command, data, session):
            with self.sel_lock:
                records = list(self.sel)
            if command == 0x40:  # Get SEL Info
                last = struct.unpack("<I", records[-1][3:7])[0] if records else 0
                info = struct.pack("<BHHIIB", 0x51, len(records), 0xFFFF, last, 0, 0x02)
                return session.send_ipmi_response(data=list(info))
            if command == 0x42:  # Reserve SEL
                return session.send_ipmi_response(data=[1, 0])
            if command == 0x43 and len(data) >= 6:  # Get SEL Entry
                wanted = data[2] | data[3] << 8
                ids = [struct.unpack("<H", r[:2])[0] for r in records]
                if not records:
                    return session.send_ipmi_response(code=0xCB)  # requested data not present
                index = 0 if wanted == 0 else (len(ids) - 1 if wanted == 0xFFFF else
                                               ids.index(wanted) if wanted in ids else -1)
                if index < 0:
                    return session.send_ipmi_response(code=0xCB)
                following = ids[index + 1] if index + 1 < len(ids) else 0xFFFF
                body = records[index][data[4]:] if data[5] == 0xFF else records[index][data[4]:data[4] + data[5]]
                return session.send_ipmi_response(data=list(struct.pack("<H", following) + body))
            if command == 0x47:  # Clear SEL
                with self.sel_lock:
                    self.sel.clear()
                return session.send_ipmi_response(data=[1])
            if command == 0x48:  # Get SEL Time
                return session.send_ipmi_response(data=list(struct.pack("<I", int(time.time()))))
            return session.send_ipmi_response(code=0xC1)

    return LabIpmiBmc


class IpmiServers:
    """The lab process's IPMI BMCs: one per IPMI system, one loop thread serving every one of them."""

    def __init__(self, site):
        from pyghmi.ipmi.private import serversession

        serversession.ServerSession = _session_class()  # the lab's own process: pyghmi's server module only
        self.site, self.bmcs, self._cls = site, {}, _bmc_class()
        self._thread = None

    def start(self, uuid: str, spec: dict, host: str) -> int:
        username, password = spec["ipmi_credentials"]
        make = lambda port: self._cls(self.site, uuid, username, password, host, port,  # noqa: E731
                                      ciphers=spec.get("ipmi_ciphers", True), sel=spec.get("sel") or ())
        try:
            bmc = make(int(spec.get("port") or 0))
        except OSError:  # the port of the lab's last start (a restart asks for it) is taken over UDP: another
            bmc = make(0)
        self.bmcs[uuid] = bmc
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ipmi", daemon=True)
            self._thread.start()
        LOG.info("IPMI BMC of %s on udp/%s", spec["name"], bmc.port)
        return bmc.port

    @staticmethod
    def _loop():
        from pyghmi.ipmi.private import session

        while True:
            try:
                session.Session.wait_for_rsp(1)
            except Exception:  # one bad packet must not stop every IPMI BMC
                LOG.exception("IPMI loop")

    def add_sel(self, uuid: str, **entry) -> int:
        return self.bmcs[uuid].add_sel(**entry)
