"""The seam between claims and external providers (machines/): a pool on a provider of another kind gets a machine
per claim from that kind, the node joins the tenant's real (lab) Kubernetes API and is labelled, the claim is
Available; power goes to the kind with the request and its outcome in the Event log; release drains and deletes the
node, then waits until the kind says every object is gone; capacity, a failing provider and another tenant's reach
are checked too. The kind here is a small in-test provider whose machine "boots" by joining the tenant with the
join command it was given, as a VM's cloud-init would; each real kind has its own end-to-end tests."""
import io

import pytest
import yaml
from django.core.management import call_command

from claims.choices import ClaimPhase as P
from claims.models import NodeClaim
from claims.phases import claims_release
from events.models import Event
from lab.kube import TenantAPIServer, parse_join_command
from machines import kinds
from machines.choices import DiskProof, MachineState
from machines.kinds import KindError, Progress
from machines.models import Machine
from machines.services import claims_fill, machine_advance, machine_power_send
from pools.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)

SITE = """
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {name: cloud}
spec:
  terraform:
    nodeTemplate:
      inline: |
        resource "null_resource" "node" {}
    nodeTypes:
      - name: cloud-small
        resources: {cpu: "4", memory: 16Gi}
        maxCapacity: 2
"""
POOLS = """
privateNodes:
  autoNodes:
    - provider: cloud
      static:
        - name: small
          quantity: {quantity}
          nodeLabels: {{team: ml}}
"""


class InTestKind:
    """A provider whose machines join the tenant when they "boot" (the second look after fill)."""

    def __init__(self):
        self.machines: dict[str, dict] = {}  # name → {"command", "looks", "power"}
        self.fail_fill = None
        self.broken: set[str] = set()
        self.released: list[str] = []

    def capacity(self, node_type):
        return node_type.provider_config.get("maxCapacity")

    def fill(self, machine, join):
        if self.fail_fill:
            raise self.fail_fill
        command = yaml.safe_load(join.user_data.split("\n", 1)[1])["runcmd"][0]
        self.machines[machine.name] = {"command": command, "node": join.node_name, "looks": 0, "power": []}
        machine.made = [{"kind": "InTestMachine", "name": machine.name}]

    def progress(self, machine):
        record = self.machines[machine.name]
        if machine.name in self.broken:
            return Progress(state=MachineState.FAILED, message="the hypervisor lost it")
        record["looks"] += 1
        if record["looks"] == 1:
            return Progress(state=MachineState.CREATING, message="booting")
        if record["looks"] == 2:
            endpoint, token = parse_join_command(record["command"])
            from lab.kube import kubelet_join
            kubelet_join(endpoint, token, record["node"])
        return Progress(state=MachineState.RUNNING, message="running", node_name=record["node"])

    def power(self, machine, action):
        self.machines[machine.name]["power"].append(action)

    def release(self, machine):
        self.released.append(machine.name)
        return self.released.count(machine.name) >= 2  # gone at the second look, as a deletion that takes time

    def disk_proof(self, machine):
        return DiskProof.DESTROYED


@pytest.fixture
def kind(monkeypatch):
    fake = InTestKind()
    monkeypatch.setitem(kinds._KINDS, "terraform", fake)
    return fake


@pytest.fixture
def tenant_api(apply):
    apply(SITE)
    with TenantAPIServer("alpha") as server:
        apply(POOLS.format(quantity=2), tenant="alpha")
        Tenant.objects.filter(name="alpha").update(api_endpoint=server.endpoint, kubeconfig=server.kubeconfig())
        yield server


def reconcile():
    call_command("reconcile", stdout=io.StringIO())


def advance_all(times=1):
    for _ in range(times):
        for machine in Machine.objects.exclude(state=MachineState.GONE):
            machine_advance(machine_id=machine.pk)


def nodes(server) -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in server.objects("nodes")}


