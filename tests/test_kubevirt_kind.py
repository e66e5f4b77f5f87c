"""The kubeVirt kind against the lab's KubeVirt cluster and a tenant's API: a claim's VirtualMachine, DataVolume and
cloud-init Secret made as KubeVirt and CDI read them, the VM booting and joining the tenant as the node the join
names, power through the run strategy, release until every object is gone; the template merges; bad inputs
refused before anything is made."""
import base64
import json

import pytest
from conftest import wait_for as wait
import yaml

from claims.models import NodeClaim
from claims.tenant_api import TenantAPI
from lab.kube import TenantAPIServer
from lab.kubevirt import KubeVirtCluster
from machines.choices import DiskProof, MachineState
from machines.kinds import Join, KindError, kind_of
from machines.kinds.kubevirt import deep_merge, vm_template
from machines.models import Machine, ProviderSecret
from pools.models import NodeProvider, NodeType, OSImage, Tenant

pytestmark = pytest.mark.django_db

NS = "vms"
TEMPLATE = {"spec": {"template": {"metadata": {"labels": {"tier": "base"}},
                                  "spec": {"domain": {"cpu": {"cores": 2}, "memory": {"guest": "4Gi"},
                                                      "devices": {"interfaces": [{"name": "default",
                                                                                  "masquerade": {}}]}},
                                           "networks": [{"name": "default", "pod": {}}]}}}}



@pytest.fixture
def kubevirt():
    with KubeVirtCluster("kubevirt") as cluster:
        yield cluster


@pytest.fixture
def tenant_api():
    with TenantAPIServer("alpha") as server:
        yield server


@pytest.fixture
def site(kubevirt, tenant_api):
    """A tenant, a kubeVirt provider whose clusterRef names the lab cluster's kubeconfig, a NodeType, an OSImage."""
    tenant = Tenant.objects.create(name="alpha", api_endpoint=tenant_api.endpoint, kubeconfig=tenant_api.kubeconfig())
    ProviderSecret.objects.create(name="kubevirt-cluster", contents=json.dumps({"kubeconfig": kubevirt.kubeconfig()}))
    provider = NodeProvider.objects.create(name="kubevirt", kind="kubeVirt", config={
        "clusterRef": {"cluster": "kubevirt-cluster", "namespace": NS}, "virtualMachineTemplate": TEMPLATE})
    node_type = NodeType.objects.create(name="vm-small", provider=provider, resources={"cpu": "2", "memory": "4Gi"},
                                        provider_config={"maxCapacity": 3})
    OSImage.objects.create(name="ubuntu-vm", url="https://images.example/ubuntu.qcow2", checksum="0" * 64,
                           properties={"kubevirt.vcluster.com/image-url": "https://images.example/ubuntu.qcow2",
                                       "kubevirt.vcluster.com/root-disk-size": "20Gi"})
    return type("Site", (), {"tenant": tenant, "provider": provider, "node_type": node_type})


def machine_for(site, name: str = "one-vc4vs", image: str = "ubuntu-vm", node_type=None) -> Machine:
    node_type = node_type or site.node_type
    claim = NodeClaim.objects.create(name=name, tenant=site.tenant, provider=site.provider, node_type=node_type,
                                     pool_name="vms", properties={"vcluster.com/os-image": image})
    return Machine.objects.create(claim=claim, provider=site.provider, node_type=node_type, kind="kubeVirt")


def join_for(tenant_api, node_name: str) -> Join:
    """What the reconcile hands the kind: a bootstrap token of the tenant and cloud-init with its join."""
    api = TenantAPI(tenant_api.kubeconfig())
    token = api.create_bootstrap_token()
    command, _ = api.join("vcluster", tenant_api.endpoint, token.token)
    user_data = "#cloud-config\n" + yaml.safe_dump({"hostname": node_name, "runcmd": [command]}, sort_keys=False)
    return Join(user_data=user_data, node_name=node_name, token_id=token.id)


def node_ready(tenant_api, name: str) -> str | None:
    node = TenantAPI(tenant_api.kubeconfig()).get_node(name)
    return next((c["status"] for c in (node or {}).get("status", {}).get("conditions", []) if c["type"] == "Ready"),
                None)


def kind():
    return kind_of(NodeProvider(kind="kubeVirt"))


