"""GPUs handed over as the next tenant expects them: the release gate's gpu_state step brings every GPU back to its
NodeType's state (MIG layout, persistence mode; clocks and power limit at their defaults), reads ECC and row
remapping into the health run, and the console judges what was read back. The agent's command is run against the
lab's nvidia-smi; the protocol refuses a malformed or forged report; in the lab, a tenant that left MIG enabled is
reset at release, and a reset that fails sends the host to repair with the reason."""
import json

import pytest
from django.core.management.base import CommandError as ManageCommandError

from agent.commands import gpu as agent_gpu
from agent.commands.base import Context
from agent.commands.registry import execute
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import DEMO, wait_for
from events.models import Event
from hosts.gate import gpu_state
from hosts.models import BareMetalHost, CommandStatus, HealthCheckRun, HostCommand
from hosts.services import host_transition
from lab.fake_tools import install
from lab.hardware import LabHardware
from manifests.export import export_text
from pools.gpu import node_type_gpu
from pools.models import NodePool, NodeType
from pools.services import pool_set_quantity

from .factories import boot, lookup, post
from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
DISK = 96 * 1024 * 1024
NO_MIG = {"mig": False, "migLayout": [], "persistenceMode": True}
TENANT_LEFT = {"mig_current": "Enabled", "mig_pending": "Enabled", "instances": ["1g.18gb"] * 3,
               "persistence": "Disabled", "app_graphics": 1500, "app_memory": 2619, "power_limit": 500.0}


def site_with(gpu_yaml: str) -> str:
    """demo/site.yaml with `gpu:` under gpu-server (indented as its other fields)."""
    text = (DEMO / "site.yaml").read_text()
    block = "".join(f"          {line}\n" for line in gpu_yaml.strip("\n").splitlines())
    return text.replace("        displayName: 8x H200 GPU server\n",
                        "        displayName: 8x H200 GPU server\n        gpu:\n" + block, 1)


# --- the NodeType's declared state ------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_declared_mig_layout_and_persistence_mode_are_applied_exported_and_read_by_the_gate(apply, demo_site):
    gpu = NodeType.objects.get(name="gpu-server")
    assert node_type_gpu(gpu) == NO_MIG  # left out: MIG disabled, persistence on
    apply(site_with('migLayout: {"1g.18gb": 4, "3g.71gb": 1}\npersistenceMode: false\n'))
    gpu.refresh_from_db()
    assert node_type_gpu(gpu) == {"mig": True, "migLayout": ["1g.18gb"] * 4 + ["3g.71gb"], "persistenceMode": False}
    assert "1g.18gb: 4" in export_text()
    assert "nodetype/gpu-server unchanged" in apply(site_with('migLayout: {"1g.18gb": 4, "3g.71gb": 1}\n'
                                                              'persistenceMode: false\n'))
    from hosts.gate import cleaning
    assert cleaning.gate_for(BareMetalHost.objects.get(name="gpu-01"))["gpu"]["migLayout"][-1] == "3g.71gb"


@pytest.mark.django_db
@pytest.mark.parametrize("bad, where, message", [
    ("migLayout: [1g.18gb, 9g.9gb]\n", "gpu.migLayout[1]", "'9g.9gb' is not a MIG profile"),
    ("migLayout: {4g.71gb: 2}\n", "gpu.migLayout", "2 instances take 8 compute slices; a GPU has 7"),
    ("migLayout: {1g.18gb: 0}\n", "gpu.migLayout.1g.18gb", "an instance count from 1 to 7"),
    ("migLayout: all-the-things\n", "gpu.migLayout", "none (MIG disabled)"),
    ("migLayout: []\n", "gpu.migLayout", "an empty list: write none"),
    ("persistenceMode: sometimes\n", "gpu.persistenceMode", "must be true or false"),
    ("clocks: max\n", "gpu.clocks", "unknown field; expected migLayout, persistenceMode"),
])
def test_a_bad_gpu_block_is_refused_with_its_place_and_changes_nothing(apply, demo_site, bad, where, message):
    before = list(NodeType.objects.order_by("name").values_list("name", "gpu", "updated_at"))
    with pytest.raises(ManageCommandError) as info:
        apply(site_with(bad), names=["site.yaml"])
    text = str(info.value)
    assert "site.yaml" in text and f"spec.metal3.nodeTypes[0].{where}" in text and message in text, text
    assert list(NodeType.objects.order_by("name").values_list("name", "gpu", "updated_at")) == before