def test_a_pool_on_an_external_provider_gets_machines_whose_nodes_join_and_the_claims_become_available(
        kind, tenant_api):
    reconcile()
    claims = list(NodeClaim.objects.filter(tenant__name="alpha"))
    assert len(claims) == 2 and all(c.phase == P.PENDING and c.host_id is None for c in claims)
    made = claims_fill()
    assert sorted(made.made.values()) == ["cloud-small", "cloud-small"]
    assert {c.phase for c in NodeClaim.objects.all()} == {P.PROVISIONING}
    advance_all()  # fill, then the first look: booting
    assert {m.state for m in Machine.objects.all()} == {MachineState.CREATING}
    advance_all()  # running and joined; the node is Ready and labelled at the same look
    for claim in NodeClaim.objects.select_related("machine"):
        assert claim.phase == P.AVAILABLE, claim.message
        assert claim.machine.state == MachineState.RUNNING and claim.machine.made[0]["kind"] == "InTestMachine"
        node = nodes(tenant_api)[claim.node_name]
        assert node["metadata"]["labels"]["team"] == "ml"
        assert node["metadata"]["labels"]["vmetal.dev/claim"] == claim.name
        assert node["metadata"]["labels"]["vcluster.com/node-type"] == "cloud-small"
    secrets = {parse_join_command(m["command"])[1].split(".")[1] for m in kind.machines.values()}
    assert not any(secret in str(e.message) + str(e.data) for e in Event.objects.all() for secret in secrets)


def test_capacity_holds_claims_past_max_capacity_pending_with_the_reason(kind, apply, tenant_api):
    apply(POOLS.format(quantity=3), tenant="alpha")
    reconcile()
    result = claims_fill()
    assert len(result.made) == 2
    waiting = NodeClaim.objects.get(phase=P.PENDING)
    assert waiting.reason == "NoCapacity" and "cloud-small 2" in waiting.message
    assert claims_fill().made == {}  # a second pass does not overfill


def test_power_goes_to_the_kind_and_both_request_and_outcome_are_in_the_event_log(kind, tenant_api, world_admin):
    reconcile()
    claims_fill()
    advance_all(2)
    claim = NodeClaim.objects.filter(phase=P.AVAILABLE).first()
    answer = world_admin.post(f"/api/v1/claims/{claim.pk}/power/", {"action": "power-off", "reason": "maintenance"},
                              content_type="application/json")
    assert answer.status_code == 200, answer.content
    request = Event.objects.get(claim_id=claim.pk, step="power-off", data__action="power-off")
    assert "maintenance" in request.message
    assert machine_power_send(machine_id=claim.machine.pk, request_id=request.pk) == "ok"
    assert machine_power_send(machine_id=claim.machine.pk, request_id=request.pk) == "done"  # not sent twice
    assert kind.machines[claim.machine.name]["power"] == ["off"]
    machine = Machine.objects.get(pk=claim.machine.pk)
    assert (machine.power, machine.state) == ("Off", MachineState.STOPPED)
    assert Event.objects.filter(claim_id=claim.pk, data__request_id=request.pk, data__ok=True).exists()


def test_release_drains_and_deletes_the_node_then_waits_until_the_machine_is_gone(kind, tenant_api):
    reconcile()
    claims_fill()
    advance_all(2)
    claim = NodeClaim.objects.filter(phase=P.AVAILABLE).first()
    assert claim.node_name in nodes(tenant_api)
    claims_release(claims=[claim], actor="user:test", reason="done with it")
    claim.refresh_from_db()
    assert claim.phase == P.RELEASING
    machine_advance(machine_id=claim.machine.pk)  # the node goes; the kind still deletes
    assert claim.node_name not in nodes(tenant_api)
    claim.refresh_from_db()
    assert claim.phase == P.RELEASING and claim.machine.state == MachineState.DELETING
    machine_advance(machine_id=claim.machine.pk)
    claim.refresh_from_db()
    machine = Machine.objects.get(claim=claim)
    assert claim.phase == P.RELEASED
    assert machine.state == MachineState.GONE and machine.disk_proof == DiskProof.DESTROYED and machine.gone_at


