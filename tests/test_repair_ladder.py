"""The repair ladder without the lab: a failure's kind from its run, the ladder of its NodeType (the manifest's
`repair:` block, validated), one rung at a time as the repair flow's moves drive it, the summary when it is over,
a person's retest taking over, and the fleet's mean time to repair and repair rate computed from the cases (the
repair page, the API and `manage.py repair --stats`). tests/test_repair_ladder_lab.py runs it in the lab."""
import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from events.models import Event
from hosts import services
from hosts.models import (
    BareMetalHost,
    EraseCertificate,
    HealthCheckRun,
    RepairAttempt,
    RepairCase,
)
from hosts.flows.repair import classify, host_repair_advance
from hosts.selectors import repair_stats
from pools.models import NodeType

pytestmark = pytest.mark.django_db

GPU_TYPE = """\
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {name: metal3}
spec:
  metal3:
    nodeTypes:
      - name: gpu-server
        resources: {nvidia.com/gpu: "8"}
        bareMetalHosts: {selector: {matchLabels: {role: gpu}}}
"""


def _host(name="gpu-01", state="deprovisioning") -> BareMetalHost:
    return BareMetalHost.objects.create(name=name, bmc_address=f"redfish+http://127.0.0.1:1/redfish/v1/Systems/{name}",
                                        boot_mac=f"52:54:00:00:00:{len(BareMetalHost.objects.all()) + 1:02x}",
                                        labels={"role": "gpu"}, state=state)


def _dcgm_failure(host, *, xid=True) -> dict:
    """What hosts.flows.host.host_flow_fail writes on the move into repair when `dcgmi diag` failed on GPU 3."""
    words = "Detected XID 48 for GPU 3" if xid else "Found 12 faulty memory elements on GPU 3"
    run = HealthCheckRun.objects.create(host=host, host_name=host.name, flow_id=f"f-{host.pk}-{xid}", suite="dcgmi",
                                        verdict="fail", reasons=[f"PCIe (GPU 3): {words}"],
                                        gpus={"0": {"status": "pass"}, "3": {"status": "fail"}})
    return {"flow": "deprovision", "flow_id": run.flow_id, "step": "health_dcgm",
            "message": f"dcgmi diag -r 2: PCIe (GPU 3): {words}", "evidence": {"health_run": run.pk}}


def _fail(host, data, to="repair"):
    services.host_transition(host=host, to_state=to, actor="system:flow", step=data["step"],
                             reason=f"deprovision failed at {data['step']}: {data['message']}", data=data)


def _rung_fails(host, step="health_dcgm"):
    """The repair flow's end when the checks after the remedy failed again (hosts.flows.repair.repair_fail)."""
    host.refresh_from_db()
    assert host.state == "repairing"
    services.host_transition(host=host, to_state="repair", actor="system:flow", step=step,
                             reason=f"repair failed at {step}: still broken",
                             data={"flow": "repair", "step": step, "message": "still broken"})


def test_a_failure_is_classified_from_the_run_that_failed(db):
    host = _host()
    assert classify(step="health_dcgm", message="", data=_dcgm_failure(host)) == ("gpu-xid", "GPU 3")
    assert classify(step="health_dcgm", message="", data=_dcgm_failure(host, xid=False)) == ("gpu-health", "GPU 3")
    assert classify(step="health_nccl", message="all_reduce_perf: busbw 180 GB/s", data={}) == ("nccl-slow", "")
    cert = EraseCertificate.objects.create(host=host, host_name=host.name, flow_id="x", disk="nvme1n1", result="fail",
                                           document={}, signature="s", key_id="k")
    assert classify(step="verify_erase", message="", data={"evidence": {"certificates": [cert.pk]}}) == \
        ("erase", "nvme1n1")
    assert classify(step="erase", message="agent: nvme format failed",
                    data={"evidence": {"disks": [{"name": "nvme0n1", "error": "INTERNAL"}]}}) == ("disk", "nvme0n1")
    sku = {"step": "sku_check", "evidence": {"deviations": {"gpu-server": ["GPUs: 7 of 8 NVIDIA H200"]}}}
    assert classify(step="sku_check", message="", data=sku) == ("sku", "GPUs: 7 of 8 NVIDIA H200")
    assert classify(step="host_failures", message="3 provisioning failures", data={}) == ("unknown", "")


