"""Vendors' Redfish: Metal3's idrac-* and ilo5-* schemes driven against mockups of each vendor's BMC.

Each mockup is a vendor's published Redfish samples (tests/fixtures/bmc_mockups/README.md says which file of which
package each document comes from) served by a real HTTP server process, lab/mockup_bmc.py: sushy-tools' static
mockup server with power, the boot override, virtual media and iDRAC's OEM boot answered as the vendor's BMC does,
and a record of what each power-on booted.

- dmtf:  sushy 5.14.0's DMTF samples (sushy/tests/unit/json_samples: root, system, manager, virtual_media, ...).
- idrac: sushy-oem-idrac 6.0.0's Dell iDRAC samples (sushy_oem_idrac/tests/unit/json_samples: root, system,
         manager with its OEM ImportSystemConfiguration), the manager's VirtualMedia slots in DMTF's shape.
- ilo5:  proliantutils 2.16.3's HPE iLO 5 samples (proliantutils/tests/redfish/json_samples: root, system,
         manager, vmedia_collection, vmedia with Oem.Hpe.BootOnNextServerReset, ethernet_interface)."""
import base64
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hosts.bmc.client import BMC, SCHEME_LIST, BMCError, parse_address
from hosts.bmc.factory import bmc_client
from hosts.bmc.vendors import IDRAC, ILO5

MOCKUPS = Path(__file__).parent / "fixtures" / "bmc_mockups"
USER, PASSWORD = "root", "calvin-mockup"
ISO = "http://images.example/ramdisk.iso"
# vendor → (Metal3 scheme of its virtual media driver, system path, the NIC MAC its samples list, system id,
# its virtual CD)
VENDORS = {
    "dmtf": ("redfish-virtualmedia", "/redfish/v1/Systems/437XR1138R2", "12:44:6a:3b:04:11", "437XR1138R2",
             "/redfish/v1/Managers/BMC/VirtualMedia/CD1"),
    "idrac": ("idrac-virtualmedia", "/redfish/v1/Systems/System.Embedded.1", "b0:7b:25:00:10:01",
              "System.Embedded.1", "/redfish/v1/Managers/iDRAC.Embedded.1/VirtualMedia/CD"),
    "ilo5": ("ilo5-virtualmedia", "/redfish/v1/Systems/1", "98:f2:b3:2a:0e:3d", "1",
             "/redfish/v1/Managers/1/VirtualMedia/2"),
}
AUTHORIZATION = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


class MockupBMC:
    """lab/mockup_bmc.py run as its own process on a free port."""

    def __init__(self, vendor: str):
        self.vendor = vendor
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lab.mockup_bmc", "--mockup", str(MOCKUPS / vendor), "--vendor", vendor,
             "--username", USER, "--password", PASSWORD], stdout=subprocess.PIPE, text=True,
            cwd=Path(__file__).parent.parent)
        line = self.process.stdout.readline()
        assert line.startswith("port "), line
        self.base = f"127.0.0.1:{int(line.split()[1])}"

    def address(self, scheme: str) -> str:
        return f"{scheme}+http://{self.base}{VENDORS[self.vendor][1]}"

    def read(self, path: str):
        request = urllib.request.Request(f"http://{self.base}{path}", headers={"Authorization": AUTHORIZATION})
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())

    def boots(self) -> list[dict]:
        return self.read("/_mockup/boots")

    def requests(self) -> list[dict]:
        return self.read("/_mockup/requests")

    def cd(self) -> dict:
        """The virtual CD as the BMC shows it now."""
        return self.read(VENDORS[self.vendor][4])

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(params=sorted(VENDORS))
def mockup(request):
    bmc = MockupBMC(request.param)
    yield bmc
    bmc.stop()


@pytest.fixture
def idrac():
    bmc = MockupBMC("idrac")
    yield bmc
    bmc.stop()


def client(mockup: MockupBMC, scheme: str | None = None, **options) -> BMC:
    return bmc_client(mockup.address(scheme or VENDORS[mockup.vendor][0]), USER, options.pop("password", PASSWORD),
                      verify_tls=True, boot_mac=None, timeout=5, retries=0, **options)


@pytest.mark.parametrize("base", ["idrac-redfish", "idrac-virtualmedia", "ilo5-redfish", "ilo5-virtualmedia"])
@pytest.mark.parametrize("transport", ["", "+https", "+http"])
def test_metal3_s_vendor_schemes_are_accepted_with_their_transport_and_boot(base, transport):
    scheme, base_url, path = parse_address(f"{base}{transport}://10.0.0.9/redfish/v1/Systems/1")
    assert (scheme, base_url, path) == (base + transport, f"{transport[1:] or 'https'}://10.0.0.9",
                                        "/redfish/v1/Systems/1")
    bmc = BMC(f"{base}{transport}://10.0.0.9/redfish/v1/Systems/1", USER, PASSWORD)
    assert bmc.virtual_media_boot == base.endswith("virtualmedia")
    assert bmc.vendor is (IDRAC if base.startswith("idrac") else ILO5)


