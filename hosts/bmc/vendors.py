"""Vendors' Redfish: Metal3's vendor schemes (idrac-*, ilo5-*) and the quirks of each vendor's BMC, handled."""
# Metal3 (baremetal-operator, pkg/hardwareutils/bmc) accepts idrac-redfish, idrac-virtualmedia, ilo5-redfish and
# ilo5-virtualmedia, each also as +http and +https (RegisterFactory with the "http" and "https" sub-schemes), the URL
# path naming the Redfish system as for redfish://. They are Redfish with a vendor's driver behind them: the console
# drives them through the same client (hosts/bmc/client.py) and handles each vendor's quirks here, by name.
#
# What is not a vendor scheme: idrac:// (Dell's WS-Management), ilo4:// and ilo5:// (HPE's proliantutils
# protocols), irmc:// and ibmc://; they stay refused with the list of those supported.
from __future__ import annotations

from dataclasses import dataclass

# The quirks, by name; each is handled where its name appears in hosts/bmc/client.py or below.
# - IDRAC_VMEDIA_ON_MANAGER: iDRAC firmware before 6.00 lists virtual media only under its manager
#   (Managers/iDRAC.Embedded.1/VirtualMedia, slots "CD" and "RemovableDisk"), not under the system; the console
#   takes the manager's CD slot (BMC._cd_drives).
# - IDRAC_VIRTUAL_CD_BOOT_OEM: iDRAC's Redfish cannot set the boot device to virtual media the standard way
#   (sushy-oem-idrac says so: a standard override to Cd is not the virtual CD); Dell's own way (sushy-oem-idrac's
#   set_virtual_boot_device, Ironic's idrac-redfish-virtual-media) is the manager's OEM ImportSystemConfiguration
#   with ServerBoot.1#BootOnce Enabled and FirstBootDevice VCD-DVD (boot_virtual_cd_once below). The job it starts
#   is not waited for (sushy-oem-idrac polls it): the power-on that follows is what it is for.
# - ILO5_VMEDIA_OEM_ONLY: iLO 5's VirtualMedia (v1_0_0) has no standard InsertMedia/EjectMedia action (only Hpe OEM
#   ones): sushy PATCHes Image and Inserted on the resource instead, which iLO 5 accepts.
# - ILO5_VMEDIA_BOOT_ON_NEXT_RESET: iLO's own one-time boot from a virtual medium is the medium's
#   Oem.Hpe.BootOnNextServerReset (proliantutils' set_vm_status with BOOT_ONCE, as Ironic's ilo drivers use it).
#   The console sets it beside the standard override to Cd (BMC.set_boot_once("cd"), boot_virtual_cd_once below),
#   so the virtual CD boots next whichever of the two the firmware honours.
#
# Boot mode, on every vendor: the one-time override carries the target and "Once" only, never
# BootSourceOverrideMode, so the BMC keeps the boot mode it has (UEFI or Legacy); preflight records the mode it
# reports (BMC.quirks).
IDRAC_VMEDIA_ON_MANAGER = "IDRAC_VMEDIA_ON_MANAGER"
IDRAC_VIRTUAL_CD_BOOT_OEM = "IDRAC_VIRTUAL_CD_BOOT_OEM"
ILO5_VMEDIA_OEM_ONLY = "ILO5_VMEDIA_OEM_ONLY"
ILO5_VMEDIA_BOOT_ON_NEXT_RESET = "ILO5_VMEDIA_BOOT_ON_NEXT_RESET"


@dataclass(frozen=True)
class Vendor:
    name: str  # as people say it: "Dell iDRAC"
    quirks: frozenset[str]

    def has(self, quirk: str) -> bool:
        return quirk in self.quirks


GENERIC = Vendor("Redfish", frozenset())
IDRAC = Vendor("Dell iDRAC", frozenset({IDRAC_VMEDIA_ON_MANAGER, IDRAC_VIRTUAL_CD_BOOT_OEM}))
ILO5 = Vendor("HPE iLO 5", frozenset({ILO5_VMEDIA_OEM_ONLY, ILO5_VMEDIA_BOOT_ON_NEXT_RESET}))

# Metal3's base scheme → (vendor, boots from virtual media). Each is also accepted as BASE+http and BASE+https.
BASES = {
    "redfish": (GENERIC, False),
    "redfish-virtualmedia": (GENERIC, True),
    "idrac-redfish": (IDRAC, False),
    "idrac-virtualmedia": (IDRAC, True),
    "ilo5-redfish": (ILO5, False),
    "ilo5-virtualmedia": (ILO5, True),
}


def redfish_schemes() -> dict[str, tuple[str, bool]]:
    """Every Redfish scheme the console accepts → (transport, virtual media boot): BASE (https), BASE+https,
    BASE+http."""
    out = {}
    for base, (_vendor, vmedia) in BASES.items():
        out.update({base: ("https", vmedia), f"{base}+https": ("https", vmedia), f"{base}+http": ("http", vmedia)})
    return out


def vendor_of(scheme: str) -> Vendor:
    """The vendor an address's scheme names (GENERIC for redfish*, and for anything else)."""
    return BASES.get(scheme.split("+", 1)[0], (GENERIC, False))[0]


# iDRAC's Server Configuration Profile for a one-time boot from the virtual CD (IDRAC_VIRTUAL_CD_BOOT_OEM), as
# sushy-oem-idrac writes it: the manager's FQDD, and no whitespace between the tags (iDRAC's job fails on it).
IDRAC_VCD_BOOT_ONCE = ('<SystemConfiguration><Component FQDD="{fqdd}">'
                       '<Attribute Name="ServerBoot.1#BootOnce">Enabled</Attribute>'
                       '<Attribute Name="ServerBoot.1#FirstBootDevice">VCD-DVD</Attribute>'
                       '</Component></SystemConfiguration>')
IMPORT_SYSTEM_CONFIGURATION = "#OemManager.ImportSystemConfiguration"


def boot_virtual_cd_once(vendor: Vendor, system, cd) -> bool:
    """Set the next boot to the virtual CD `cd` (a sushy VirtualMedia) the vendor's way. True when that is the whole
    of it; False when the standard boot override to Cd is still to be sent. Raises sushy's errors."""
    if vendor.has(IDRAC_VIRTUAL_CD_BOOT_OEM):
        manager = system.managers[0]
        actions = (manager.json.get("Actions") or {}).get("Oem") or {}
        target = next((a.get("target") for key, a in actions.items() if key.endswith(IMPORT_SYSTEM_CONFIGURATION)
                       and isinstance(a, dict)), None)
        if not target:
            return False  # iDRAC 6.00 and later, without the OEM action: the standard override boots the virtual CD
        manager._conn.post(target, data={"ShareParameters": {"Target": "ALL"},
                                         "ImportBuffer": IDRAC_VCD_BOOT_ONCE.format(fqdd=manager.identity)})
        return True
    if vendor.has(ILO5_VMEDIA_BOOT_ON_NEXT_RESET):
        cd._conn.patch(cd.path, data={"Oem": {"Hpe": {"BootOnNextServerReset": True}}})
    return False