def test_a_gpu_failure_climbs_the_default_ladder_and_then_waits_for_a_person_with_the_summary(apply):
    apply(GPU_TYPE)
    host = _host()
    _fail(host, _dcgm_failure(host))
    case = RepairCase.objects.get()
    assert (case.kind, case.detail, case.node_type, case.outcome) == ("gpu-xid", "GPU 3", "gpu-server", "running")
    assert case.ladder == ["gpu-reset", "power-cycle", "retest"]
    for position, remedy in enumerate(case.ladder, start=1):
        assert host_repair_advance(host_id=host.pk) == f"started {remedy}"
        assert host_repair_advance(host_id=host.pk) == "not in repair"  # a second delivery of the task
        start = Event.objects.filter(host=host, to_state="repairing").order_by("-id").first()
        assert start.actor == "system:repair" and start.data["remedy"] == remedy
        assert start.message.startswith(f"repair ladder {position}/3 for gpu-xid on GPU 3: ")
        _rung_fails(host)
        attempt = RepairAttempt.objects.get(position=position)
        assert (attempt.step, attempt.outcome, attempt.failed_step) == (remedy, "failed", "health_dcgm")
    assert host_repair_advance(host_id=host.pk) == "waiting for a person"
    case.refresh_from_db()
    summary = ("gpu-xid on GPU 3: tried gpu-reset (failed), power-cycle (failed), retest (failed); "
               "waiting for a person")
    assert (case.outcome, case.summary, case.closed_at) == ("waiting", summary, None)
    assert Event.objects.get(host=host, step="repair_ladder", kind="action").message == summary
    assert host_repair_advance(host_id=host.pk) == "no ladder to climb"
    assert BareMetalHost.objects.get().state == "repair"


def test_a_passing_remedy_returns_the_host_and_closes_its_case(apply):
    apply(GPU_TYPE)
    host = _host()
    _fail(host, _dcgm_failure(host))
    host_repair_advance(host_id=host.pk)
    host.refresh_from_db()
    services.host_transition(host=host, to_state="available", actor="system:repair", reason="repaired by gpu-reset")
    case = RepairCase.objects.get()
    assert (case.outcome, case.closed_by) == ("repaired", "system:repair") and case.closed_at is not None
    assert case.summary == "gpu-xid on GPU 3: tried gpu-reset (passed); repaired by gpu-reset"
    assert RepairAttempt.objects.get().outcome == "passed"
    # The next failure is a case of its own.
    services.host_transition(host=BareMetalHost.objects.get(), to_state="provisioning", actor="test")
    host = BareMetalHost.objects.get()
    services.host_transition(host=host, to_state="deprovisioning", actor="test")
    _fail(host, {"step": "health_nccl", "message": "all_reduce_perf: busbw 180 GB/s", "evidence": {}})
    assert list(RepairCase.objects.order_by("id").values_list("kind", "outcome")) == [
        ("gpu-xid", "repaired"), ("nccl-slow", "running")]


def test_the_node_types_repair_block_sets_the_ladder_and_can_turn_it_off(apply):
    apply(GPU_TYPE.replace("bareMetalHosts:", "repair: {ladders: {gpu-xid: [retest], erase: []}}\n        bareMetalHosts:"))
    assert NodeType.objects.get().repair == {"ladders": {"gpu-xid": ["retest"], "erase": []}}
    host = _host()
    _fail(host, _dcgm_failure(host))
    assert RepairCase.objects.get().ladder == ["retest"]
    assert NodeType.objects.get().repair_ladder("nccl-slow") == ["gpu-reset", "power-cycle", "retest"]  # default
    assert NodeType.objects.get().repair_ladder("erase") == []

    apply(GPU_TYPE.replace("bareMetalHosts:", "repair: {automatic: false}\n        bareMetalHosts:"))
    other = _host("gpu-02")
    _fail(other, _dcgm_failure(other))
    assert host_repair_advance(host_id=other.pk) == "waiting for a person"
    case = RepairCase.objects.get(host=other)
    assert case.ladder == [] and case.summary == ("gpu-xid on GPU 3: no automatic remedy for this kind of failure; "
                                                  "waiting for a person")
    assert BareMetalHost.objects.get(pk=other.pk).state == "repair"


def test_the_repair_block_round_trips_through_export(apply, capsys):
    apply(GPU_TYPE.replace("bareMetalHosts:", "repair: {automatic: true, ladders: {nccl-slow: [power-cycle]}}\n"
                                              "        bareMetalHosts:"))
    capsys.readouterr()
    call_command("export")
    exported = capsys.readouterr().out
    assert "repair:" in exported and "nccl-slow:" in exported
    before = NodeType.objects.get().repair
    assert any(line == "nodetype/gpu-server unchanged" for line in apply(exported))
    assert NodeType.objects.get().repair == before == {"automatic": True, "ladders": {"nccl-slow": ["power-cycle"]}}


