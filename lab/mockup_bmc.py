"""A vendor's BMC from a Redfish mockup folder: sushy-tools' static mockup server, with power, boot and media state."""
# sushy-tools' static server (sushy_tools/static/main.py: `sushy-static`) serves a mockup folder (DMTF's layout:
# redfish/v1/<path>/index.json) and answers every POST and PATCH with 204 and no change, so a client's power, boot
# and virtual media requests cannot be checked against it. This is the same server with the few actions a console
# sends answered as the vendor's BMC answers them, with state:
#
# - ComputerSystem.Reset: PowerState; a power-on is a boot, recorded with what it booted (GET /_mockup/boots).
# - PATCH of a system's Boot: the override (a target outside its AllowableValues: 400); "Once" is spent by a boot.
# - VirtualMedia InsertMedia / EjectMedia, and PATCH of a VirtualMedia (Image, Inserted, Oem: iLO 5's way).
# - iDRAC's OEM ImportSystemConfiguration: ServerBoot.1#BootOnce and #FirstBootDevice (VCD-DVD).
#
# What a boot from "Cd" boots is the vendor's (--vendor): a DMTF BMC boots its inserted virtual CD; an iDRAC and an
# iLO 5 boot a local optical drive unless told their own way (hosts/bmc/vendors.py: IDRAC_VIRTUAL_CD_BOOT_OEM,
# ILO5_VMEDIA_BOOT_ON_NEXT_RESET). Every request is kept (GET /_mockup/requests). Basic auth with --username and
# --password. Run: python -m lab.mockup_bmc --mockup DIR --vendor idrac --port 0 (prints "port N" when ready).
from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import re
import sys
import threading
from http import server as http_server

from sushy_tools.static import main as sushy_static

VENDORS = ("dmtf", "idrac", "ilo5")
SCP_ATTRIBUTE = re.compile(r'<Attribute Name="ServerBoot\.1#(BootOnce|FirstBootDevice)">([^<]*)</Attribute>')


def load_mockup(folder: str) -> dict[str, dict]:
    """path ('/redfish/v1/Systems/1') → document, from every index.json under the folder."""
    docs = {}
    for root, _dirs, files in os.walk(folder):
        if "index.json" in files:
            rel = os.path.relpath(root, folder).replace(os.sep, "/")
            with open(os.path.join(root, "index.json"), encoding="utf-8") as f:
                docs["/" + rel.rstrip("/")] = json.load(f)
    return docs


class Mockup:
    def __init__(self, docs: dict[str, dict], vendor: str, username: str, password: str):
        self.docs, self.vendor = docs, vendor
        self.auth = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.boots: list[dict] = []
        self.idrac_boot_once: str | None = None  # FirstBootDevice set through ImportSystemConfiguration

    def systems(self) -> list[str]:
        return [p for p, d in self.docs.items() if "#ComputerSystem." in str(d.get("@odata.type", ""))]

    def media(self) -> list[dict]:
        return [d for d in self.docs.values() if "#VirtualMedia." in str(d.get("@odata.type", ""))]

    def boot(self, system: dict) -> None:
        """A power-on: what the system boots, by its one-time override and the vendor's rules."""
        boot = system.setdefault("Boot", {})
        once = boot.get("BootSourceOverrideEnabled") == "Once"
        target = boot.get("BootSourceOverrideTarget") if once else "None"
        cds = [m for m in self.media() if {"CD", "DVD"} & set(m.get("MediaTypes") or ()) and m.get("Inserted")]
        booted, image = target, None
        if self.vendor == "idrac" and self.idrac_boot_once == "VCD-DVD":
            booted, image = ("VirtualCD", cds[0].get("Image")) if cds else ("VirtualCD (empty)", None)
        elif target == "Cd":
            hpe = [m for m in cds if ((m.get("Oem") or {}).get("Hpe") or {}).get("BootOnNextServerReset")]
            if self.vendor == "dmtf" and cds:
                booted, image = "VirtualCD", cds[0].get("Image")
            elif self.vendor == "ilo5" and hpe:
                booted, image = "VirtualCD", hpe[0].get("Image")
            else:
                booted = "LocalCD"  # the standard override's Cd, on this vendor: the local optical drive
        self.boots.append({"system": system.get("Id"), "booted": booted or "None", "image": image})
        if once:
            boot["BootSourceOverrideEnabled"], boot["BootSourceOverrideTarget"] = "Disabled", "None"
        self.idrac_boot_once = None
        for m in self.media():
            if (m.get("Oem") or {}).get("Hpe"):
                m["Oem"]["Hpe"]["BootOnNextServerReset"] = False

    def post(self, path: str, body: dict) -> tuple[int, dict | None, dict]:
        if path.endswith("/Actions/ComputerSystem.Reset"):
            system = self.docs.get(path.rsplit("/Actions/", 1)[0])
            kind = body.get("ResetType")
            if system is None:
                return 404, None, {}
            allowed = system.get("Actions", {}).get("#ComputerSystem.Reset", {}).get(
                "ResetType@Redfish.AllowableValues") or ["On", "ForceOff", "ForceRestart", "GracefulShutdown"]
            if kind not in allowed:
                return 400, _error(f"ResetType {kind!r} is not one of {allowed}"), {}
            was_on = system.get("PowerState") == "On"
            if kind in ("On", "ForceOn") and not was_on or kind in ("ForceRestart", "GracefulRestart", "PowerCycle"):
                system["PowerState"] = "On"
                self.boot(system)
            elif kind in ("ForceOff", "GracefulShutdown", "PushPowerButton"):
                system["PowerState"] = "Off"
            return 204, None, {}
        if path.endswith("/Actions/VirtualMedia.InsertMedia") or path.endswith("/Actions/VirtualMedia.EjectMedia"):
            media = self.docs.get(path.rsplit("/Actions/", 1)[0])
            if media is None:
                return 404, None, {}
            if path.endswith("InsertMedia"):
                if not body.get("Image"):
                    return 400, _error("InsertMedia requires the parameter Image"), {}
                media.update(Image=body["Image"], Inserted=body.get("Inserted", True),
                             WriteProtected=body.get("WriteProtected", True), ConnectedVia="URI")
            else:
                media.update(Image=None, Inserted=False, ConnectedVia="NotConnected")
            return 204, None, {}
        if path.endswith("Manager.ImportSystemConfiguration") and self.vendor == "idrac":
            found = dict(SCP_ATTRIBUTE.findall(str(body.get("ImportBuffer") or "")))
            if found.get("BootOnce") == "Enabled" and found.get("FirstBootDevice"):
                self.idrac_boot_once = found["FirstBootDevice"]
            return 202, None, {"Location": "/redfish/v1/TaskService/Tasks/JID_000000000001"}
        return 404, _error(f"no action at {path}"), {}

    def patch(self, path: str, body: dict) -> tuple[int, dict | None, dict]:
        doc = self.docs.get(path)
        if doc is None:
            return 404, None, {}
        if "#ComputerSystem." in str(doc.get("@odata.type", "")):
            boot = body.get("Boot") or {}
            allowed = doc.get("Boot", {}).get("BootSourceOverrideTarget@Redfish.AllowableValues")
            if "BootSourceOverrideTarget" in boot and allowed and boot["BootSourceOverrideTarget"] not in allowed:
                return 400, _error(f"BootSourceOverrideTarget {boot['BootSourceOverrideTarget']!r} is not allowed"), {}
            doc.setdefault("Boot", {}).update(boot)
            return 204, None, {}
        if "#VirtualMedia." in str(doc.get("@odata.type", "")):
            for key in ("Image", "Inserted", "WriteProtected"):
                if key in body:
                    doc[key] = body[key]
            if (body.get("Oem") or {}).get("Hpe"):
                doc.setdefault("Oem", {}).setdefault("Hpe", {}).update(body["Oem"]["Hpe"])
            return 204, None, {}
        return 405, _error(f"{path} cannot be patched"), {}