# --- the agent's command on the lab's nvidia-smi, judged by the console ----------------------------------

def lab_gpus(tmp_path, faults=(), state=None) -> LabHardware:
    tools = install(tmp_path / "tools")
    profile = {"gpus": [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "memory_mib": 143771,
                         "pci_bus": f"00000000:{0x18 + i * 16:02X}:00.0"} for i in range(2)],
               "disks": [], "nics": [], "lab": {"faults": [{"kind": k, "gpu": 1} for k in faults], "tools": str(tools)}}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    if state:
        (tmp_path / "gpu-state.json").write_text(json.dumps({"0": state, "1": state}))
    return LabHardware.from_file(tmp_path / "profile.json")


def run_gpu_state(hardware, layout=(), persistence=True):
    return execute("gpu_state", {"expected_gpus": 2, "mig_layout": list(layout), "persistence_mode": persistence},
                   Context(hardware=hardware))


def test_the_agent_and_the_console_ask_nvidia_smi_for_the_same_fields():
    assert agent_gpu.STATE_QUERY.split(",") == list(gpu_state.STATE_FIELDS)
    assert agent_gpu.REMAP_QUERY.split(",") == list(gpu_state.REMAP_FIELDS)


def test_a_tenants_mig_clocks_power_and_persistence_are_reset_and_the_run_shows_before_and_after(tmp_path):
    outcome = run_gpu_state(lab_gpus(tmp_path, state=TENANT_LEFT))
    assert outcome.ok, outcome.error
    commands = [a["command"] for a in outcome.result["actions"]]
    assert commands[:3] == ["nvidia-smi mig -dci -i 0", "nvidia-smi mig -dgi -i 0", "nvidia-smi -i 0 -mig 0"]
    assert {"nvidia-smi -i 0 -rac", "nvidia-smi -i 0 -pl 700.00", "nvidia-smi -i 0 -pm 1"} <= set(commands)
    parsed = gpu_state.judge(outcome.result, expected_gpus=2, want=NO_MIG)
    assert parsed["verdict"] == "pass", parsed["reasons"]
    tests = parsed["gpus"]["0"]["tests"]
    assert tests["MIG"] == "Enabled: 1g.18gb, 1g.18gb, 1g.18gb → Disabled"
    assert tests["persistence"] == "Disabled → Enabled"
    assert tests["application clocks"] == "1500/2619 MHz → 1980/3201 MHz"
    assert tests["power limit"] == "500.0 → 700.0 W" and tests["memory"] == "sound"


def test_a_declared_layout_is_created_and_only_that_layout_passes(tmp_path):
    outcome = run_gpu_state(lab_gpus(tmp_path, state=TENANT_LEFT), layout=["3g.71gb", "2g.35gb", "1g.18gb"])
    assert outcome.ok, outcome.error
    want = {"mig": True, "migLayout": ["1g.18gb", "2g.35gb", "3g.71gb"], "persistenceMode": True}
    parsed = gpu_state.judge(outcome.result, expected_gpus=2, want=want)
    assert parsed["verdict"] == "pass", parsed["reasons"]
    assert parsed["gpus"]["1"]["tests"]["MIG"] == "Enabled: 1g.18gb, 1g.18gb, 1g.18gb → Enabled: 1g.18gb, 2g.35gb, 3g.71gb"
    # The same GPUs judged against MIG disabled: MIG still enabled fails each GPU.
    other = gpu_state.judge(outcome.result, expected_gpus=2, want=NO_MIG)
    assert other["verdict"] == "fail" and "GPU 0: MIG still enabled" in other["reasons"][0]


def test_mig_that_cannot_be_disabled_fails_in_nvidia_smis_words(tmp_path):
    outcome = run_gpu_state(lab_gpus(tmp_path, faults=["mig-busy"], state=TENANT_LEFT))
    assert not outcome.ok and "nvidia-smi -i 1 -mig 0: exit 255" in outcome.error
    assert "In use by another client" in outcome.error
    parsed = gpu_state.judge(outcome.result, expected_gpus=2, want=NO_MIG, failure=outcome.error)
    assert parsed["verdict"] == "fail"
    assert parsed["gpus"]["1"]["status"] == "fail" and parsed["gpus"]["0"]["status"] == "pass"
    assert any(r.startswith("GPU 1: MIG still enabled") for r in parsed["reasons"]), parsed["reasons"]


