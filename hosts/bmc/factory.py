"""The one place that makes a BMC client: from a host's address, credentials and TLS setting, with the
console's timeouts."""
from django.conf import settings

from .client import BMC, parse_address
from .ipmi import IpmiBMC


def bmc_client(address: str, username: str, password: str, *, verify_tls: bool, boot_mac: str | None,
               timeout: float | None = None, retries: int | None = None, kept: bool = False) -> BMC | IpmiBMC:
    """The client for the address's scheme: Redfish (BMC) or IPMI (IpmiBMC), one interface. `kept`: reuse this
    worker's session with the BMC (a flow's power step polls it every few seconds). `timeout` defaults to
    BMC_TIMEOUT_S; `retries` to the client's own. An address the console cannot drive: BMCError("unsupported")."""
    options = {"verify_tls": verify_tls, "timeout": settings.BMC_TIMEOUT_S if timeout is None else timeout,
               "boot_mac": boot_mac, **({"retries": retries} if retries is not None else {})}
    kind = IpmiBMC if parse_address(address)[0] == "ipmi" else BMC
    make = kind.kept if kept else kind
    return make(address, username, password, **options)


def host_bmc(host, *, kept: bool = False, timeout: float | None = None,
             retries: int | None = None) -> BMC | IpmiBMC:
    """The host's BMC client (`host`: a BareMetalHost)."""
    return bmc_client(host.bmc_address, host.bmc_username, host.bmc_password,
                      verify_tls=not host.bmc_disable_certificate_verification, boot_mac=host.boot_mac,
                      timeout=timeout, retries=retries, kept=kept)