def test_a_claims_vm_is_made_runs_joins_the_tenant_powers_off_and_on_reboots_and_is_released(site, kubevirt,
                                                                                              tenant_api):
    machine = machine_for(site)
    kind().fill(machine, join_for(tenant_api, "alpha-vms-1"))
    machine.save()
    assert (machine.namespace, machine.name) == (NS, "one-vc4vs")
    assert [m["kind"] for m in machine.made] == ["Secret", "DataVolume", "VirtualMachine"]

    [vm] = kubevirt.vms(NS)
    assert vm["spec"]["runStrategy"] == "Always" and "running" not in vm["spec"]
    assert vm["metadata"]["labels"]["vcluster.com/node-claim"] == "one-vc4vs"
    vmi_spec = vm["spec"]["template"]["spec"]
    assert vmi_spec["hostname"] == "alpha-vms-1"
    assert {"name": "rootdisk", "dataVolume": {"name": "one-vc4vs-root"}} in vmi_spec["volumes"]
    assert {"name": "cloudinitdisk", "cloudInitNoCloud": {"secretRef": {"name": "one-vc4vs-cloud-init"}}} in \
        vmi_spec["volumes"]
    assert [d["name"] for d in vmi_spec["domain"]["devices"]["disks"]] == ["rootdisk", "cloudinitdisk"]
    assert vmi_spec["networks"] == [{"name": "default", "pod": {}}]  # the provider's template kept
    [dv] = kubevirt.data_volumes(NS)
    assert dv["spec"]["source"] == {"http": {"url": "https://images.example/ubuntu.qcow2"}}
    assert dv["spec"]["storage"]["resources"]["requests"]["storage"] == "20Gi"
    [seed] = [s for s in kubevirt.objects("secrets", NS)]
    user_data = base64.b64decode(seed["data"]["userdata"]).decode()
    assert user_data.startswith("#cloud-config") and f"{tenant_api.endpoint}/node/join?token=" in user_data

    running = wait(lambda: (p := kind().progress(machine)).state == MachineState.RUNNING and p)
    assert running.node_name == "alpha-vms-1"
    assert wait(lambda: node_ready(tenant_api, "alpha-vms-1") == "True")
    assert wait(lambda: kubevirt.vms(NS)[0].get("status", {}).get("printableStatus") == "Running")

    kind().power(machine, "off")
    [vm] = kubevirt.vms(NS)
    assert vm["spec"]["runStrategy"] == "Halted"
    wait(lambda: not kubevirt.vmis(NS))
    assert wait(lambda: node_ready(tenant_api, "alpha-vms-1") == "Unknown")
    assert wait(lambda: kind().progress(machine).state == MachineState.STOPPED)

    kind().power(machine, "on")
    assert kubevirt.vms(NS)[0]["spec"]["runStrategy"] == "Always"
    wait(lambda: kind().progress(machine).state == MachineState.RUNNING)
    assert wait(lambda: node_ready(tenant_api, "alpha-vms-1") == "True")

    [before] = kubevirt.vmis(NS)
    kind().power(machine, "reboot")
    wait(lambda: [v for v in kubevirt.vmis(NS) if v["metadata"]["uid"] != before["metadata"]["uid"]
                  and v.get("status", {}).get("phase") == "Running"])
    wait(lambda: kind().progress(machine).state == MachineState.RUNNING)
    assert wait(lambda: node_ready(tenant_api, "alpha-vms-1") == "True")
    wait(lambda: len([j for j in kubevirt.joins if j["node"] == "alpha-vms-1" and not j["error"]]) == 3)

    assert wait(lambda: kind().release(machine))
    assert not kubevirt.vms(NS) and not kubevirt.vmis(NS) and not kubevirt.data_volumes(NS)
    assert not kubevirt.objects("secrets", NS)
    assert kind().release(machine)  # again: still gone, nothing to do
    assert kind().disk_proof(machine) == DiskProof.DESTROYED


def test_fill_again_makes_nothing_twice_and_gives_the_seed_the_newest_join(site, kubevirt, tenant_api):
    machine = machine_for(site)
    kind().fill(machine, join_for(tenant_api, "alpha-vms-1"))
    second = join_for(tenant_api, "alpha-vms-1")
    kind().fill(machine, second)
    assert len(kubevirt.vms(NS)) == len(kubevirt.data_volumes(NS)) == len(kubevirt.objects("secrets", NS)) == 1
    [seed] = kubevirt.objects("secrets", NS)
    assert base64.b64decode(seed["data"]["userdata"]).decode() == second.user_data


def test_a_docker_image_becomes_a_registry_source(site, kubevirt, tenant_api):
    OSImage.objects.create(name="fedora-vm", url="https://unused.example/x", checksum="0" * 64,
                           properties={"kubevirt.vcluster.com/image-url": "docker://quay.io/containerdisks/fedora:41",
                                       "kubevirt.vcluster.com/root-disk-size": "10Gi"})
    kind().fill(machine_for(site, image="fedora-vm"), join_for(tenant_api, "alpha-vms-2"))
    [dv] = kubevirt.data_volumes(NS)
    assert dv["spec"]["source"] == {"registry": {"url": "docker://quay.io/containerdisks/fedora:41"}}