def _error(message: str) -> dict:
    return {"error": {"code": "Base.1.8.GeneralError", "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.GeneralError", "Message": message}]}}


class Handler(sushy_static.RequestHandler):
    mockup: Mockup

    def log_message(self, *args):  # quiet: the requests are kept for the tests instead
        pass

    def _body(self) -> dict:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return {"_unparsed": raw.decode(errors="replace")}

    def _send(self, code: int, doc=None, headers: dict | None = None) -> None:
        data = json.dumps(doc).encode() if doc is not None else b""
        self.send_response(code)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if doc is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _authorised(self) -> bool:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/redfish/v1", "/redfish") or path.startswith("/_mockup"):
            return True  # the service root is open, as Redfish asks
        if self.headers.get("Authorization") != self.mockup.auth:
            self._send(401, _error("authentication required"), {"WWW-Authenticate": 'Basic realm="mockup"'})
            return False
        return True

    def _handle(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        body = self._body() if method in ("POST", "PATCH") else None
        m = self.mockup
        with m.lock:
            if not path.startswith("/_mockup"):
                m.requests.append({"method": method, "path": path, "body": body})
            if not self._authorised():
                return
            if path == "/_mockup/boots":
                return self._send(200, m.boots)
            if path == "/_mockup/requests":
                return self._send(200, m.requests)
            if method in ("GET", "HEAD"):
                doc = m.docs.get(path)
                if doc is None:
                    return self._send(404, _error(f"{path} not found"))
                return self._send(200, copy.deepcopy(doc), {"Allow": "GET, HEAD, PATCH, POST",
                                                            "ETag": f'W/"{abs(hash(json.dumps(doc))) % 10**8}"'})
            code, doc, headers = (m.post if method == "POST" else m.patch)(path, body or {})
            return self._send(code, doc, headers)

    def do_GET(self):
        self._handle("GET")

    def do_HEAD(self):
        self._handle("HEAD")

    def do_POST(self):
        self._handle("POST")

    def do_PATCH(self):
        self._handle("PATCH")


def serve(folder: str, vendor: str, *, host: str = "127.0.0.1", port: int = 0, username: str = "admin",
          password: str = "password") -> http_server.ThreadingHTTPServer:
    if vendor not in VENDORS:
        raise ValueError(f"vendor must be one of {', '.join(VENDORS)}")
    handler = type("MockupHandler", (Handler,), {"mockup": Mockup(load_mockup(folder), vendor, username, password)})
    return http_server.ThreadingHTTPServer((host, port), handler)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser("mockup-bmc")
    parser.add_argument("--mockup", required=True, help="the mockup folder (holding redfish/v1/index.json)")
    parser.add_argument("--vendor", choices=VENDORS, default="dmtf")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--username", default="admin")
    parser.add_argument("--password", default="password")
    args = parser.parse_args(argv)
    httpd = serve(args.mockup, args.vendor, port=args.port, username=args.username, password=args.password)
    print(f"port {httpd.server_address[1]}", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
