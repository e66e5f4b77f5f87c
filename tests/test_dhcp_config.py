"""The provisioning network's dnsmasq configuration (`manage.py dhcp-config`), checked by dnsmasq itself."""
import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from claims.models import NodeClaim
from hosts.boot.dhcp import DHCPConfigError, host_entry, ipxe_chain_script, render_config
from hosts.models import BareMetalHost

from .factories import make_hosts, make_pool

DNSMASQ = shutil.which("dnsmasq") or shutil.which("dnsmasq", path="/usr/sbin:/sbin")


def dnsmasq_test(path) -> subprocess.CompletedProcess:
    if DNSMASQ is None:
        pytest.skip("dnsmasq is not installed (Debian: apt-get install dnsmasq-base; .ci/run installs it)")
    return subprocess.run([DNSMASQ, "--test", "-C", str(path)], capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def site(apply):
    apply(Path("demo/site.yaml").read_text())


def write_config(tmp_path, capsys) -> tuple:
    path = tmp_path / "dnsmasq.conf"
    capsys.readouterr()
    call_command("dhcp-config", "--output", str(path))
    return path, path.read_text(), capsys.readouterr().err


@pytest.mark.django_db
def test_dnsmasq_accepts_the_configuration_rendered_for_200_hosts(site, tmp_path, capsys, settings):
    settings.AGENT_BOOT_URL = "http://172.22.0.2:8001"
    settings.DHCP_INTERFACE = "eth1"
    make_hosts(200)
    make_pool("one", 5)
    call_command("reconcile")  # 5 claims hold addresses
    path, text, said = write_config(tmp_path, capsys)
    checked = dnsmasq_test(path)
    assert checked.returncode == 0, checked.stderr + text[:2000]
    assert "syntax check OK" in checked.stderr + checked.stdout
    assert said.strip().endswith("200 host(s)")
    entries = [line for line in text.splitlines() if line.startswith("dhcp-host=")]
    assert len(entries) == 200
    assert "dhcp-host=52:54:00:00:00:07,gpu-00007" in entries
    addresses = dict(NodeClaim.objects.filter(host__isnull=False).values_list("host__boot_mac", "ip_address"))
    assert len(addresses) == 5
    for mac, address in addresses.items():
        assert f",{address}" in next(line for line in entries if line.startswith(f"dhcp-host={mac},"))
    # Firmware PXE gets iPXE over TFTP; iPXE gets the console's per-host script from the agent listener.
    assert "dhcp-boot=tag:!ipxe,tag:!efi64,undionly.kpxe" in text and "dhcp-boot=tag:!ipxe,tag:efi64,ipxe.efi" in text
    assert "dhcp-boot=tag:ipxe,http://172.22.0.2:8001/boot/${mac:hexhyp}.ipxe" in text
    assert "dhcp-match=set:ipxe,175" in text and "dhcp-ignore=tag:!known" in text
    assert "interface=eth1" in text and "bind-dynamic" in text


@pytest.mark.django_db
def test_dnsmasq_refuses_a_broken_configuration(site, tmp_path, capsys):
    make_hosts(2)
    path, text, _ = write_config(tmp_path, capsys)
    path.write_text(text + "dhcp-host=zz:54:00:00:00:99,broken,10.0.0.5\n")  # not a MAC
    assert dnsmasq_test(path).returncode != 0  # the check above can fail


@pytest.mark.django_db
def test_relay_mode_binds_no_interface_and_needs_the_relayed_subnets_netmask(site, tmp_path, capsys, settings):
    make_hosts(3)
    settings.DHCP_RELAY, settings.DHCP_INTERFACE = True, "eth1"
    settings.DHCP_RANGE = "10.20.0.100,10.20.0.200,255.255.255.0,12h"
    settings.DHCP_ROUTER, settings.DHCP_DNS_SERVERS = "10.20.0.1", "10.20.0.2,10.20.0.3"
    path, text, _ = write_config(tmp_path, capsys)
    assert dnsmasq_test(path).returncode == 0
    assert "dhcp-range=10.20.0.100,10.20.0.200,255.255.255.0,12h" in text
    assert "interface=" not in text and "bind-dynamic" not in text
    assert "dhcp-option=option:router,10.20.0.1" in text and "dhcp-option=option:dns-server,10.20.0.2,10.20.0.3" in text
    settings.DHCP_RANGE = "10.20.0.100,10.20.0.200"
    target = tmp_path / "relay.conf"
    with pytest.raises(CommandError, match="with DHCP_RELAY the netmask is required"):
        call_command("dhcp-config", "--output", str(target))
    assert not target.exists()


@pytest.mark.django_db
def test_a_bad_setting_is_refused_with_a_clear_error_and_nothing_written(site, tmp_path, settings):
    settings.DHCP_RANGE = "everything"
    with pytest.raises(CommandError, match="DHCP_RANGE 'everything': expected start,end"):
        call_command("dhcp-config", "--output", str(tmp_path / "x.conf"))
    settings.DHCP_RANGE = "172.22.0.100,172.22.0.200"
    settings.DHCP_ROUTER = "gateway"
    with pytest.raises(CommandError, match="DHCP_ROUTER 'gateway' is not an IPv4 address"):
        call_command("dhcp-config", "--output", str(tmp_path / "x.conf"))
    assert not (tmp_path / "x.conf").exists()


@pytest.mark.django_db
def test_host_entry_names_the_mac_and_the_claims_address_and_none_for_a_retired_host(site):
    make_hosts(3)
    make_pool("one", 1)
    call_command("reconcile")
    claim = NodeClaim.objects.get()
    serving = claim.host
    assert host_entry(serving) == f"dhcp-host={serving.boot_mac},{serving.name},{claim.ip_address}"
    idle = BareMetalHost.objects.exclude(pk=serving.pk).order_by("name").first()
    assert host_entry(idle) == f"dhcp-host={idle.boot_mac},{idle.name}"
    BareMetalHost.objects.filter(pk=idle.pk).update(state="retired")
    idle.refresh_from_db()
    assert host_entry(idle) is None


def test_the_chain_script_for_a_one_boot_file_dhcp_server_chains_to_the_same_per_host_script(settings):
    """QEMU's DHCP (the lab's VMs) gives each server one boot file: an iPXE script chaining where dnsmasq's rule
    for iPXE points."""
    settings.AGENT_BOOT_URL = "http://172.22.0.2:8001"
    dnsmasq_rule = next(line for line in render_config([]).splitlines() if line.startswith("dhcp-boot=tag:ipxe,"))
    script = ipxe_chain_script()
    assert script.startswith("#!ipxe\n")
    assert script.splitlines()[-1] == "chain " + dnsmasq_rule.split(",", 1)[1]
    assert ipxe_chain_script("http://10.0.2.2:9/").splitlines()[-1] == "chain http://10.0.2.2:9/boot/${mac:hexhyp}.ipxe"
    with pytest.raises(DHCPConfigError, match="must be an http:// URL"):
        ipxe_chain_script("tftp://10.0.2.2/")
