"""The provisioning network's DHCP/boot configuration, as dnsmasq reads it (`manage.py dhcp-config`)."""
# The provisioning network's DHCP/boot configuration, as dnsmasq reads it (`manage.py dhcp-config`).
#
# One `dhcp-host` line per host (its boot MAC, its name and, while its claim holds one, its address), and iPXE
# chain-loading: a server's own PXE firmware gets the iPXE binary over TFTP (Debian's `ipxe` package names:
# undionly.kpxe for BIOS, ipxe.efi for x86-64 UEFI); iPXE itself (DHCP option 175, or user class "iPXE") gets
# the console's per-host script, `<AGENT_BOOT_URL>/boot/<mac>.ipxe` (hosts/boot/ramdisk.py, served once per boot). Only
# known MACs are answered. Settings: DHCP_RANGE, DHCP_RELAY, DHCP_INTERFACE, DHCP_ROUTER, DHCP_DNS_SERVERS,
# DHCP_TFTP_ROOT (vmetal_console/settings.py).
import ipaddress
import re
from collections.abc import Callable, Iterable

from django.conf import settings
from django.utils import timezone

from hosts.choices import HostState
from hosts.models import BareMetalHost

BIOS_BOOT_FILE = "undionly.kpxe"
UEFI_BOOT_FILE = "ipxe.efi"
# iPXE expands settings in the file name it is given: each server asks for its own script.
IPXE_SCRIPT_PATH = "/boot/${mac:hexhyp}.ipxe"
# Hosts that never boot from the network again get no entry.
NOT_SERVED = (HostState.RETIRED,)

_address_source: Callable[[list[int]], dict[int, str]] | None = None


class DHCPConfigError(ValueError):
    """A DHCP setting dnsmasq would refuse or misread."""


def address_source(fn: Callable[[list[int]], dict[int, str]]) -> None:
    """Where a host's address comes from (host id → address): registered by the claims app (IPAM)."""
    global _address_source
    _address_source = fn


def _addresses(host_ids: list[int]) -> dict[int, str]:
    return _address_source(host_ids) if _address_source and host_ids else {}


def _dhcp_name(name: str) -> str:
    """A host name dnsmasq takes as a plain name: one DNS label (dots and other characters as '-')."""
    return re.sub(r"[^A-Za-z0-9-]", "-", name)[:63].strip("-") or "host"


def _entry(host: BareMetalHost, address: str | None) -> str | None:
    if host.state in NOT_SERVED or not host.boot_mac:
        return None
    line = f"dhcp-host={host.boot_mac.lower()},{_dhcp_name(host.name)}"
    return f"{line},{address}" if address else line


def host_entry(host: BareMetalHost) -> str | None:
    """The host's line of the configuration (what preflight checks for its MAC), or None: it gets none."""
    return _entry(host, _addresses([host.pk]).get(host.pk))


def _script_url(boot_url: str | None = None) -> str:
    base = (boot_url or settings.AGENT_BOOT_URL).rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise DHCPConfigError(f"AGENT_BOOT_URL {base!r} must be an http:// URL the servers reach")
    return base + IPXE_SCRIPT_PATH


def ipxe_chain_script(boot_url: str | None = None) -> str:
    """The boot file for a DHCP server that gives each server one boot file and cannot tell iPXE from PXE (QEMU's
    user-mode network, the lab's VMs): an iPXE script that chains to the per-host script, as `dhcp-boot=tag:ipxe`
    does here. boot_url: the agent listener as those servers reach it (default AGENT_BOOT_URL)."""
    return f"#!ipxe\n# vMetal Console: chain to this server's own boot script (hosts/boot/dhcp.py)\nchain {_script_url(boot_url)}\n"


