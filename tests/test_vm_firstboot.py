"""The OS image's first boot (lab/vmguest/firstboot.py) and the image builder's parts, without a VM: the join with
the seed's bootstrap token against a lab tenant API, the network plan from the console's network-config, the seed
found on a disk, the kubeadm CA pin, kernel module order and ELF dependencies."""
from __future__ import annotations

import base64
import datetime
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.seed import build_seed_iso, write_seed_to_disk
from claims.tenant_api import TenantAPI, join_command
from lab import vmimage
from lab.kube import TenantAPIServer
from lab.vmguest import firstboot

MAC = "52:54:00:5e:00:42"


@pytest.fixture
def tenant():
    with TenantAPIServer("one") as server:
        yield server


def test_the_first_boot_joins_with_the_seeds_token_and_keeps_the_node_ready(tenant):
    token = TenantAPI(tenant.kubeconfig(), timeout=5).create_bootstrap_token().token
    spec = firstboot.parse_join(join_command("vcluster", tenant.endpoint, token, scheme="http"))
    assert (spec.mode, spec.scheme, spec.endpoint, spec.token) == ("vcluster", "http", tenant.endpoint, token)
    client = firstboot.TenantClient(spec, timeout=5)
    firstboot.join(client, "vm-one-1", address="10.0.2.50", capacity={"cpu": "2", "memory": "1Gi", "pods": "110"})
    [node] = tenant.objects("nodes")
    [ready] = node["status"]["conditions"]
    assert node["metadata"]["name"] == "vm-one-1" and node["metadata"]["labels"]["kubernetes.io/hostname"] == "vm-one-1"
    assert (ready["type"], ready["status"]) == ("Ready", "True")
    assert {"type": "InternalIP", "address": "10.0.2.50"} in node["status"]["addresses"]
    assert node["status"]["capacity"]["cpu"] == "2"
    # a re-join (the OS rebooted) is no error; a heartbeat moves lastHeartbeatTime, not lastTransitionTime
    firstboot.join(client, "vm-one-1", address="10.0.2.50")
    client.ready_since = "2026-01-01T00:00:00Z"
    firstboot.heartbeat(client, "vm-one-1", every=0, beats=1)
    [beat] = tenant.objects("nodes")[0]["status"]["conditions"]
    assert beat["lastTransitionTime"] == "2026-01-01T00:00:00Z" and beat["lastHeartbeatTime"] > "2026-01-02"


def test_a_token_the_tenant_does_not_know_is_refused_and_the_error_names_no_secret(tenant):
    spec = firstboot.parse_join(join_command("vcluster", tenant.endpoint, "abcdef.0123456789abcdef", scheme="http"))
    with pytest.raises(firstboot.JoinError, match="refused the bootstrap token") as refused:
        firstboot.join(firstboot.TenantClient(spec, timeout=5), "vm-one-1", address=None)
    assert "0123456789abcdef" not in str(refused.value) and "0123456789abcdef" not in repr(spec)
    assert tenant.objects("nodes") == []


def test_an_unreachable_tenant_api_is_a_join_error():
    spec = firstboot.JoinSpec("vcluster", "http", "127.0.0.1:9", "abcdef.0123456789abcdef")
    with pytest.raises(firstboot.JoinError, match="unreachable"):
        firstboot.join(firstboot.TenantClient(spec, timeout=2), "vm-one-1", address=None)


def _ca() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def test_join_commands_are_read_as_the_console_writes_them():
    pem = _ca()
    ca_data = base64.b64encode(pem.encode()).decode()
    token = "abcdef.0123456789abcdef"
    spec = firstboot.parse_join(join_command("vcluster", "api.one.example:443", token, ca_data=ca_data))
    assert (spec.scheme, spec.endpoint, spec.ca_pem) == ("https", "api.one.example:443", pem)
    kubeconfig = yaml.safe_dump({"clusters": [{"name": "one", "cluster": {
        "server": "https://api.one.example:6443", "certificate-authority-data": ca_data}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "one", "context": {
            "cluster": "one", "user": "u"}}], "current-context": "one"})
    pin = TenantAPI(kubeconfig).ca_cert_hash()
    spec = firstboot.parse_join(join_command("kubeadm", "api.one.example:6443", token, pin))
    assert (spec.mode, spec.endpoint, spec.token, spec.ca_hash) == ("kubeadm", "api.one.example:6443", token, pin)
    # kubeadm's discovery trusts the CA it reads only when its key matches the console's pin
    assert firstboot.spki_sha256(pem) == pin
    assert firstboot.spki_sha256(_ca()) != pin
    assert firstboot.parse_join("echo hello") is None
    with pytest.raises(firstboot.JoinError, match="without an endpoint"):
        firstboot.parse_join("kubeadm join api:6443 --token abcdef.0123456789abcdef")


