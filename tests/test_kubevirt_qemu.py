"""The lab's KubeVirt cluster with QEMU guests (lab/kubevirt.py, guests="qemu"), as a client sees it, on a disk image
of one boot sector (seconds under TCG, no OS image build): the DataVolume's import makes a qcow2 overlay of the
image, the VMI is a QEMU process booting it with the NoCloud seed on a second disk in the agent's layout, a guest
that powers itself off ends its VMI Succeeded and runStrategy Always starts a new one, Halted kills QEMU, and the
DataVolume's deletion removes the disk. The OS image reading that seed and joining a tenant is
tests/test_providers_e2e.py's QEMU test."""
import os
import shutil
import signal
import subprocess

import pytest
import yaml
from kubernetes import client

from agent.seed import read_seed
from conftest import wait_for
from lab.kube import _api_client, _close
from lab.kubevirt import KubeVirtCluster

from .test_vm_lab import alive, boot_sector

pytest_plugins = ["tests.vm_conftest"]
pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(not shutil.which("qemu-system-x86_64"),
                       reason="qemu-system-x86_64 is not installed (Debian: qemu-system-x86, qemu-utils)"),
]
NS = "vms"
USER_DATA = "#cloud-config\nhostname: guest-1\nruncmd:\n  - echo hello\n"


@pytest.fixture
def qemu_kubevirt(tmp_path):
    image = tmp_path / "halts.img"
    image.write_bytes(boot_sector(b"KUBEVIRT GUEST BOOTED").ljust(1024 * 1024, b"\0"))
    with KubeVirtCluster("kubevirt", guests="qemu", os_image=image, var_dir=tmp_path / "kubevirt") as cluster:
        api = _api_client(cluster.endpoint, cluster.token)
        cluster.custom, cluster.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        yield cluster
        _close(api)


