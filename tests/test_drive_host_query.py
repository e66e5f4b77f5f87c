"""The step engine reads its host with one query compiled once per process, and gets the same objects as the ORM;
a drive writes its host's flow record once per step it starts (the step it finished goes with it), and before a
flow's hook moves the host on or the drive ends."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from claims.models import NodeClaim
from events.models import Event
from hosts import lifecycle
from hosts.boot import ramdisk
from hosts.choices import HostState
from hosts.engine.drive import drive
from hosts.engine.flow import Flow, Step, Waiting
from hosts.engine.load import host_for_drive
from hosts.models import BareMetalHost
from pools.models import NodeProvider, NodeType, Tenant

pytestmark = pytest.mark.django_db

KUBECONFIG = "apiVersion: v1\nclusters: []\n"


def orm_host(pk):
    return BareMetalHost.objects.select_related(*lifecycle.RELATED).filter(pk=pk).first()


def same(a, b) -> None:
    assert type(a) is type(b)
    for field in a._meta.concrete_fields:
        assert getattr(a, field.attname) == getattr(b, field.attname), field.name
    assert a._state.adding is False and b._state.adding is False


def claimed_host(demo_site) -> BareMetalHost:
    host = BareMetalHost.objects.get(name="gpu-01")
    tenant = Tenant.objects.create(name="acme", kubeconfig=KUBECONFIG)
    NodeClaim.objects.create(name="acme-gpu-1", tenant=tenant, host=host, node_type=NodeType.objects.get(name="gpu-server"),
                             provider=NodeProvider.objects.get(name="metal3"), properties={"a": [1, 2]})
    return host


def test_the_drive_reads_a_claimed_host_as_the_orm_does_with_its_claim_tenant_and_node_type_in_one_query(demo_site):
    host = claimed_host(demo_site)
    with CaptureQueriesContext(connection) as queries:
        loaded = host_for_drive(host.pk)
        claim = loaded.claim
        tenant, node_type = claim.tenant, claim.node_type
    assert len(queries) == 1
    expected = orm_host(host.pk)
    same(loaded, expected)
    same(claim, expected.claim)
    same(tenant, expected.claim.tenant)
    same(node_type, expected.claim.node_type)
    assert str(tenant.kubeconfig) == KUBECONFIG  # decrypted, as the ORM gives it
    assert claim.host is loaded


def test_the_drive_reads_a_host_without_a_claim_and_none_for_a_host_that_is_gone(demo_site):
    host = BareMetalHost.objects.get(name="gpu-02")
    with CaptureQueriesContext(connection) as queries:
        loaded = host_for_drive(host.pk)
        assert getattr(loaded, "claim", None) is None
    assert len(queries) == 1
    same(loaded, orm_host(host.pk))
    assert host_for_drive(10**9) is None


# --- the flow record: one write per step started ---

def _flow_writes(queries) -> int:
    return sum(1 for q in queries if q["sql"].startswith('UPDATE "hosts_baremetalhost" SET "flow"'))


@pytest.fixture
def test_flow(monkeypatch, demo_site):
    """A flow of the inspecting state made of steps the test controls: each in `finish` is done at once, any other
    waits; `finished` records the flow record the database held when the flow's finish hook ran."""
    finish_now, finished = set(), []

    def step(name):
        def run(run_):
            if name not in finish_now:
                raise Waiting(f"{name} waits")
            return {"step": name}
        return Step(name, run, lambda: 3600)

    def finish(run):  # the flow's hook moves the host on
        finished.append(BareMetalHost.objects.get(pk=run.host.pk).flow)
        BareMetalHost.objects.filter(pk=run.host.pk).update(state=HostState.AVAILABLE, state_changed_at=timezone.now())

    flow = Flow("test-inspect", HostState.INSPECTING, [step("a"), step("b"), step("c")], finish=finish,
                fail=lambda run, step, failure: None, gate=True)
    monkeypatch.setitem(lifecycle.FLOWS, flow.name, flow)
    monkeypatch.setitem(lifecycle.FLOW_FOR_STATE, HostState.INSPECTING, flow.name)
    monkeypatch.setattr(ramdisk, "boot_unsettled_s", lambda host_id: 0.0)
    host = BareMetalHost.objects.get(name="gpu-01")
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.INSPECTING)
    return host, finish_now, finished


def _steps(host) -> list[tuple[str, str]]:
    return list(Event.objects.filter(host=host, kind="step").order_by("pk").values_list("step", "message"))


def test_a_step_done_is_written_with_the_next_steps_start_in_one_update(test_flow):
    host, finish_now, _ = test_flow
    finish_now.update({"a", "b"})
    with CaptureQueriesContext(connection) as queries:
        drive(host.pk)
    flow = BareMetalHost.objects.get(pk=host.pk).flow
    assert set(flow["done"]) == {"a", "b"} and flow["step"] == "c"
    # The new run's record, then a's start, b's start (a done), c's start (b done): not a write per step's end too.
    assert _flow_writes(queries) == 4
    assert _steps(host) == [("a", "started"), ("a", "done"), ("b", "started"), ("b", "done"), ("c", "started")]


def test_a_step_done_before_the_flows_finish_is_written_before_the_hook_moves_the_host_on(test_flow):
    host, finish_now, finished = test_flow
    finish_now.update({"a", "b", "c"})
    drive(host.pk)
    assert len(finished) == 1
    assert set(finished[0]["done"]) == {"a", "b", "c"} and "step" not in finished[0]


def test_a_step_done_when_the_drive_stops_is_written_at_the_drives_end(test_flow, monkeypatch):
    host, finish_now, finished = test_flow
    finish_now.update({"a", "b", "c"})
    monkeypatch.setattr(ramdisk, "boot_unsettled_s", lambda host_id: 5.0)  # the gate waits for the boot to settle
    drive(host.pk)
    assert finished == []
    flow = BareMetalHost.objects.get(pk=host.pk).flow
    assert set(flow["done"]) == {"a", "b", "c"} and "step" not in flow


def test_a_step_done_is_not_written_over_a_host_that_left_the_flows_state_meanwhile(test_flow, monkeypatch):
    host, _, _ = test_flow
    moved = []

    def done_while_moved(run):  # step a finishes while someone else moves the host on
        BareMetalHost.objects.filter(pk=run.host.pk).update(state=HostState.AVAILABLE, state_changed_at=timezone.now(),
                                                            flow={"other": True})
        moved.append(run.host.pk)
        return {}

    monkeypatch.setattr(lifecycle.FLOWS["test-inspect"].steps[0], "run", done_while_moved)
    drive(host.pk)
    assert moved == [host.pk]
    assert BareMetalHost.objects.get(pk=host.pk).flow == {"other": True}