def test_a_node_type_merges_into_the_provider_template_or_replaces_it(site, kubevirt, tenant_api):
    merged = NodeType.objects.create(name="vm-big", provider=site.provider, provider_config={
        "mergeVirtualMachineTemplate": {"metadata": {"labels": {"size": "big"}},
                                        "spec": {"template": {"spec": {"domain": {"cpu": {"cores": 8}}}}}}})
    kind().fill(machine_for(site, "big-1", node_type=merged), join_for(tenant_api, "big-1"))
    [vm] = kubevirt.vms(NS)
    domain = vm["spec"]["template"]["spec"]["domain"]
    assert domain["cpu"] == {"cores": 8} and domain["memory"] == {"guest": "4Gi"}  # merged, the rest kept
    assert vm["metadata"]["labels"]["size"] == "big" and vm["spec"]["template"]["metadata"]["labels"]["tier"] == "base"

    own = {"spec": {"template": {"spec": {"domain": {"cpu": {"cores": 1}, "memory": {"guest": "1Gi"}}}}}}
    replaced = NodeType.objects.create(name="vm-own", provider=site.provider,
                                       provider_config={"virtualMachineTemplate": own})
    template = vm_template(site.provider, replaced)
    assert template == own and "networks" not in template["spec"]["template"]["spec"]
    assert deep_merge({"a": {"b": [1], "c": 1}}, {"a": {"b": [2]}}) == {"a": {"b": [2], "c": 1}}  # lists replace
    assert deep_merge({"a": {"b": 1, "c": 1}}, {"a": {"b": None}}) == {"a": {"c": 1}}  # null removes


def test_progress_follows_the_import_and_a_failed_import_fails_the_machine(site, kubevirt, tenant_api):
    kubevirt.import_s = 1.0
    machine = machine_for(site)
    kind().fill(machine, join_for(tenant_api, "alpha-vms-1"))
    importing = wait(lambda: (p := kind().progress(machine)).details.get("dataVolume") == "ImportInProgress" and p)
    assert importing.state == MachineState.CREATING and "importing the root disk (ImportInProgress" in importing.message

    OSImage.objects.create(name="broken", url="https://images.example/missing.qcow2", checksum="0" * 64,
                           properties={"kubevirt.vcluster.com/root-disk-size": "20Gi"})
    kubevirt.fail_import("https://images.example/missing.qcow2")
    broken = machine_for(site, "broken-1", image="broken")
    kind().fill(broken, join_for(tenant_api, "broken-1"))
    failed = wait(lambda: (p := kind().progress(broken)).state == MachineState.FAILED and p)
    assert "the root disk's import failed (DataVolume vms/broken-1-root): " in failed.message
    assert "404" in failed.message


def test_a_vm_deleted_behind_the_consoles_back_fails_the_machine(site, kubevirt, tenant_api):
    machine = machine_for(site)
    kind().fill(machine, join_for(tenant_api, "alpha-vms-1"))
    from kubernetes import client

    from lab.kube import _api_client, _close
    api = _api_client(kubevirt.endpoint, kubevirt.token)
    try:
        client.CustomObjectsApi(api).delete_namespaced_custom_object("kubevirt.io", "v1", NS, "virtualmachines",
                                                                     "one-vc4vs")
    finally:
        _close(api)
    progress = kind().progress(machine)
    assert progress.state == MachineState.FAILED
    assert progress.message == "VirtualMachine vms/one-vc4vs is gone: it was deleted outside the console"


def test_the_virtual_cluster_strategy_uses_the_tenants_namespace_when_the_cluster_has_it(site, kubevirt, tenant_api):
    site.provider.config = {**site.provider.config, "namespaceStrategy": "VirtualCluster"}
    site.provider.save()
    first = machine_for(site)
    kind().fill(first, join_for(tenant_api, "alpha-vms-1"))
    assert first.namespace == NS  # no such namespace there: clusterRef.namespace

    from kubernetes import client

    from lab.kube import _api_client, _close
    api = _api_client(kubevirt.endpoint, kubevirt.token)
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "loft-default-v-alpha"}})
    finally:
        _close(api)
    second = machine_for(site, "two-vc4vs")
    kind().fill(second, join_for(tenant_api, "alpha-vms-2"))
    assert second.namespace == "loft-default-v-alpha"
    assert [vm["metadata"]["name"] for vm in kubevirt.vms("loft-default-v-alpha")] == ["two-vc4vs"]


