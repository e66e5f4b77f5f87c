"""The seed's "one claim, step by step", end to end in the lab: real Celery worker on the real broker,
sushy-tools BMCs driven through sushy, the agent on file-backed disks, tenant APIs through the official
kubernetes client."""
import base64

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost, EraseCertificate
from hosts.services import host_retry, host_set_maintenance
from lab.site import IMAGE_NAME
from pools.models import NodePool, Tenant
from pools.services import pool_set_quantity, tenant_delete

from .lab_conftest import gpu_pool, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

PROVISION_STEPS = ["power_on_pxe", "agent_lookup", "inspect", "check_tenant_api", "write_image", "write_seed",
                   "reboot_to_disk", "boot_from_disk", "node_ready", "node_labels"]


def nodes(site, tenant):
    return {n["metadata"]["name"]: n for n in site.tenants[tenant].objects("nodes")}


def test_the_seed_scenario_claims_become_available_with_ready_labelled_nodes(
        lab_factory, celery_worker_process, apply, seed_block):
    site = lab_factory(hosts=2, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 2)  # registered, inspected through the agent
    gpu = BareMetalHost.objects.get(name="gpu-01")
    assert len(gpu.inventory["gpus"]) == 8 and gpu.inventory["disks"][0]["type"] == "nvme"
    apply(seed_block, tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=180)
    ready = nodes(site, "one")
    assert set(ready) == {"gpu-01", "cpu-01"}
    assert ready["gpu-01"]["metadata"]["labels"]["workload"] == "gpu"
    assert ready["cpu-01"]["metadata"]["labels"]["workload"] == "cpu"
    assert all(c["status"] == "True" for n in ready.values() for c in n["status"]["conditions"] if c["type"] == "Ready")
    assert set(BareMetalHost.objects.values_list("state", flat=True)) == {"provisioned"}
    assert site.read_disk("gpu-01", 0, 16) == b"VMETAL-LAB-IMAGE"  # the seed's image, on the disk
    claim = NodeClaim.objects.get(pool_name="gpu")
    assert claim.properties["vcluster.com/os-image"] == IMAGE_NAME
    assert {c.ip_address for c in NodeClaim.objects.all()} == {"10.0.0.20", "10.0.0.21"}  # IPAM, from the range
    done = {e.step: e.duration_s for e in Event.objects.filter(claim=claim, kind="step", message="done")}
    assert set(PROVISION_STEPS) <= set(done), done
    assert all(d is not None and d >= 0 for d in done.values())


def test_an_ipmi_host_beside_a_redfish_host_registers_serves_is_released_through_the_gate_and_serves_again(
        lab_factory, celery_worker_process, apply, seed_block):
    site = lab_factory(hosts=2, gpu_hosts=1, tenants=["one"], ipmi_hosts=["cpu-01"])
    assert BareMetalHost.objects.get(name="cpu-01").bmc_address == site.redfish.ipmi_address("cpu-01")
    assert BareMetalHost.objects.get(name="gpu-01").bmc_address.startswith("redfish+http://")
    wait_hosts("available", 2)  # registered and inspected through the agent, each over its own BMC
    assert BareMetalHost.objects.get(name="cpu-01").inventory["disks"]

    apply(seed_block, tenant="one")  # pools gpu and cpu, one node each
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=180)
    assert set(nodes(site, "one")) == {"gpu-01", "cpu-01"}
    assert site.read_disk("cpu-01", 0, 16) == b"VMETAL-LAB-IMAGE"
    # What the IPMI BMC's power-ons booted: the agent over PXE (once), then the installed image from disk.
    boots = [e for e in site.redfish.events() if e["system"] == "cpu-01" and e["power_state"] == "On"]
    assert boots[0]["boot_target"] == "Pxe" and boots[0]["boot_once"] and boots[-1]["boot_target"] == "Hdd"

    for pool in NodePool.objects.filter(tenant__name="one"):
        pool_set_quantity(pool=pool, quantity=0, actor="user:test")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.RELEASED).count() == 2, timeout=240)
    wait_hosts("available", 2)
    assert site.read_disk("cpu-01", 0, 16) != b"VMETAL-LAB-IMAGE"  # purged: content indeterminate
    certificates = list(EraseCertificate.objects.filter(host__name="cpu-01"))
    assert certificates and {c.result for c in certificates} == {"pass"}
    # An IPMI BMC reports no drives: the gate's census is the inventory of record alone.
    census = certificates[0].document["observed_by_console"]["census"]
    assert (census["source"], census["bmc"]) == ("inventory", "no storage reported")

    for pool in NodePool.objects.filter(tenant__name="one"):  # and serves again
        pool_set_quantity(pool=pool, quantity=1, actor="user:test")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=180)
    assert set(nodes(site, "one")) == {"gpu-01", "cpu-01"}
    assert site.read_disk("cpu-01", 0, 16) == b"VMETAL-LAB-IMAGE"