def test_uncorrectable_ecc_errors_and_a_pending_row_remap_fail_the_gpu(tmp_path):
    outcome = run_gpu_state(lab_gpus(tmp_path, faults=["ecc-uncorrectable"]))
    assert outcome.ok  # the reset itself went well: the verdict is the console's
    parsed = gpu_state.judge(outcome.result, expected_gpus=2, want=NO_MIG)
    assert parsed["verdict"] == "fail" and parsed["gpus"]["0"]["status"] == "pass"
    assert parsed["reasons"] == [
        "GPU 1: 2 uncorrectable ECC error(s) since the driver loaded (DCGM_FR_VOLATILE_DBE_DETECTED)",
        "GPU 1: a row remap is pending: the GPU needs a reset (DCGM_FR_PENDING_ROW_REMAP)"]
    assert gpu_state.memory_reasons({"retired_sbe": 40, "retired_dbe": 23}) == [
        "63 retired pages, the limit is 63 (DCGM_FR_RETIRED_PAGES_LIMIT)"]


def test_an_agent_saying_ok_without_reading_back_is_not_believed(tmp_path):
    outcome = run_gpu_state(lab_gpus(tmp_path))
    forged = {**outcome.result, "after": {**outcome.result["after"], "query": {
        "command": "nvidia-smi", "exit_code": 0, "stdout": "", "stderr": ""}}}
    parsed = gpu_state.judge(forged, expected_gpus=2, want=NO_MIG)
    assert parsed["verdict"] == "fail" and "nothing was read back after the reset" in parsed["reasons"]
    skipped = gpu_state.judge({"skipped": "all fine, trust me"}, expected_gpus=2, want=NO_MIG)
    assert skipped["verdict"] == "fail" and "2 GPU(s) expected" in skipped["reasons"][0]


# --- the protocol: a malformed or forged report ----------------------------------------------------------

@pytest.fixture
def releasing(demo_site):
    """gpu-01 in the release gate's gpu_state step, its command queued; its boot's secret delivered."""
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state="inspecting", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"name": "inspect", "id": "flow-gpu-01", "step": "gpu_state"})
    HostCommand.objects.create(host=host, flow_id="flow-gpu-01", step="gpu_state", name="gpu_state",
                               args={"expected_gpus": 8})
    host = BareMetalHost.objects.get(pk=host.pk)
    host.boot_secret = boot(host)
    return host


@pytest.mark.django_db
@pytest.mark.parametrize("report", [
    {"before": "all good", "actions": [], "after": None},
    {"before": {"query": {"command": "nvidia-smi", "exit_code": "0", "stdout": ""}, "remapped": {},
                "instances": {}}, "actions": [], "after": None},
    {"before": {"query": {"command": "x", "exit_code": 0, "stdout": ""}, "remapped": {"command": "x", "exit_code": 0},
                "instances": {"../etc": {"command": "x", "exit_code": 0}}}, "actions": "none", "after": None},
    ["not", "an", "object"],
])
def test_a_malformed_gpu_state_report_is_refused_and_fails_the_command_with_the_reason(agent_client, releasing,
                                                                                         report):
    token = lookup(agent_client, releasing)["token"]
    command = post(agent_client, "/agent/heartbeat", {"host_id": releasing.pk, "status": "idle"}, token)[1]["command"]
    status, answer = post(agent_client, "/agent/result", {"host_id": releasing.pk, "command_id": command["id"],
                                                          "ok": True, "result": report}, token)
    assert status == 400 and "gpu_state report refused: malformed" in answer["error"], answer
    stored = HostCommand.objects.get(host=releasing)
    assert stored.status == CommandStatus.FAILED and stored.result == {} and "malformed" in stored.error


@pytest.mark.django_db
def test_a_forged_gpu_state_report_gets_403_and_changes_nothing(agent_client, releasing):
    token = lookup(agent_client, releasing)["token"]
    command = post(agent_client, "/agent/heartbeat", {"host_id": releasing.pk, "status": "idle"}, token)[1]["command"]
    status, _ = post(agent_client, "/agent/result", {"host_id": releasing.pk, "command_id": command["id"], "ok": True,
                                                     "result": {"skipped": "no GPU"}}, token[:-4] + "AAAA")
    assert status == 403
    stored = HostCommand.objects.get(host=releasing)
    assert stored.status == CommandStatus.SENT and stored.result == {}