def test_a_machine_that_cannot_be_made_is_deleted_and_another_made_until_the_attempts_are_spent(
        kind, tenant_api, settings):
    settings.CLAIM_MAX_ATTEMPTS = 2
    reconcile()
    claims_fill()
    kind.fail_fill = KindError("the template refers to a missing variable", retry=False)
    advance_all()
    claims = list(NodeClaim.objects.all())
    assert {c.phase for c in claims} == {P.PROVISIONING}  # its machine goes first
    assert all("missing variable" in c.message and "attempt 2 of 2" in c.message for c in claims)
    assert {m.state for m in Machine.objects.all()} == {MachineState.DELETING}
    advance_all(2)
    assert not Machine.objects.exists() and kind.released  # what was made is deleted
    assert {(c.phase, c.reason) for c in NodeClaim.objects.all()} == {(P.PENDING, "MachineFailed")}
    claims_fill()  # the second attempt fails too: the claims fail, their machines go
    advance_all()
    claims = list(NodeClaim.objects.all())
    assert {(c.phase, c.reason) for c in claims} == {(P.FAILED, "ProviderFailed")}
    assert all("missing variable" in c.message and "after 2 attempts" in c.message for c in claims)
    advance_all(2)
    assert {m.state for m in Machine.objects.all()} == {MachineState.GONE}


def test_a_machine_that_fails_before_its_node_joins_is_replaced_and_the_claim_served(kind, tenant_api):
    reconcile()
    claims_fill()
    advance_all()
    first = Machine.objects.order_by("pk").first()
    kind.broken.add(first.name)
    advance_all(3)  # failed; deleting; gone
    claim = NodeClaim.objects.get(pk=first.claim_id)
    assert claim.phase == P.PENDING and "hypervisor lost it" in claim.message
    kind.broken.clear()
    kind.machines.pop(first.name)
    claims_fill()
    advance_all(2)
    claim.refresh_from_db()
    assert claim.phase == P.AVAILABLE and claim.attempts == 2 and claim.node_name in nodes(tenant_api)
    failures = Event.objects.filter(claim_id=claim.pk, to_state=P.PENDING, message__contains="hypervisor lost it")
    assert failures.count() == 1  # the first machine's failure stays in the claim's log


def test_a_retryable_provider_problem_waits_and_says_why(kind, tenant_api):
    reconcile()
    claims_fill()
    kind.fail_fill = KindError("cluster unreachable")
    advance_all()
    assert {c.phase for c in NodeClaim.objects.all()} == {P.PROVISIONING}
    assert {m.message for m in Machine.objects.all()} == {"cluster unreachable"}
    kind.fail_fill = None
    advance_all(2)
    assert {c.phase for c in NodeClaim.objects.all()} == {P.AVAILABLE}


def test_a_machine_lost_behind_the_consoles_back_fails_its_claim(kind, tenant_api):
    reconcile()
    claims_fill()
    advance_all(2)
    claim = NodeClaim.objects.filter(phase=P.AVAILABLE).first()
    kind.broken.add(claim.machine.name)
    machine_advance(machine_id=claim.machine.pk)
    claim.refresh_from_db()
    assert claim.phase == P.FAILED and "hypervisor lost it" in claim.message


def test_the_host_allocator_leaves_external_claims_alone(kind, tenant_api, demo_site):
    reconcile()
    assert not NodeClaim.objects.filter(host__isnull=False).exists()
    assert {(c.phase, c.reason) for c in NodeClaim.objects.all()} == {(P.PENDING, "Created")}  # untouched


@pytest.fixture
def world_admin(django_user_model):
    from django.test import Client
    admin = django_user_model.objects.create_superuser("root-admin", password="x")
    client = Client()
    client.force_login(admin)
    return client
