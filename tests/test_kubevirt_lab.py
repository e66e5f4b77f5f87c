"""The lab's KubeVirt cluster as a client sees it: DataVolumes import (or fail on an image URL answering 404), a
VirtualMachine gets its VirtualMachineInstance only once its disk is imported, the guest joins the tenant its
cloud-init names, and a VM deleted takes its VMI and its node's kubelet with it."""
import http.server
import threading
import time

import pytest
from conftest import wait_for as wait
import yaml
from kubernetes import client

from claims.tenant_api import TenantAPI
from lab.kube import TenantAPIServer, _api_client, _close
from lab.kubevirt import KubeVirtCluster

NS = "vms"



@pytest.fixture
def kubevirt():
    with KubeVirtCluster("kubevirt", check_urls=True) as cluster:
        api = _api_client(cluster.endpoint, cluster.token)
        cluster.custom, cluster.core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        yield cluster
        _close(api)


@pytest.fixture
def tenant_api():
    with TenantAPIServer("alpha") as server:
        yield server


@pytest.fixture
def image_server():
    """An image server: /ok.img answers 200, anything else 404."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/ok.img" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def make_vm(cluster, name: str, url: str, user_data: str = "#cloud-config\n{}\n") -> None:
    cluster.core.create_namespaced_secret(NS, {"metadata": {"name": f"{name}-seed"},
                                               "stringData": {"userdata": user_data}})
    cluster.custom.create_namespaced_custom_object("cdi.kubevirt.io", "v1beta1", NS, "datavolumes", {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": {"name": f"{name}-root"},
        "spec": {"source": {"http": {"url": url}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}})
    cluster.custom.create_namespaced_custom_object("kubevirt.io", "v1", NS, "virtualmachines", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "hostname": name, "domain": {"cpu": {"cores": 2}, "memory": {"guest": "2Gi"}, "devices": {}},
            "volumes": [{"name": "rootdisk", "dataVolume": {"name": f"{name}-root"}},
                        {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": f"{name}-seed"}}}]}}}})


def status(objects: list[dict], name: str) -> dict:
    return next((o.get("status") or {} for o in objects if o["metadata"]["name"] == name), {})


def test_an_image_url_answering_404_fails_its_data_volume_and_the_vm_never_starts(kubevirt, image_server):
    make_vm(kubevirt, "bad", f"{image_server}/missing.img")
    failed = wait(lambda: status(kubevirt.data_volumes(NS), "bad-root").get("phase") == "Failed"
                  and status(kubevirt.data_volumes(NS), "bad-root"))
    assert "expected status code 200, got 404" in failed["conditions"][0]["message"]
    assert wait(lambda: status(kubevirt.vms(NS), "bad").get("printableStatus") == "DataVolumeError")
    assert not kubevirt.vmis(NS)


def test_a_slow_import_reports_its_progress_and_the_vmi_waits_for_it(kubevirt, image_server):
    kubevirt.import_s = 1.5
    make_vm(kubevirt, "slow", f"{image_server}/ok.img")
    seen, deadline = set(), time.monotonic() + 10
    while (dv := status(kubevirt.data_volumes(NS), "slow-root")).get("phase") != "Succeeded":
        seen.add((dv.get("phase"), dv.get("progress")))
        assert not kubevirt.vmis(NS) and time.monotonic() < deadline
        time.sleep(0.05)
    assert {phase for phase, _ in seen} >= {"ImportInProgress"}
    assert len({progress for phase, progress in seen if phase == "ImportInProgress"}) > 1
    assert wait(lambda: status(kubevirt.vmis(NS), "slow").get("phase") == "Running")
    assert wait(lambda: status(kubevirt.vms(NS), "slow").get("printableStatus") == "Running")


def test_the_guest_joins_the_tenant_its_cloud_init_names_and_a_deleted_vm_takes_its_vmi_and_kubelet(
        kubevirt, tenant_api, image_server):
    api = TenantAPI(tenant_api.kubeconfig())
    token = api.create_bootstrap_token()
    command, _ = api.join("vcluster", tenant_api.endpoint, token.token)
    make_vm(kubevirt, "vm-1", f"{image_server}/ok.img", "#cloud-config\n" + yaml.safe_dump({"runcmd": [command]}))
    # the kubelet registers the node, then posts its status
    node = wait(lambda: (n := api.get_node("vm-1")) and n.get("status", {}).get("capacity") and n)
    assert node["status"]["capacity"]["cpu"] == "2" and node["status"]["capacity"]["memory"] == "2Gi"
    [vmi] = kubevirt.vmis(NS)
    assert vmi["metadata"]["ownerReferences"][0]["kind"] == "VirtualMachine"
    assert vmi["status"]["phase"] == "Running" and vmi["status"]["nodeName"] == "kubevirt-node-1"

    kubevirt.custom.delete_namespaced_custom_object("kubevirt.io", "v1", NS, "virtualmachines", "vm-1")
    wait(lambda: not kubevirt.vmis(NS))
    ready = wait(lambda: next(c for c in api.get_node("vm-1")["status"]["conditions"] if c["type"] == "Ready")
                 ["status"] == "Unknown")
    assert ready


def test_a_guest_without_a_join_command_runs_and_says_why_it_did_not_join(kubevirt, image_server):
    make_vm(kubevirt, "lonely", f"{image_server}/ok.img", "#cloud-config\nruncmd:\n  - echo hello\n")
    wait(lambda: kubevirt.joins)
    assert kubevirt.joins == [{"vmi": "vms/lonely", "node": "lonely", "endpoint": None,
                               "error": "no join command in the cloud-init user data's runcmd"}]
    assert status(kubevirt.vmis(NS), "lonely")["phase"] == "Running"


@pytest.mark.django_db
def test_the_lab_site_puts_its_kubevirt_clusters_kubeconfig_where_a_providers_cluster_ref_finds_it():
    from lab.site import LabSite
    from machines.clusters import cluster_kubeconfig
    from pools.models import NodeProvider

    site = LabSite(hosts=1, kubevirt=True)
    site.kubevirt.start()
    try:
        site.register_kubevirt()
        provider = NodeProvider(name="kubevirt", kind="kubeVirt", config={"clusterRef": {"cluster": "kubevirt"}})
        assert cluster_kubeconfig(provider) == site.kubevirt.kubeconfig()
    finally:
        site.kubevirt.stop()


def test_qemu_guests_need_the_os_image_and_a_known_guest_kind(tmp_path):
    from lab.vm import VMError

    cluster = KubeVirtCluster("kubevirt", guests="qemu", os_image=tmp_path / "missing.img")
    with pytest.raises(VMError, match="lab OS image"):
        cluster.start()
    assert not cluster.running
    with pytest.raises(ValueError, match="simulated, qemu"):
        KubeVirtCluster("kubevirt", guests="firecracker")


def test_the_lab_command_refuses_qemu_guests_without_its_kubevirt_cluster():
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="add --kubevirt"):
        call_command("lab", "--hosts", "0", "--kubevirt-guests", "qemu")
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("lab", "--hosts", "0", "--kubevirt", "--kubevirt-guests", "firecracker")
