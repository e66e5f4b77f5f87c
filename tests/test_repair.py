"""The repair pool: retest (clean and health suite again), return to service only after a passing retest or
by an admin override that says why, retire; every action in the Event log."""
import pytest
from django.core.management import CommandError, call_command

from conftest import wait_for
from events.models import Event
from hosts import services
from hosts.lifecycle import IllegalTransition
from hosts.models import BareMetalHost, HealthCheckRun
from pools.models import NodeType

from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]


@pytest.fixture
def broken_host(db):
    """A host the release gate set aside, as hosts.flows leaves it (a transition into repair with evidence)."""
    host = BareMetalHost.objects.create(name="gpu-09", bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/9",
                                        boot_mac="52:54:00:00:00:09", state="repair")
    Event.objects.create(kind="transition", object_type="host", object_name=host.name, host=host,
                         from_state="deprovisioning", to_state="repair", step="health_dcgm", actor="system:flow",
                         message="deprovision failed at health_dcgm: dcgmi diag -r 2: Detected XID 48 for GPU 3",
                         data={"step": "health_dcgm", "evidence": {"health_run": 1}})
    return host


@pytest.mark.django_db
def test_a_host_without_a_passing_retest_does_not_return_to_service(broken_host):
    with pytest.raises(IllegalTransition, match="no passing retest since it went to repair.*XID 48"):
        services.host_return_to_service(host=broken_host, actor="user:ops")
    with pytest.raises(IllegalTransition):
        services.host_return_to_service(host=broken_host, actor="user:ops", override_reason="   ")
    assert BareMetalHost.objects.get().state == "repair"


@pytest.mark.django_db
def test_an_override_needs_a_reason_and_is_recorded_with_it(broken_host):
    services.host_return_to_service(host=broken_host, actor="user:alice",
                                    override_reason="GPU 3 replaced by the vendor, ticket 4711")
    host = BareMetalHost.objects.get()
    assert host.state == "available"
    event = Event.objects.filter(host=host, to_state="available").get()
    assert event.actor == "user:alice"
    assert event.data["override"] is True and event.data["without_passing_retest"] is True
    assert event.data["override_reason"] == "GPU 3 replaced by the vendor, ticket 4711"
    assert "ticket 4711" in event.message and "override" in event.message
    assert event.data["last_repair"]["step"] == "health_dcgm"


@pytest.mark.django_db
def test_retire_needs_a_reason_and_a_retired_host_goes_nowhere(broken_host):
    with pytest.raises(IllegalTransition, match="needs a reason"):
        services.host_retire(host=broken_host, actor="user:ops", reason="")
    services.host_retire(host=broken_host, actor="user:ops", reason="board failure, RMA")
    host = BareMetalHost.objects.get()
    assert host.state == "retired"
    assert Event.objects.get(host=host, to_state="retired").message == "retired: board failure, RMA"
    for action in (services.host_retest, services.host_return_to_service):
        with pytest.raises(IllegalTransition):
            action(host=host, actor="user:ops")


@pytest.mark.django_db
def test_the_repair_command_lists_the_pool_and_refuses_a_return_without_retest(broken_host, capsys):
    in_error = BareMetalHost.objects.create(name="gpu-08", bmc_address="redfish+http://127.0.0.1:1/redfish/v1/Systems/8",
                                            boot_mac="52:54:00:00:00:08", state="registering")
    services.host_transition(host=in_error, to_state="error", actor="system:flow",
                             reason="register failed at bmc_check: BMC rejected credentials (401)")
    call_command("repair")
    listed = capsys.readouterr().out.splitlines()  # what /repair/ shows: errors first, then repair
    assert listed[0] == "gpu-08\terror\tregister failed at bmc_check: BMC rejected credentials (401)\tfix: Retry"
    assert listed[1].startswith("gpu-09\trepair\tdeprovision failed at health_dcgm")
    assert "fix: Retest\tfailed certificates: 0, failed health runs: 0" in listed[1]
    with pytest.raises(CommandError, match="no passing retest"):
        call_command("repair", "gpu-09", "return")
    call_command("repair", "gpu-09", "return", "--override-reason", "burn-in passed on the bench", "--actor", "user:bob")
    assert Event.objects.get(host=broken_host, to_state="available").actor == "user:bob"