@pytest.mark.parametrize("block, expect", [
    ("{ladders: {gpu-melted: [retest]}}", "unknown field; expected one of disk, erase, gpu-health"),
    ("{ladders: {gpu-xid: [reboot]}}", "'reboot' is not a remedy; expected one of gpu-reset, power-cycle"),
    ("{ladders: {gpu-xid: [retest, retest]}}", "a remedy is listed twice"),
    ("{ladders: {gpu-xid: retest}}", "must be a list"),
    ("{automatic: yes please}", "must be true or false"),
    ("{ladder: {}}", "unknown field; expected one of automatic, ladders"),
])
def test_a_bad_repair_block_is_refused_with_its_path_and_nothing_changes(apply, block, expect):
    apply(GPU_TYPE)
    with pytest.raises(CommandError) as info:
        apply(GPU_TYPE.replace("bareMetalHosts:", f"repair: {block}\n        bareMetalHosts:"))
    assert expect in str(info.value) and "repair" in str(info.value)
    assert NodeType.objects.get().repair == {}


def test_the_node_type_model_refuses_a_bad_ladder_for_the_admin_and_the_api(apply):
    from django.core.exceptions import ValidationError

    apply(GPU_TYPE)
    node_type = NodeType.objects.get()
    node_type.repair = {"ladders": {"gpu-xid": ["gpu-reset"] * 2}}
    with pytest.raises(ValidationError, match="listed twice"):
        node_type.full_clean()
    node_type.repair = {"ladders": {"gpu-xid": ["gpu-reset", "power-cycle", "retest", "reimage"]}}
    node_type.full_clean()


def test_a_persons_retest_takes_the_case_from_the_ladder(apply):
    apply(GPU_TYPE)
    host = _host()
    _fail(host, _dcgm_failure(host))
    services.host_retest(host=BareMetalHost.objects.get(), actor="user:ops")
    case = RepairCase.objects.get()
    assert case.outcome == "waiting" and case.summary == "gpu-xid on GPU 3: no remedy tried; taken over by user:ops"
    services.host_transition(host=BareMetalHost.objects.get(), to_state="repair", actor="system:flow",
                             reason="retest passed", data={"retest": "passed"})
    assert host_repair_advance(host_id=host.pk) == "no ladder to climb"
    services.host_return_to_service(host=BareMetalHost.objects.get(), actor="user:ops")
    case.refresh_from_db()
    assert (case.outcome, case.closed_by) == ("returned", "user:ops")
    assert not RepairAttempt.objects.exists()


def _case(host, node_type, kind, outcome, *, hours_ago, took_min=None):
    opened = timezone.now() - timedelta(hours=hours_ago)
    return RepairCase.objects.create(host=host, host_name=host.name, node_type=node_type, kind=kind, outcome=outcome,
                                     opened_at=opened,
                                     closed_at=opened + timedelta(minutes=took_min) if took_min is not None else None)


@pytest.fixture
def cases(db):
    host = _host(state="available")
    _case(host, "gpu-server", "gpu-xid", "repaired", hours_ago=5, took_min=10)
    _case(host, "gpu-server", "gpu-xid", "repaired", hours_ago=4, took_min=20)
    _case(_host("gpu-02", state="repair"), "gpu-server", "gpu-health", "waiting", hours_ago=3)
    _case(host, "gpu-server", "gpu-health", "returned", hours_ago=2, took_min=90)
    _case(_host("cpu-01", state="repair"), "cpu-server", "erase", "running", hours_ago=1)
    _case(host, "cpu-server", "erase", "repaired", hours_ago=24 * 40, took_min=5)  # outside the window
    return host


def test_mean_time_to_repair_and_the_repair_rate_are_computed_from_the_cases(cases):
    stats = repair_stats()
    fleet = stats["fleet"]
    assert (fleet["cases"], fleet["repaired"], fleet["returned"], fleet["waiting"], fleet["running"]) == (5, 2, 1, 1, 1)
    assert fleet["repair_rate"] == 0.5  # 2 repaired by the ladder of the 4 whose ladder is over
    assert fleet["mttr_s"] == 2400.0  # (10 + 20 + 90) min / 3 back in service
    by_type = {g["name"]: g for g in stats["by_node_type"]}
    assert by_type["gpu-server"]["repair_rate"] == 0.5 and by_type["gpu-server"]["mttr_s"] == 2400.0
    assert by_type["cpu-server"]["repair_rate"] is None and by_type["cpu-server"]["mttr_s"] is None
    by_kind = {g["name"]: g for g in stats["by_kind"]}
    assert by_kind["gpu-xid"]["repair_rate"] == 1.0 and by_kind["gpu-xid"]["mttr_s"] == 900.0
    assert by_kind["gpu-health"]["repair_rate"] == 0.0 and by_kind["gpu-health"]["mttr_s"] == 5400.0
    assert repair_stats(days=60)["fleet"]["cases"] == 6
    only = repair_stats(kind="gpu-xid")
    assert only["fleet"]["cases"] == 2 and [g["name"] for g in only["by_node_type"]] == ["gpu-server"]