def test_a_released_host_is_drained_cleaned_and_re_imaged_for_another_tenant(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one", "two"])
    wait_hosts("available", 1)
    apply(gpu_pool(1), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(tenant__name="one", phase=ClaimPhase.AVAILABLE).exists(), timeout=180)
    assert "gpu-01" in nodes(site, "one")
    pods = [p for p in site.tenants["one"].objects("pods") if p["spec"].get("nodeName") == "gpu-01"]
    assert pods  # the lab kubelet runs workloads there

    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")
    wait_for(lambda: NodeClaim.objects.filter(tenant__name="one", phase=ClaimPhase.RELEASED).exists(), timeout=180)
    assert "gpu-01" not in nodes(site, "one")  # drained and deleted
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.state == "available"
    # The release gate, in this order and one step after another (each starts after the one before is done),
    # then the host's return to the pool: drain, delete the node, erase, verify, GPU reset, GPU state, health suites.
    gate = ["drain_node", "delete_node", "erase", "verify_erase", "gpu_reset", "gpu_state", "health_dcgm",
            "health_nccl"]
    log = list(Event.objects.filter(host=host, kind="step", data__flow="deprovision", step__in=gate,
                                    message__in=["started", "done"]).order_by("id").values_list("id", "step", "message"))
    assert [(step, message) for _, step, message in log] == [(s, m) for s in gate for m in ("started", "done")], log
    available = Event.objects.filter(host=host, kind="transition", to_state="available").order_by("-id").first()
    assert available.from_state == "deprovisioning" and available.id > log[-1][0]
    assert site.read_disk("gpu-01", 0, 16) != b"VMETAL-LAB-IMAGE"  # purged for whoever comes next

    apply(gpu_pool(1), tenant="two")
    wait_for(lambda: NodeClaim.objects.filter(tenant__name="two", phase=ClaimPhase.AVAILABLE).exists(), timeout=180)
    assert NodeClaim.objects.get(tenant__name="two", phase=ClaimPhase.AVAILABLE).host.name == "gpu-01"
    assert "gpu-01" in nodes(site, "two") and "gpu-01" not in nodes(site, "one")
    assert site.read_disk("gpu-01", 0, 16) == b"VMETAL-LAB-IMAGE"

    # Tenant two deleted while it holds the node: released like a shrinking pool, then the tenant goes.
    assert tenant_delete(tenant=Tenant.objects.get(name="two"), actor="user:test") is False
    wait_for(lambda: not Tenant.objects.filter(name="two").exists(), timeout=180)
    assert "gpu-01" not in nodes(site, "two")
    assert BareMetalHost.objects.get(name="gpu-01").state == "available"
    assert site.read_disk("gpu-01", 0, 16) != b"VMETAL-LAB-IMAGE"


def test_a_worker_killed_mid_provisioning_loses_nothing(lab_factory, celery_worker_process, worker_settings, apply):
    worker_settings["WITH_BEAT"] = "1"  # the periodic re-drive picks up what the dead worker held
    celery_worker_process.kill()
    celery_worker_process.start()
    lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    apply(gpu_pool(1), tenant="one")
    wait_for(lambda: Event.objects.filter(kind="step", step="write_image", message="started").exists(), timeout=60)
    celery_worker_process.kill()  # SIGKILL: no goodbye, tasks unacknowledged
    celery_worker_process.start()
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).exists(), timeout=240)
    assert BareMetalHost.objects.get().state == "provisioned"
    assert NodeClaim.objects.count() == 1
    assert Event.objects.filter(kind="step", step="write_image", message="done").count() == 1