@pytest.mark.parametrize("scheme", ["idrac", "ilo5", "ilo4", "irmc", "ibmc", "idrac-redfish-virtualmedia", "ilo5+http"])
def test_a_vendor_protocol_the_console_does_not_drive_is_refused_listing_those_it_does(scheme):
    with pytest.raises(BMCError) as error:
        parse_address(f"{scheme}://10.0.0.9/redfish/v1/Systems/1")
    assert error.value.kind == "unsupported"
    assert str(error.value) == f"BMC address scheme {scheme}:// is not supported: use one of {SCHEME_LIST}"
    assert "idrac-virtualmedia://, idrac-virtualmedia+https://, idrac-virtualmedia+http://" in SCHEME_LIST
    assert "ilo5-redfish://" in SCHEME_LIST and "ipmi://" in SCHEME_LIST


def test_each_vendor_s_bmc_registers_powers_boots_once_and_inserts_and_ejects_virtual_media(mockup):
    _scheme, _path, mac, system_id, _cd = VENDORS[mockup.vendor]
    with client(mockup) as bmc:
        found = bmc.check(mac)  # registration: credentials, the system, the boot MAC
        assert (found["system_id"], found["power_state"]) == (system_id, "on") and mac in found["macs"]

        bmc.power_off()
        bmc.wait_power("off", deadline_s=5)
        bmc.set_boot_once("pxe")
        bmc.power_on()
        bmc.wait_power("on", deadline_s=5)
        assert mockup.boots()[-1] == {"system": system_id, "booted": "Pxe", "image": None}

        bmc.power_off()
        bmc.insert_virtual_media(ISO)
        assert (mockup.cd()["Image"], mockup.cd()["Inserted"]) == (ISO, True)
        bmc.insert_virtual_media(ISO)  # already there: not inserted twice
        bmc.set_boot_once("cd")
        bmc.power_on()
        bmc.wait_power("on", deadline_s=5)
        # Each vendor's own way to boot its virtual CD (hosts/bmc/vendors.py), not its local optical drive.
        assert mockup.boots()[-1] == {"system": system_id, "booted": "VirtualCD", "image": ISO}

        bmc.eject_virtual_media()
        assert (mockup.cd()["Image"], mockup.cd()["Inserted"]) == (None, False)
        quirks = bmc.quirks()
        assert quirks["virtual_media"] and quirks["boot_once"] and quirks["pxe_boot"] and quirks["boot_mode"] == "UEFI"

    sent = mockup.requests()
    inserts = [r for r in sent if r["method"] in ("POST", "PATCH") and (r["body"] or {}).get("Image") == ISO]
    assert len(inserts) == 1, inserts
    # Boot mode: the BMC keeps its own; the console never sends BootSourceOverrideMode to any vendor.
    assert not [r for r in sent if "BootSourceOverrideMode" in json.dumps(r["body"] or {})]
    if mockup.vendor == "ilo5":  # ILO5_VMEDIA_OEM_ONLY: iLO 5's medium is PATCHed, it has no InsertMedia action
        assert inserts[0]["method"] == "PATCH" and inserts[0]["path"] == "/redfish/v1/Managers/1/VirtualMedia/2"
    if mockup.vendor == "idrac":  # IDRAC_VMEDIA_ON_MANAGER: the manager's CD slot, not RemovableDisk
        assert inserts[0]["path"] == ("/redfish/v1/Managers/iDRAC.Embedded.1/VirtualMedia/CD/Actions/"
                                      "VirtualMedia.InsertMedia")
        scp = [r for r in sent if r["path"].endswith("Manager.ImportSystemConfiguration")]
        assert len(scp) == 1 and "VCD-DVD" in scp[0]["body"]["ImportBuffer"]  # IDRAC_VIRTUAL_CD_BOOT_OEM


@pytest.mark.parametrize("vendor", ["idrac", "ilo5"])
def test_with_the_generic_scheme_the_idrac_and_ilo5_mockups_boot_their_local_cd_not_the_virtual_one(vendor):
    mockup = MockupBMC(vendor)
    try:
        with client(mockup, "redfish-virtualmedia") as bmc:
            bmc.power_off()
            bmc.insert_virtual_media(ISO)
            bmc.set_boot_once("cd")
            bmc.power_on()
        assert mockup.boots()[-1]["booted"] == "LocalCD"
    finally:
        mockup.stop()


def test_a_wrong_password_on_a_vendor_bmc_is_an_auth_error_that_is_not_retried(idrac):
    with client(idrac, password="wrong") as bmc, pytest.raises(BMCError) as error:
        bmc.power_state()
    assert error.value.kind == "auth" and not error.value.transient
    assert str(error.value) == "BMC rejected credentials (401)"