def test_the_repair_page_the_api_and_the_command_show_the_figures(cases, admin_client, capsys):
    page = admin_client.get("/repair/").content.decode()
    assert 'id="repair-figures"' in page and 'data-name="gpu-xid"' in page and "40m" in page and "50%" in page
    filtered = admin_client.get("/repair/?kind=erase").content.decode()
    assert 'data-name="gpu-xid"' not in filtered and 'data-name="erase"' in filtered

    body = admin_client.get("/api/v1/repair/?node_type=gpu-server").json()
    assert body["stats"]["fleet"]["cases"] == 4 and body["stats"]["fleet"]["mttr_s"] == 2400.0
    assert admin_client.get("/api/v1/repair/?days=-1").status_code == 400
    assert admin_client.get("/api/v1/repair/?kind=melted").json() == {
        "kind": ["must be one of gpu-xid, gpu-health, nccl-slow, erase, disk, sku, unknown"]}

    call_command("repair", "--stats")
    out = capsys.readouterr().out.splitlines()
    assert "fleet\tfleet\t5\t1\t2\t1\t1\t0\t50%\t40m" in out
    assert "kind\tgpu-xid\t2\t0\t2\t0\t0\t0\t100%\t15m" in out
    call_command("repair", "--stats", "--json", "--node-type", "cpu-server")
    assert json.loads(capsys.readouterr().out)["fleet"]["running"] == 1
    with pytest.raises(CommandError, match="--days"):
        call_command("repair", "--stats", "--days", "0")


def test_the_repair_page_shows_each_hosts_ladder_position(apply, admin_client):
    apply(GPU_TYPE)
    host = _host()
    _fail(host, _dcgm_failure(host))
    host_repair_advance(host_id=host.pk)
    _rung_fails(host)
    host_repair_advance(host_id=host.pk)
    page = admin_client.get("/repair/").content.decode()
    running = "rung 2 of 3 running: power-cycle; next if it fails: rung 3, retest"
    assert "gpu-xid on GPU 3" in page and running in page
    body = admin_client.get("/api/v1/repair/").json()
    [shown] = body["hosts"]
    assert (shown["host"], shown["state"], shown["ladder_position"]) == ("gpu-01", "repairing", running)
    assert [(a["remedy"], a["outcome"]) for a in shown["attempts"]] == [("gpu-reset", "failed"),
                                                                         ("power-cycle", "running")]
    history = admin_client.get("/hosts/gpu-01/").content.decode()
    assert "Repair history" in history and "repair-attempt-" in history and running in history


def test_the_api_sets_a_node_types_ladder_and_refuses_a_bad_one(apply, admin_client):
    apply(GPU_TYPE)
    node_type = NodeType.objects.get()
    url = f"/api/v1/nodetypes/{node_type.pk}/"
    refused = admin_client.patch(url, {"repair": {"ladders": {"gpu-xid": ["reboot"]}}}, content_type="application/json")
    assert refused.status_code == 400 and "'reboot' is not a remedy" in refused.content.decode()
    assert NodeType.objects.get().repair == {}
    done = admin_client.patch(url, {"repair": {"ladders": {"gpu-xid": ["power-cycle"]}}},
                              content_type="application/json")
    assert done.status_code == 200, done.content
    assert done.json()["repair"] == {"ladders": {"gpu-xid": ["power-cycle"]}}
    assert NodeType.objects.get().repair_ladder("gpu-xid") == ["power-cycle"]


def test_a_lost_task_is_made_up_by_the_periodic_catch_up_and_a_stuck_remedy_by_the_sweeper(apply):
    from hosts.flows.repair import hosts_repair_due

    apply(GPU_TYPE)
    host = _host()
    _fail(host, _dcgm_failure(host))  # its task went nowhere: no worker runs here
    assert hosts_repair_due() == [host.pk]
    host.refresh_from_db()
    assert host.state == "repairing" and RepairAttempt.objects.get().outcome == "running"
    assert hosts_repair_due() == []  # nothing to catch up while a remedy runs
    # A remedy nobody drives past the repairing state's deadline: the sweeper fails it, the ladder goes on.
    BareMetalHost.objects.filter(pk=host.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    assert services.hosts_sweep_overdue() == [host.name]
    attempt = RepairAttempt.objects.get()
    assert attempt.outcome == "failed" and attempt.message.startswith("deadline exceeded: repairing for more than")
    assert hosts_repair_due() == [host.pk]
    assert list(RepairAttempt.objects.order_by("position").values_list("step", "outcome")) == [
        ("gpu-reset", "failed"), ("power-cycle", "running")]
