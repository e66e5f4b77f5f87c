"""The lab's Metal3 cluster: its controller walks BareMetalHosts through their states as the baremetal-operator
does, and a provisioned host's OS joins the tenant its user data names."""
import base64
import time

import pytest
import yaml
from kubernetes import client

from claims.tenant_api import TenantAPI
from lab.kube import TenantAPIServer
from lab.metal3 import GROUP, PLURAL, VERSION, Metal3LabCluster


@pytest.fixture
def tenant():
    with TenantAPIServer("acme") as server:
        yield server


@pytest.fixture
def cluster(tenant):
    with Metal3LabCluster(tenants=[tenant], clean_s=0.3) as lab:
        yield lab


def eventually(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {check.__doc__ or check}"
        time.sleep(0.02)


def node(tenant, name):
    return next((n for n in tenant.objects("nodes") if n["metadata"]["name"] == name), None)


def ready(tenant, name):
    found = node(tenant, name)
    return found is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in (found.get("status") or {}).get("conditions") or [])


def patch(cluster, name, body):
    api = client.CustomObjectsApi(cluster._api)
    return api.patch_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name, body,
                                              _content_type="application/merge-patch+json")


def provision(cluster, tenant, name, node_name="node-1"):
    """What a console writes: the userData Secret with a join, the image, online."""
    api = TenantAPI(tenant.kubeconfig(), timeout=5)
    token = api.create_bootstrap_token()
    command, _ = api.join("vcluster", tenant.endpoint, token.token)
    user_data = "#cloud-config\n" + yaml.safe_dump({"hostname": node_name, "runcmd": [command]})
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-user-data"},
              "data": {"userData": base64.b64encode(user_data.encode()).decode()}}
    client.CoreV1Api(cluster._api).create_namespaced_secret(cluster.namespace, secret)
    patch(cluster, name, {"spec": {"online": True, "userData": {"name": f"{name}-user-data"},
                                   "image": {"url": "http://images/ubuntu.raw", "checksum": "a" * 64,
                                             "checksumType": "sha256"}}})


def test_a_new_host_registers_is_inspected_and_becomes_available(cluster):
    cluster.add_host("gpu-01", {"role": "gpu"})

    host = cluster.wait_state("gpu-01", "available")

    assert host["status"]["operationalStatus"] == "OK"
    assert host["status"]["poweredOn"] is False
    assert host["status"]["hardware"]["hostname"] == "gpu-01"


def test_a_slow_inspection_holds_the_host_in_inspecting_until_it_ends(cluster):
    cluster.add_host("gpu-01", slow_inspection=True)
    cluster.wait_state("gpu-01", "inspecting")

    time.sleep(0.5)
    assert cluster.host("gpu-01")["status"]["provisioning"]["state"] == "inspecting"

    cluster.slow_inspection.discard("gpu-01")
    cluster.wait_state("gpu-01", "available")


def test_a_provisioned_host_boots_joins_the_tenant_and_follows_power_and_reboot(cluster, tenant):
    cluster.add_host("gpu-01")
    cluster.wait_state("gpu-01", "available")

    provision(cluster, tenant, "gpu-01", node_name="node-1")
    host = cluster.wait_state("gpu-01", "provisioned")

    assert host["status"]["provisioning"]["image"]["url"] == "http://images/ubuntu.raw"
    eventually(lambda: ready(tenant, "node-1"))

    patch(cluster, "gpu-01", {"spec": {"online": False}})
    eventually(lambda: not ready(tenant, "node-1") and not cluster.host("gpu-01")["status"]["poweredOn"])

    patch(cluster, "gpu-01", {"spec": {"online": True}})
    eventually(lambda: ready(tenant, "node-1"))

    boots = cluster.boots["gpu-01"]
    patch(cluster, "gpu-01", {"metadata": {"annotations": {"reboot.metal3.io": ""}}})
    eventually(lambda: "reboot.metal3.io" not in (cluster.host("gpu-01")["metadata"].get("annotations") or {}))
    assert cluster.boots["gpu-01"] == boots + 1
    eventually(lambda: ready(tenant, "node-1"))


def test_clearing_the_image_deprovisions_with_cleaning_and_the_node_stops(cluster, tenant):
    cluster.add_host("gpu-01")
    cluster.wait_state("gpu-01", "available")
    provision(cluster, tenant, "gpu-01")
    cluster.wait_state("gpu-01", "provisioned")
    eventually(lambda: ready(tenant, "node-1"))

    patch(cluster, "gpu-01", {"spec": {"image": None, "userData": None}})
    cluster.wait_state("gpu-01", "deprovisioning")
    started = time.monotonic()
    host = cluster.wait_state("gpu-01", "available")

    assert time.monotonic() - started >= 0.2  # metadata cleaning takes its time
    assert host["status"]["provisioning"].get("image") is None
    assert not ready(tenant, "node-1")


def test_cleaning_disabled_skips_the_wait(tenant):
    with Metal3LabCluster(tenants=[tenant], clean_s=30) as cluster:
        cluster.add_host("gpu-01")
        cluster.wait_state("gpu-01", "available")
        provision(cluster, tenant, "gpu-01")
        cluster.wait_state("gpu-01", "provisioned")

        patch(cluster, "gpu-01", {"spec": {"image": None, "automatedCleaningMode": "disabled"}})

        cluster.wait_state("gpu-01", "available", timeout=5)


def test_a_provisioning_error_is_reported_as_bmo_reports_it_until_the_image_is_cleared(cluster, tenant):
    cluster.add_host("gpu-01")
    cluster.wait_state("gpu-01", "available")
    cluster.fail_provisioning["gpu-01"] = "Image provisioning failed: Deploy step deploy.deploy failed"

    provision(cluster, tenant, "gpu-01")
    status = eventually(lambda: cluster.host("gpu-01")["status"].get("errorType") and cluster.host("gpu-01")["status"])

    assert status["provisioning"]["state"] == "provisioning"
    assert status["errorType"] == "provisioning error"
    assert status["operationalStatus"] == "error"
    assert status["errorMessage"] == "Image provisioning failed: Deploy step deploy.deploy failed"
    assert node(tenant, "node-1") is None

    patch(cluster, "gpu-01", {"spec": {"image": None}})
    host = cluster.wait_state("gpu-01", "available")
    assert host["status"]["errorType"] == "" and host["status"]["operationalStatus"] == "OK"


@pytest.mark.django_db
def test_the_lab_site_declares_its_metal3_cluster_and_the_console_reaches_its_hosts(tmp_path, tenant):
    from lab.site import METAL3_CLUSTER, LabSite
    from machines.kinds import kind_of
    from pools.models import NodeProvider, NodeType

    site = LabSite(hosts=1, gpu_hosts=1, metal3_cluster_hosts=2, var_dir=tmp_path / "lab")
    site.tenants["acme"] = tenant
    site.start_metal3_cluster(step_s=0.02)
    try:
        site.register()

        provider = NodeProvider.objects.get(name=METAL3_CLUSTER)
        node_type = NodeType.objects.get(name=f"{METAL3_CLUSTER}-gpu")
        assert provider.external and provider.config["clusterRef"] == {"cluster": METAL3_CLUSTER,
                                                                       "namespace": "metal3"}
        assert kind_of(provider).capacity(node_type) == 2
        site.metal3.wait_state(f"{METAL3_CLUSTER}-02", "available")
        assert site.metal3.tenants == [tenant]
    finally:
        site.metal3.stop()
