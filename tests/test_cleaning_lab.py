"""The release gate end to end in the lab: planted erase and GPU faults are caught and the host goes to repair,
never to the pool; healthy hosts come back with a certificate per disk and passing health-check runs.
Real Celery worker, real agents on file-backed disks, the lab's fake nvidia-smi / dcgmi / all_reduce_perf /
nvme on the agents' PATH."""
import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun, HostCommand
from pools.models import NodePool, NodeType
from pools.services import pool_set_quantity

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

DISK = 96 * 1024 * 1024  # big enough for the image and the seed, small enough to erase 16 of them quickly


def became_available(name: str) -> bool:
    return Event.objects.filter(host__name=name, kind="transition", to_state="available").exists()


def repair_event(name: str) -> Event:
    return Event.objects.filter(host__name=name, kind="transition", to_state="repair").order_by("-id").first()


def test_every_planted_fault_at_registration_sends_its_host_to_repair_with_the_evidence(
        lab_factory, celery_worker_process):
    faults = {"gpu-01": "erase-skips-region", "gpu-02": "erase-fails:nvme1n1", "gpu-03": "gpu-dcgm-fail:5",
              "gpu-04": "gpu-xid:3", "gpu-05": "gpu-reset-busy:2", "gpu-06": "nccl-slow"}
    lab_factory(hosts=7, gpu_hosts=7, faults=faults, disk_bytes=DISK)
    wait_hosts("repair", 6, timeout=90)
    wait_hosts("available", 1, timeout=30)
    assert BareMetalHost.objects.get(state="available").name == "gpu-07"
    for name in faults:
        assert not became_available(name), f"{name} reached the pool\n{lab_report()}"
    reasons = {name: repair_event(name) for name in faults}

    # erase-skips-region: the erase said it succeeded; the canaries in the untouched quarter did not lie.
    skip = reasons["gpu-01"]
    assert skip.step == "verify_erase" and "canaries survived" in skip.message, skip.message
    bad = EraseCertificate.objects.get(host__name="gpu-01", disk="nvme0n1", result="fail")
    assert bad.document["verification"]["canaries"]["survived"] > 0
    assert EraseCertificate.objects.get(host__name="gpu-01", disk="nvme1n1").result == "pass"
    assert skip.data["evidence"]["certificates"]

    # erase-fails: a registered host may serve any tenant, so its disks are purged: the drive's secure erase fails
    # (the lab's disk answers EIO) and the disk is failed, not passed on.
    fails = reasons["gpu-02"]
    assert fails.step == "erase" and "Input/output error" in fails.message, fails.message
    assert "every NVMe secure erase command failed" in fails.message
    assert EraseCertificate.objects.get(host__name="gpu-02", disk="nvme1n1").result == "fail"

    # GPU faults: the health suite, in DCGM's and nccl-tests' own words.
    dcgm = reasons["gpu-03"]
    assert dcgm.step == "health_dcgm" and "Found 12 faulty memory elements on GPU 5" in dcgm.message
    assert "dcgmi exited 205" in dcgm.message
    run = HealthCheckRun.objects.get(host__name="gpu-03", suite="dcgmi")
    assert run.verdict == "fail" and run.gpus["5"]["status"] == "fail" and run.gpus["0"]["status"] == "pass"
    assert '"DCGM Diagnostic"' in run.raw_output or '"DCGM GPU Diagnostic"' in run.raw_output
    xid = reasons["gpu-04"]
    assert xid.step == "health_dcgm" and "Detected XID 48 for GPU 3" in xid.message and "exited 226" in xid.message
    busy = reasons["gpu-05"]
    assert busy.step == "gpu_reset" and "held by pid 4242" in busy.message
    reset = HealthCheckRun.objects.get(host__name="gpu-05", suite="gpu-reset")
    assert reset.verdict == "fail" and reset.gpus["2"]["held_by"].startswith("pid 4242")
    slow = reasons["gpu-06"]
    assert slow.step == "health_nccl" and "below the threshold 400 GB/s" in slow.message
    nccl = HealthCheckRun.objects.get(host__name="gpu-06", suite="nccl")
    assert nccl.verdict == "fail" and nccl.parsed["busbw_gbps"] < 400 and nccl.raw_json

    # The healthy host: a certificate per disk and passing runs, judged against gpu-server's thresholds.
    good = BareMetalHost.objects.get(name="gpu-07")
    assert set(EraseCertificate.objects.filter(host=good, result="pass").values_list("disk", flat=True)) == {
        "nvme0n1", "nvme1n1"}
    runs = {r.suite: r for r in HealthCheckRun.objects.filter(host=good)}
    assert {s: r.verdict for s, r in runs.items()} == {"gpu-reset": "pass", "gpu-state": "pass", "dcgmi": "pass",
                                                      "nccl": "pass"}
    assert runs["nccl"].thresholds == {"min_busbw_gbps": 400.0}


