"""A lab restart (another `./bin/run`) keeps its servers' BMC ports, its tenant APIs' and its image server's, so
re-registering them changes nothing in the console and `manage.py export` stays byte-identical; a port taken
in between is given up for a free one, never a failed start."""
import socket

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