def test_the_network_plan_sets_the_consoles_static_address_or_dhcp():
    config = "# vmetal.dev/fabric-vlan: 42\n" + yaml.safe_dump({"version": 2, "ethernets": {"eth0": {
        "match": {"macaddress": MAC}, "set-name": "eth0", "addresses": ["10.0.2.50/24"],
        "routes": [{"to": "default", "via": "10.0.2.2"}], "nameservers": {"addresses": ["10.0.2.3"]}}},
        "vlans": {"vlan42": {"id": 42, "link": "eth0"}}}, sort_keys=False)
    assert firstboot.network_plan(config, {MAC: "ens3"}) == [
        ["ip", "link", "set", "ens3", "name", "eth0"], ["ip", "link", "set", "eth0", "up"],
        ["ip", "addr", "add", "10.0.2.50/24", "dev", "eth0"], ["ip", "route", "add", "default", "via", "10.0.2.2",
                                                                "dev", "eth0"]]
    assert firstboot.nameservers(config) == ["10.0.2.3"]
    dhcp = yaml.safe_dump({"version": 2, "ethernets": {"eth0": {"match": {"macaddress": MAC}, "dhcp4": True}}})
    assert firstboot.network_plan(dhcp, {MAC: "eth0"})[-1][:3] == ["udhcpc", "-i", "eth0"]
    assert [c[0] for c in firstboot.network_plan(None, {MAC: "eth0"})] == ["ip", "udhcpc"]
    with pytest.raises(ValueError, match="no NIC with MAC"):
        firstboot.network_plan(config, {"52:54:00:00:00:01": "eth0"})
    with pytest.raises(ValueError, match="version 2"):
        firstboot.network_plan(yaml.safe_dump({"version": 1, "config": []}), {MAC: "eth0"})


def test_the_seed_is_found_on_the_disk_that_holds_it(tmp_path):
    sys_block, dev = tmp_path / "sys/block", tmp_path / "dev"
    for name in ("nvme0n1", "nvme1n1", "sr0"):
        (sys_block / name).mkdir(parents=True)
    dev.mkdir()
    (dev / "nvme0n1").write_bytes(b"\0" * (80 << 20))  # no seed
    with open(dev / "nvme1n1", "wb") as fh:
        fh.truncate(128 << 20)
    write_seed_to_disk(str(dev / "nvme1n1"), build_seed_iso("#cloud-config\nruncmd: []\n", "local-hostname: vm\n"))
    disk, seed = firstboot.find_seed(str(sys_block), str(dev))
    assert disk == str(dev / "nvme1n1") and seed["meta-data"] == "local-hostname: vm\n"
    assert firstboot.find_seed(str(tmp_path / "none"), str(dev)) == (None, None)


def test_kernel_modules_load_after_what_they_depend_on(tmp_path):
    for name, depends in (("nvme", "nvme-core"), ("nvme-core", "crc-t10dif"), ("crc-t10dif", ""),
                          ("virtio_net", "net_failover,virtio_ring"), ("net_failover", "failover"), ("failover", ""),
                          ("virtio_ring", "")):
        (tmp_path / f"{name}.ko").write_bytes(b"\x7fELF...\0license=GPL\0depends=" + depends.encode() + b"\0name=x\0")
    order = [p.name for p in vmimage.module_order(["virtio_net", "nvme"], vmimage.module_index(tmp_path))]
    assert order == ["failover.ko", "net_failover.ko", "virtio_ring.ko", "virtio_net.ko", "crc-t10dif.ko",
                     "nvme-core.ko", "nvme.ko"]
    with pytest.raises(vmimage.BuildError, match="kernel module isofs not in the kernel package"):
        vmimage.module_order(["isofs"], vmimage.module_index(tmp_path))


def test_elf_dependencies_are_read_from_the_binary(tmp_path):
    assert "libc.so.6" in vmimage.elf_needed(Path(sys.executable).resolve())
    (tmp_path / "script").write_text("#!/bin/sh\n")
    assert vmimage.elf_needed(tmp_path / "script") is None