@pytest.mark.django_db(transaction=True)
def test_a_mended_host_passes_its_retest_and_then_may_return_to_service(lab_factory, celery_worker_process):
    site = lab_factory(hosts=1, gpu_hosts=1, faults={"gpu-01": "gpu-xid:3"}, disk_bytes=96 * 1024 * 1024)
    wait_hosts("repair", 1, timeout=60)
    host = BareMetalHost.objects.get()
    with pytest.raises(IllegalTransition):
        services.host_return_to_service(host=host, actor="user:ops")

    # A retest while the GPU is still broken: back to repair, failed, and still not returnable.
    services.host_retest(host=host, actor="user:ops")
    wait_for(lambda: Event.objects.filter(host=host, from_state="retesting", to_state="repair").exists(), timeout=60)
    failed = Event.objects.get(host=host, from_state="retesting", to_state="repair")
    assert failed.data["retest"] == "failed" and "Detected XID 48 for GPU 3" in failed.message
    with pytest.raises(IllegalTransition):
        services.host_return_to_service(host=BareMetalHost.objects.get(), actor="user:ops")

    site.set_fault("gpu-01", "")  # the GPU is replaced
    services.host_retest(host=BareMetalHost.objects.get(), actor="user:ops", reason="GPU 3 replaced")
    wait_for(lambda: Event.objects.filter(host=host, from_state="retesting", to_state="repair").count() == 2,
             timeout=60)
    passed = Event.objects.filter(host=host, from_state="retesting", to_state="repair").order_by("-id").first()
    assert passed.data["retest"] == "passed", lab_report()
    runs = HealthCheckRun.objects.filter(flow_id=passed.data["flow_id"])
    assert {r.suite: r.verdict for r in runs} == {"gpu-reset": "pass", "gpu-state": "pass", "dcgmi": "pass", "nccl": "pass"}
    assert BareMetalHost.objects.get().state == "repair"  # a retest does not return the host by itself

    services.host_return_to_service(host=BareMetalHost.objects.get(), actor="user:ops")
    assert BareMetalHost.objects.get().state == "available"
    back = Event.objects.filter(host=host, to_state="available").get()
    assert back.data == {"retest": "passed", "retest_flow_id": passed.data["flow_id"]}
    assert back.actor == "user:ops"
    actions = list(Event.objects.filter(host=host, kind="transition").order_by("id")
                   .values_list("from_state", "to_state", "actor"))
    assert actions[-6:] == [("inspecting", "repair", "system:flow"),
                            ("repair", "retesting", "user:ops"), ("retesting", "repair", "system:flow"),
                            ("repair", "retesting", "user:ops"), ("retesting", "repair", "system:flow"),
                            ("repair", "available", "user:ops")]


@pytest.mark.django_db
def test_admins_retest_from_the_admin_and_the_action_is_in_the_event_log(broken_host, admin_client):
    response = admin_client.post("/admin/hosts/baremetalhost/", {"action": "retest",
                                                                  "_selected_action": [broken_host.pk]})
    assert response.status_code == 302
    assert BareMetalHost.objects.get().state == "retesting"
    event = Event.objects.get(host=broken_host, to_state="retesting")
    assert event.actor.startswith("admin:") or event.actor.startswith("user:")
    admin_client.post("/admin/hosts/baremetalhost/", {"action": "return_to_service",
                                                      "_selected_action": [broken_host.pk]})
    assert BareMetalHost.objects.get().state == "retesting"  # refused: not in repair, no passing retest


@pytest.mark.django_db
def test_the_gate_reads_a_gpu_count_from_an_imported_metal3_status_and_a_hosts_policy_wins(demo_site):
    # demo/hosts.yaml imports inventories from the Metal3 status annotation, where "gpus" is a count.
    from hosts.gate.cleaning import gate_for

    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.inventory["gpus"] == 8
    NodeType.objects.filter(name="gpu-server").update(cleaning_policy="secure", cleaning_fallback="full",
                                                      erase_concurrency=3, erase_verify_full=True)
    gate = gate_for(host)
    assert gate["health"]["expected_gpus"] == 8
    assert gate["policy"] | {"verify_share": None} == {
        "method": "secure", "fallback": "full", "source": "NodeType gpu-server", "concurrency": 3,
        "verify_share": None, "verify_mode": "full"}
    host.cleaning_policy = "metadata"
    assert gate_for(host)["policy"]["method"] == "metadata"
    assert gate_for(host)["policy"]["source"] == "host override"