def make_vm(cluster, name: str, storage: str = "2Gi") -> None:
    cluster.core.create_namespaced_secret(NS, {"metadata": {"name": f"{name}-seed"},
                                               "stringData": {"userdata": USER_DATA}})
    cluster.custom.create_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", NS, "datavolumes", {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": f"{name}-root"},
        "spec": {"source": {"http": {"url": "http://images.lab/os.img"}},
                 "storage": {"resources": {"requests": {"storage": storage}}}}})
    cluster.custom.create_namespaced_custom_object("kubevirt.io", "v1", NS, "virtualmachines", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "hostname": "guest-1", "domain": {"cpu": {"cores": 2}, "memory": {"guest": "4Gi"}, "devices": {}},
            "volumes": [{"name": "rootdisk", "dataVolume": {"name": f"{name}-root"}},
                        {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": f"{name}-seed"}}}]}}}})


def vmi_of(cluster, name: str) -> dict:
    return next((v for v in cluster.vmis(NS) if v["metadata"]["name"] == name), {})


def test_a_vmi_is_a_qemu_process_on_an_overlay_of_the_image_started_again_when_it_ends_and_killed_at_halted(
        qemu_kubevirt):
    cluster = qemu_kubevirt
    make_vm(cluster, "vm-1")
    guest = wait_for(lambda: cluster.guest(NS, "vm-1"), timeout=20)
    first = wait_for(lambda: (v := vmi_of(cluster, "vm-1")) and v["status"]["phase"] == "Running" and v)
    assert guest.running
    assert first["status"]["interfaces"][0] == {"name": "default", "ipAddress": "10.0.2.15", "mac": guest.mac}
    wait_for(lambda: "KUBEVIRT GUEST BOOTED" in guest.console_text(), timeout=60, interval=0.2)
    # The lab caps what TCG is asked for: one vCPU, 1 GiB, whatever the domain says.
    argv = guest.command(boot="Hdd", once=False, cd=False)
    assert argv[argv.index("-smp") + 1] == "1" and argv[argv.index("-m") + 1] == "1024"
    # The root disk: a qcow2 overlay of the cluster's image, as large as the DataVolume asked.
    [disk] = cluster.disks()
    info = yaml.safe_load(subprocess.run(["qemu-img", "info", "-U", "--output=json", str(disk)], capture_output=True,
                                         text=True, check=True).stdout)
    assert info["format"] == "qcow2" and info["virtual-size"] == 2 * 1024**3
    assert info["backing-filename"].endswith("halts.img")
    # The seed: the agent's layout, so the OS image reads it as on a server; meta-data as KubeVirt writes it.
    seed = read_seed(str(guest.seed_disk))
    assert seed["user-data"] == USER_DATA and seed["network-config"] is None
    assert yaml.safe_load(seed["meta-data"]) == {"instance-id": "vm-1.vms", "local-hostname": "guest-1"}

    # QEMU ends cleanly (as when its guest powers off): the VMI Succeeded, and runStrategy Always makes a new one.
    pid = guest.proc.pid
    guest.proc.stdin.write(b"quit\n")
    guest.proc.stdin.flush()
    wait_for(lambda: vmi_of(cluster, "vm-1").get("status", {}).get("phase") == "Succeeded", timeout=20)
    assert not alive(pid)
    second = wait_for(lambda: (v := vmi_of(cluster, "vm-1")) and v["metadata"]["uid"] != first["metadata"]["uid"]
                      and v.get("status", {}).get("phase") == "Running" and v, timeout=30)
    # QEMU dies: the VMI Failed, the VM in CrashLoopBackOff until KubeVirt's back-off starts it again.
    guest = cluster.guest(NS, "vm-1")
    os.kill(guest.proc.pid, signal.SIGKILL)
    failed = wait_for(lambda: (v := vmi_of(cluster, "vm-1")) and v["status"]["phase"] == "Failed" and v, timeout=20)
    assert failed["metadata"]["uid"] == second["metadata"]["uid"]
    assert failed["status"]["conditions"][0]["message"] == "QEMU exited -9"
    wait_for(lambda: cluster.vms(NS)[0]["status"]["printableStatus"] == "CrashLoopBackOff", timeout=10)
    wait_for(lambda: (v := vmi_of(cluster, "vm-1")) and v["metadata"]["uid"] not in
             (first["metadata"]["uid"], second["metadata"]["uid"]) and v["status"]["phase"] == "Running", timeout=30)
    assert cluster.disks() == [disk]

    # Halted: the VMI goes and its QEMU with it (whenever it is caught running).
    cluster.custom.patch_namespaced_custom_object("kubevirt.io", "v1", NS, "virtualmachines", "vm-1",
                                                  {"spec": {"runStrategy": "Halted"}})
    wait_for(lambda: not cluster.vmis(NS) and cluster.guest(NS, "vm-1") is None, timeout=20)
    wait_for(lambda: next(v for v in cluster.vms(NS))["status"]["printableStatus"] == "Stopped", timeout=10)
    assert disk.exists()

    # The VM and its DataVolume deleted: the disk goes.
    cluster.custom.delete_namespaced_custom_object("kubevirt.io", "v1", NS, "virtualmachines", "vm-1")
    cluster.custom.delete_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", NS, "datavolumes", "vm-1-root")
    wait_for(lambda: not disk.exists() and cluster.disks() == [], timeout=10)
    assert not list((cluster.var_dir / "guests").glob("*/cloudinitdisk.img"))  # the seed disks went with the VMIs



def test_a_data_volume_asking_for_an_unreadable_size_fails_its_import_and_no_disk_or_qemu_is_made(qemu_kubevirt):
    cluster = qemu_kubevirt
    make_vm(cluster, "bad", storage="lots")
    failed = wait_for(lambda: (dv := next(iter(cluster.data_volumes(NS)), {}).get("status") or {})
                      .get("phase") == "Failed" and dv)
    assert failed["conditions"][0]["message"].startswith("storage request:")
    wait_for(lambda: cluster.vms(NS)[0].get("status", {}).get("printableStatus") == "DataVolumeError")
    assert not cluster.vmis(NS) and cluster.guest(NS, "bad") is None and cluster.disks() == []


def test_the_lab_site_runs_its_kubevirt_cluster_with_qemu_guests_of_the_os_image_it_built(images, tmp_path):
    from lab import vmimage
    from lab.site import LabSite

    site = LabSite(hosts=0, tenants=["one"], kubevirt=True, kubevirt_guests="qemu", var_dir=tmp_path / "lab")
    site.start()
    try:
        assert site.kubevirt.running and site.kubevirt.guests == "qemu"
        assert site.kubevirt.os_image == images.path(vmimage.OS_IMAGE)  # the build's cache, not built again
        assert site.kubevirt.var_dir == tmp_path / "lab" / "kubevirt"
        assert (site.kubevirt.var_dir / "images" / vmimage.OS_IMAGE).stat().st_size == \
            images.path(vmimage.OS_IMAGE).stat().st_size
    finally:
        site.stop()
    assert not site.kubevirt.running
