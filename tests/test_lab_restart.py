"""A lab restart (another `./bin/run`) keeps its servers' BMC ports, its tenant APIs' and its image server's, so
re-registering them changes nothing in the console and `manage.py export` stays byte-identical; a port taken
in between is given up for a free one, never a failed start. A lab grown by a server keeps every other server's
name, boot MAC and BMC port; shrunk again, it puts the server it no longer simulates in maintenance, saying why."""
import socket

import pytest

from lab.site import LabSite


def addresses(site: LabSite) -> dict:
    return {"bmc": {name: site.redfish.system_address(name) for name in site.hosts},
            "tenants": {name: api.port for name, api in site.tenants.items()},
            "images": [site.image_url(image) for image in site.images]}


def test_a_restarted_lab_has_the_addresses_it_had_and_gives_up_a_taken_port(tmp_path, lab_sites):
    kwargs = {"hosts": 2, "gpu_hosts": 1, "tenants": ["one"], "var_dir": tmp_path / "lab", "disk_bytes": 1 << 20}
    first = lab_sites(**kwargs).start()
    before = addresses(first)
    first.stop()

    second = lab_sites(**kwargs).start()
    assert addresses(second) == before
    taken_port = second.redfish.system_port("gpu-01")
    second.stop()

    with socket.socket() as squatter:  # something else took gpu-01's BMC port meanwhile
        squatter.bind(("127.0.0.1", taken_port))
        squatter.listen()
        third = lab_sites(**kwargs).start()
        try:
            after = addresses(third)
            assert third.redfish.system_port("gpu-01") != taken_port
            assert after["bmc"]["cpu-01"] == before["bmc"]["cpu-01"] and after["tenants"] == before["tenants"]
        finally:
            third.stop()


@pytest.mark.django_db
def test_a_lab_grown_by_a_server_keeps_the_others_and_shrunk_again_says_what_became_of_it(tmp_path, lab_sites):
    from events.models import Event
    from hosts.bmc.factory import host_bmc
    from hosts.choices import HostState
    from hosts.models import BareMetalHost

    kwargs = {"tenants": [], "var_dir": tmp_path / "lab", "disk_bytes": 1 << 20}
    eight = lab_sites(hosts=8, **kwargs).start()
    eight.register()
    before = {h.name: (h.boot_mac, h.bmc_address) for h in BareMetalHost.objects.all()}
    eight.stop()

    nine = lab_sites(hosts=9, **kwargs).start()
    nine.register()  # the issue: "boot MAC 52:54:00:1a:00:06 is already the boot MAC of host cpu-01"
    hosts = {h.name: h for h in BareMetalHost.objects.all()}
    assert len(hosts) == 9 and not [h for h in hosts.values() if h.state == HostState.ERROR]
    assert {name: (h.boot_mac, h.bmc_address) for name, h in hosts.items() if name in before} == before
    for host in hosts.values():  # the lab is alive: every BMC answers, for the server with that boot MAC
        with host_bmc(host, timeout=5) as bmc:
            assert bmc.check()["power_state"], host.name
    grown = hosts["gpu-07"]
    nine.stop()

    eight_again = lab_sites(hosts=8, **kwargs).start()
    lines = eight_again.register()
    gone = BareMetalHost.objects.get(name="gpu-07")
    assert gone.state == HostState.MAINTENANCE
    why = Event.objects.filter(host_id=gone.pk, to_state=HostState.MAINTENANCE).latest("id")
    assert why.message.startswith("the lab no longer simulates this server (it runs 8 servers now)")
    assert "gpu-07: in maintenance: the lab no longer simulates this server (it runs 8 servers now)" in lines
    assert BareMetalHost.objects.exclude(name="gpu-07").filter(state=HostState.MAINTENANCE).count() == 0
    eight_again.stop()

    nine_again = lab_sites(hosts=9, **kwargs).start()  # grown once more: gpu-07 comes back at the port it had
    lines = nine_again.register()
    back = BareMetalHost.objects.get(name="gpu-07")
    assert back.state == HostState.REGISTERING and back.bmc_address == grown.bmc_address
    assert "gpu-07: out of maintenance: the lab simulates it again" in lines