def test_bmc_500_for_a_while_is_retried_then_succeeds(lab_factory, celery_worker_process):
    lab_factory(hosts=1, gpu_hosts=1, faults={"gpu-01": "bmc-500"})
    wait_hosts("available", 1)
    assert not BareMetalHost.objects.filter(state="error").exists()


def test_bmc_down_past_its_deadline_puts_the_host_in_error_and_the_claim_takes_another(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["one"])
    wait_hosts("available", 2)
    site.redfish.set_fault("gpu-01", "bmc-down")
    site.redfish.set_fault("gpu-02", "bmc-down")
    apply(gpu_pool(1), tenant="one")
    wait_hosts("error", 1, timeout=60)
    site.redfish.clear_fault("gpu-01")
    site.redfish.clear_fault("gpu-02")
    failed = BareMetalHost.objects.get(state="error")
    assert "BMC unreachable: connection refused" in failed.error_message
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).exists(), timeout=180)
    claim = NodeClaim.objects.get()
    assert claim.host.name != failed.name and claim.attempts == 2


def test_a_corrupt_image_is_reported_the_host_cleaned_and_the_claim_retried_elsewhere(
        lab_factory, celery_worker_process, apply):
    # While gpu-02 is in maintenance the claim takes gpu-01 again (the only host); once gpu-02 registers, the
    # claim waits for it rather than take gpu-01 again (tests/test_claim_retries.py).
    lab_factory(hosts=2, gpu_hosts=2, tenants=["one"], faults={"gpu-01": "corrupt-image"})
    wait_hosts("available", 2)
    host_set_maintenance(host=BareMetalHost.objects.get(name="gpu-02"), on=True, actor="user:test")  # gpu-01 first
    apply(gpu_pool(1), tenant="one")
    wait_for(lambda: Event.objects.filter(host__name="gpu-01", step="write_image",
                                          message__startswith="failed").exists(), timeout=60)
    failure = Event.objects.filter(host__name="gpu-01", step="write_image", message__startswith="failed").first()
    assert "checksum mismatch" in failure.message
    # Cleaned: read from the Event log, since the claim takes gpu-01 again at once and it is "available" briefly.
    wait_for(lambda: Event.objects.filter(host__name="gpu-01", kind="transition", from_state="deprovisioning",
                                          to_state="available").exists(), timeout=60)
    host_set_maintenance(host=BareMetalHost.objects.get(name="gpu-02"), on=False, actor="user:test")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).exists(), timeout=180)
    assert NodeClaim.objects.get().host.name == "gpu-02"


def test_a_wrong_bmc_password_is_a_clear_error_and_fixing_the_secret_recovers(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1)
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    apply(site.manifests().replace(
        "password: " + base64.b64encode(site.hosts["gpu-01"].password.encode()).decode(),
        "password: d3Jvbmc="))  # "wrong"
    host_set_maintenance(host=host, on=True, actor="user:test")
    host_set_maintenance(host=BareMetalHost.objects.get(), on=False, actor="user:test")  # registers again
    wait_hosts("error", 1, timeout=30)
    assert BareMetalHost.objects.get().error_message == "register failed at bmc_check: BMC rejected credentials (401)"
    apply(site.manifests())  # the right Secret again
    host_retry(host=BareMetalHost.objects.get(), actor="user:test")
    wait_hosts("available", 1)


def test_an_agent_that_crashes_is_noticed_and_the_host_goes_to_error_with_the_reason(
        lab_factory, celery_worker_process):
    lab_factory(hosts=1, gpu_hosts=1, faults={"gpu-01": "agent-crash"})
    wait_hosts("error", 1, timeout=60)
    message = BareMetalHost.objects.get().error_message
    assert message.startswith("inspect failed at inspect: the agent stopped answering"), message


def test_a_redfish_virtualmedia_host_boots_the_agent_from_virtual_media(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1)
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    apply(site.manifests().replace("address: redfish+http://", "address: redfish-virtualmedia+http://"))
    host_set_maintenance(host=host, on=True, actor="user:test")
    host_set_maintenance(host=BareMetalHost.objects.get(), on=False, actor="user:test")
    wait_hosts("available", 1)
    boots = [e for e in site.redfish.events() if e["power_state"] == "On"]
    assert boots[0]["boot_target"] == "Pxe"  # registered first with redfish+http://
    assert boots[-1]["boot_target"] == "Cd" and boots[-1]["virtual_media"]["inserted"]