def test_capacity_is_the_node_types_max_capacity_over_the_providers(site):
    assert kind().capacity(site.node_type) == 3
    unlimited = NodeType.objects.create(name="vm-any", provider=site.provider)
    assert kind().capacity(unlimited) is None
    site.provider.config = {**site.provider.config, "maxCapacity": 7}
    site.provider.save()
    assert kind().capacity(NodeType.objects.get(name="vm-any")) == 7


def nothing_made(kubevirt) -> bool:
    return not kubevirt.vms() and not kubevirt.data_volumes() and not kubevirt.objects("secrets", NS)


def test_an_image_without_a_root_disk_size_is_refused_before_anything_is_made(site, kubevirt, tenant_api):
    OSImage.objects.create(name="sizeless", url="https://images.example/u.qcow2", checksum="0" * 64, properties={})
    machine = machine_for(site, image="sizeless")
    with pytest.raises(KindError) as refused:
        kind().fill(machine, join_for(tenant_api, "alpha-vms-1"))
    assert refused.value.retry is False
    assert refused.value.message == ("OS image sizeless: no kubevirt.vcluster.com/root-disk-size (on the OS image or "
                                     "the node type), which the VM's root disk needs, e.g. 20Gi")
    assert nothing_made(kubevirt) and machine.made == []

    site.node_type.properties = {"kubevirt.vcluster.com/root-disk-size": "30Gi"}  # the node type may give it
    site.node_type.save()
    kind().fill(machine_for(site, "two-vc4vs", image="sizeless"), join_for(tenant_api, "alpha-vms-2"))
    [dv] = kubevirt.data_volumes(NS)
    assert dv["spec"]["storage"]["resources"]["requests"]["storage"] == "30Gi"


def test_an_image_url_that_is_neither_http_nor_docker_is_refused(site, kubevirt, tenant_api):
    OSImage.objects.create(name="local", url="file:///srv/u.img", checksum="0" * 64,
                           properties={"kubevirt.vcluster.com/root-disk-size": "20Gi"})
    with pytest.raises(KindError, match="kubevirt.vcluster.com/image-url must be an http"):
        kind().fill(machine_for(site, image="local"), join_for(tenant_api, "alpha-vms-1"))
    with pytest.raises(KindError, match="OS image nowhere not found"):
        kind().fill(machine_for(site, "two-vc4vs", image="nowhere"), join_for(tenant_api, "alpha-vms-2"))
    assert nothing_made(kubevirt)


def test_no_kubeconfig_secret_is_refused_with_where_it_should_be(site, kubevirt, tenant_api):
    ProviderSecret.objects.all().delete()
    with pytest.raises(KindError) as refused:
        kind().fill(machine_for(site), join_for(tenant_api, "alpha-vms-1"))
    assert refused.value.retry is False
    assert refused.value.message == ("provider kubevirt: no kubeconfig for cluster kubevirt-cluster (a Secret "
                                     "kubevirt-cluster in vcluster-platform with key kubeconfig)")
    assert nothing_made(kubevirt)


def test_an_unreachable_cluster_is_an_error_worth_retrying(site, kubevirt, tenant_api):
    machine = machine_for(site)
    join = join_for(tenant_api, "alpha-vms-1")
    kubevirt.stop()
    with pytest.raises(KindError) as refused:
        kind().fill(machine, join)
    assert refused.value.retry is True
    assert refused.value.message.startswith("KubeVirt cluster of provider kubevirt unreachable (create Secret vms/")
    assert kubevirt.token not in refused.value.message
    kubevirt.start(keep_objects=True)
    assert nothing_made(kubevirt)


def test_a_namespace_strategy_it_does_not_know_or_no_namespace_is_refused(site, kubevirt, tenant_api):
    site.provider.config = {**site.provider.config, "namespaceStrategy": "PerNode"}
    site.provider.save()
    with pytest.raises(KindError, match="namespaceStrategy 'PerNode' is not one of Provider, VirtualCluster"):
        kind().fill(machine_for(site), join_for(tenant_api, "alpha-vms-1"))
    site.provider.config = {**site.provider.config, "namespaceStrategy": "Provider",
                            "clusterRef": {"cluster": "kubevirt-cluster"}}
    site.provider.save()
    with pytest.raises(KindError, match="provider kubevirt: no clusterRef.namespace to make its VirtualMachines in"):
        kind().fill(machine_for(site, "two-vc4vs"), join_for(tenant_api, "alpha-vms-2"))
    assert nothing_made(kubevirt)