def test_eight_hosts_released_after_three_broke_exactly_those_three_go_to_repair(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=8, gpu_hosts=8, tenants=["one"], disk_bytes=DISK)
    wait_hosts("available", 8, timeout=120)
    apply(gpu_pool(8), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 8, timeout=120)
    broken = {"gpu-02": "gpu-xid:6", "gpu-05": "gpu-dcgm-fail:0", "gpu-07": "erase-skips-region:nvme1n1"}
    for name, fault in broken.items():  # the hardware breaks while tenant one uses it
        site.set_fault(name, fault)
    # The NodeType's erase settings reach the agent; one host's own policy wins over its NodeType's (for the policy;
    # each disk's method is the plan's).
    NodeType.objects.filter(name="gpu-server").update(erase_concurrency=1, erase_verify_share=0.02)
    BareMetalHost.objects.filter(name="gpu-08").update(cleaning_policy="metadata")
    started = Event.objects.order_by("-id").values_list("id", flat=True).first()
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")
    wait_for(lambda: BareMetalHost.objects.filter(state__in=["available", "repair"]).count() == 8, timeout=150)
    states = dict(BareMetalHost.objects.values_list("name", "state"))
    assert {n for n, s in states.items() if s == "repair"} == set(broken), lab_report()
    assert NodeClaim.objects.filter(phase=ClaimPhase.RELEASED).count() == 8
    for name in set(states) - set(broken):
        host = BareMetalHost.objects.get(name=name)
        erase_done = Event.objects.filter(host=host, id__gt=started, kind="step", step="erase",
                                          message="done").get()  # one release, one erase
        certs = EraseCertificate.objects.filter(host=host, previous_tenant="one")
        assert certs.count() == 2 and all(c.result == "pass" for c in certs), name
        assert all(c.claim_name and c.document["previous_tenant"] == "one" for c in certs)
        release = certs.first().flow_id
        runs = HealthCheckRun.objects.filter(host=host, flow_id=release)
        assert {r.suite for r in runs if r.verdict == "pass"} == {"gpu-reset", "gpu-state", "dcgmi", "nccl"}, name
        method = "metadata" if name == "gpu-08" else "full"
        assert erase_done.data["flow"] == "deprovision" and erase_done.data["policy"]["method"] == method, name
        erase = HostCommand.objects.get(host=host, name="erase", flow_id=release)
        assert (erase.args["method"], erase.args["concurrency"], erase.args["verify"]) == (method, 1, {"share": 0.02})
        # A release to the free pool may hand the host to another tenant: every disk purged whatever the policy
        # (hosts/gate/plan.py), the policy's method only where it is a purge.
        assert [p["methods"] for p in erase.args["plan"]] == [["secure", "full"]] * 2, name
        assert {(c.method, c.method_type) for c in certs} == {("secure", "Purge")}, name
    for name in broken:
        assert repair_event(name).from_state == "deprovisioning"
        assert not Event.objects.filter(host__name=name, id__gt=started, to_state="available").exists()


def test_an_ipmi_hosts_repair_evidence_carries_its_bmcs_system_event_log(lab_factory, celery_worker_process):
    site = lab_factory(hosts=1, gpu_hosts=0, faults={"cpu-01": "erase-fails"}, disk_bytes=DISK, ipmi_hosts=["cpu-01"])
    site.redfish.add_sel("cpu-01", 0x0C, offset=1, sensor=3)  # a memory error its BMC logged, long before the erase
    wait_hosts("repair", 1, timeout=90)
    repaired = repair_event("cpu-01")
    assert repaired.step == "erase" and "Input/output error" in repaired.message, repaired.message
    logged = [(e["sensor_type"], e["sensor"], e["event"]) for e in repaired.data["bmc_event_log"]["entries"]]
    assert ("Memory", 3, "Uncorrectable error") in logged, logged
    assert ("Power Unit", 1, "Power on") in logged, logged  # the BMC's own record of the agent's boot
    # The repair pool's page shows it beside the other evidence.
    from django.contrib.auth.models import User
    from django.test import Client

    page = Client()
    page.force_login(User.objects.create_user("sel-admin", is_staff=True, is_superuser=True))
    row = page.get("/repair/").content.decode().split('<tr id="repair-')[1].split("</tr>")[0]
    assert "BMC event log, newest last:" in row and "Memory #3: Uncorrectable error (asserted)" in row, row