def _range() -> str:
    text = settings.DHCP_RANGE.strip()
    fields = [f.strip() for f in text.split(",")]
    if len(fields) < 2 or any(not f for f in fields):
        raise DHCPConfigError(f"DHCP_RANGE {text!r}: expected start,end[,netmask][,lease time], e.g. "
                              "172.22.0.100,172.22.0.200,255.255.255.0,1h")
    try:
        start = ipaddress.IPv4Address(fields[0])
        if fields[1] != "static":
            end = ipaddress.IPv4Address(fields[1])
            if end < start:
                raise DHCPConfigError(f"DHCP_RANGE {text!r}: the range ends before it starts")
        netmask = ipaddress.IPv4Address(fields[2]) if len(fields) > 2 and "." in fields[2] else None
    except ipaddress.AddressValueError as exc:
        raise DHCPConfigError(f"DHCP_RANGE {text!r}: {exc}") from None
    if settings.DHCP_RELAY and netmask is None:
        # dnsmasq learns a local subnet's mask from its interface; a relayed one it must be told.
        raise DHCPConfigError(f"DHCP_RANGE {text!r}: with DHCP_RELAY the netmask is required "
                              "(start,end,netmask[,lease time])")
    return ",".join(fields)


def _addresses_list(text: str, what: str) -> str:
    values = [v.strip() for v in text.split(",") if v.strip()]
    for value in values:
        try:
            ipaddress.IPv4Address(value)
        except ipaddress.AddressValueError:
            raise DHCPConfigError(f"{what} {value!r} is not an IPv4 address") from None
    return ",".join(values)


def render_config(hosts: Iterable[BareMetalHost] | None = None) -> str:
    """The whole dnsmasq configuration: global options, then one dhcp-host line per host (by name)."""
    hosts = list(BareMetalHost.objects.order_by("name") if hosts is None else hosts)
    addresses = _addresses([h.pk for h in hosts])
    entries = [line for line in (_entry(h, addresses.get(h.pk)) for h in hosts) if line]
    relay = settings.DHCP_RELAY
    lines = [
        "# vMetal Console: the provisioning network's DHCP/boot configuration for dnsmasq.",
        f"# Written by `manage.py dhcp-config` at {timezone.now():%Y-%m-%d %H:%M:%S} UTC: {len(entries)} host(s).",
        "# Write it again when hosts change and restart dnsmasq; do not edit by hand.",
        "port=0",  # DHCP and TFTP only: no DNS server
        "log-dhcp",
    ]
    if relay:
        lines.append("# relay mode: requests arrive from a DHCP relay (giaddr); no interface on that subnet here")
    elif settings.DHCP_INTERFACE:
        lines += [f"interface={settings.DHCP_INTERFACE}", "bind-dynamic"]
    lines.append(f"dhcp-range={_range()}")
    if settings.DHCP_ROUTER:
        lines.append(f"dhcp-option=option:router,{_addresses_list(settings.DHCP_ROUTER, 'DHCP_ROUTER')}")
    if settings.DHCP_DNS_SERVERS:
        lines.append(f"dhcp-option=option:dns-server,{_addresses_list(settings.DHCP_DNS_SERVERS, 'DHCP_DNS_SERVERS')}")
    lines += [
        "# Only servers the console knows are answered.",
        "dhcp-ignore=tag:!known",
        "enable-tftp",
        f"tftp-root={settings.DHCP_TFTP_ROOT}",
        "# iPXE announces itself with option 175 or the user class iPXE: it gets the console's per-host script.",
        "dhcp-match=set:ipxe,175",
        "dhcp-userclass=set:ipxe,iPXE",
        "# A server's own PXE firmware gets iPXE over TFTP: UEFI x86-64 (client arch 7, 9) or BIOS.",
        "dhcp-match=set:efi64,option:client-arch,7",
        "dhcp-match=set:efi64,option:client-arch,9",
        f"dhcp-boot=tag:!ipxe,tag:efi64,{UEFI_BOOT_FILE}",
        f"dhcp-boot=tag:!ipxe,tag:!efi64,{BIOS_BOOT_FILE}",
        f"dhcp-boot=tag:ipxe,{_script_url()}",
        "# One line per host: boot MAC, name and, while its claim holds one, its address (IPAM).",
        *entries,
    ]
    return "\n".join(lines) + "\n"