# --- in the lab -------------------------------------------------------------------------------------------

def repair_event(name: str) -> Event:
    return Event.objects.filter(host__name=name, kind="transition", to_state="repair").order_by("-id").first()


@pytest.mark.django_db(transaction=True)
def test_a_tenant_that_left_mig_enabled_is_reset_at_release_and_a_reset_that_fails_goes_to_repair(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["one"], disk_bytes=DISK)
    wait_hosts("available", 2, timeout=120)
    apply(gpu_pool(2), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=120)
    # Tenant one changed its GPUs; on gpu-02 a process it left holds them, so MIG cannot be disabled.
    site.set_gpu_state("gpu-01", **TENANT_LEFT)
    site.set_gpu_state("gpu-02", **TENANT_LEFT)
    site.set_fault("gpu-02", "mig-busy:4")
    pool_set_quantity(pool=NodePool.objects.get(tenant__name="one"), quantity=0, actor="user:test")
    wait_for(lambda: set(BareMetalHost.objects.values_list("state", flat=True)) <= {"available", "repair"}
             and NodeClaim.objects.filter(phase=ClaimPhase.RELEASED).count() == 2, timeout=150)
    assert BareMetalHost.objects.get(name="gpu-01").state == "available", lab_report()
    run = HealthCheckRun.objects.filter(host__name="gpu-01", suite="gpu-state").latest("created_at")
    assert run.verdict == "pass" and run.thresholds["mig_layout"] == "none"
    assert run.gpus["4"]["tests"]["MIG"] == "Enabled: 1g.18gb, 1g.18gb, 1g.18gb → Disabled"
    assert run.gpus["4"]["tests"]["persistence"] == "Disabled → Enabled"
    assert "nvidia-smi -i 7 -rac" in run.command
    assert all(g["mig_current"] == "Disabled" and g["instances"] == [] and g["persistence"] == "Enabled"
               for g in site.gpu_state("gpu-01").values())

    failed = repair_event("gpu-02")
    assert failed is not None and failed.from_state == "deprovisioning", lab_report()
    assert failed.step == "gpu_state" and "nvidia-smi -i 4 -mig 0: exit 255" in failed.message, failed.message
    assert "In use by another client" in failed.message
    bad = HealthCheckRun.objects.get(pk=failed.data["evidence"]["health_run"])
    assert bad.verdict == "fail" and bad.gpus["4"]["status"] == "fail" and bad.gpus["3"]["status"] == "pass"
    assert not HealthCheckRun.objects.filter(flow_id=bad.flow_id, suite="dcgmi").exists()  # never reached
    response = _admin_client().get(f"/health-runs/{bad.pk}/")
    assert response.status_code == 200 and "MIG still enabled" in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_a_declared_mig_layout_is_handed_over_and_uncorrectable_ecc_errors_send_the_host_to_repair(
        lab_factory, celery_worker_process):
    site = lab_factory(hosts=2, gpu_hosts=2, disk_bytes=DISK, faults={"gpu-02": "ecc-uncorrectable:6"},
                       gpu={"migLayout": {"3g.71gb": 2}})
    wait_hosts("available", 1, timeout=120)
    wait_hosts("repair", 1, timeout=60)
    assert BareMetalHost.objects.get(state="available").name == "gpu-01", lab_report()
    assert all(g["mig_current"] == "Enabled" and g["instances"] == ["3g.71gb", "3g.71gb"]
               for g in site.gpu_state("gpu-01").values())
    good = HealthCheckRun.objects.get(host__name="gpu-01", suite="gpu-state")
    assert good.verdict == "pass" and good.thresholds["mig_layout"] == ["3g.71gb", "3g.71gb"]
    failed = repair_event("gpu-02")
    assert failed.step == "gpu_state" and "GPU 6: 2 uncorrectable ECC error(s)" in failed.message, failed.message
    run = HealthCheckRun.objects.get(pk=failed.data["evidence"]["health_run"])
    assert run.gpus["6"]["tests"]["memory"].startswith("2 uncorrectable ECC error(s)")


def _admin_client():
    from django.contrib.auth.models import User
    from django.test import Client

    admin = User.objects.filter(is_superuser=True).first() or User.objects.create_superuser("gpu-admin", "", "x")
    client = Client()
    client.force_login(admin)
    return client
