"""The idle health tier backs off (issue 15): no idle check starts on a NodeType while claims it could serve wait
for a host, and a host whose idle check was pre-empted or ended without a result is not tried again before the
tier's interval has passed. Each skip is in the tick's answer (what the beat task returns), never an Event."""
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.phases import claims_release
from events.models import Event
from hosts.models import BareMetalHost, HealthCheckRun
from hosts.services import hosts_idle_check_start, hosts_transition_batch
from pools.models import NodePool, NodeProvider, NodeType, Tenant

from .factories import make_rails

IMAGE = "ubuntu2404-20260926"


@pytest.fixture
def site(apply):
    apply(Path("demo/site.yaml").read_text())
    NodeType.objects.filter(name="gpu-server").update(health={"idle": {"interval": "1h", "hostsAtOnce": 2}})


def make_pool(quantity: int, *, node_type: str = "gpu-server", group: dict | None = None, tenant: str = "one",
              image: str = IMAGE, name: str = "gpu") -> NodePool:
    owner, _ = Tenant.objects.get_or_create(
        name=tenant, defaults={"provider_properties": {"metal3": {"vcluster.com/os-image": image}}})
    return NodePool.objects.create(tenant=owner, name=name, provider=NodeProvider.objects.get(name="metal3"),
                                   quantity=quantity, group=group or {},
                                   node_type_selector=[{"property": "vcluster.com/node-type", "value": node_type}])


def checking() -> list[str]:
    return sorted(BareMetalHost.objects.filter(state="checking").values_list("name", flat=True))


def back_from_checking(names: list[str], reason: str) -> None:
    hosts_transition_batch(hosts=list(BareMetalHost.objects.filter(name__in=names)), to_state="available",
                           actor="system:flow", reason=reason)


def run_for(name: str) -> None:
    """A passing idle run on the host, as the idle_check flow records it."""
    host = BareMetalHost.objects.get(name=name)
    HealthCheckRun.objects.create(host=host, host_name=name, flow_id=f"f-{name}", suite="dcgmi", tier="idle",
                                  node_type="gpu-server", verdict="pass")


# --- claims waiting for a host hold the tier back -----------------------------------------------------------

@pytest.mark.django_db
def test_no_idle_check_starts_while_a_group_of_the_type_waits_and_checks_start_once_it_is_placed(site):
    make_rails({"r1": 3, "r2": 3})
    make_pool(4, group={"size": 4})
    call_command("reconcile")  # 6 free hosts, but 4 on one rail group are needed: the group waits
    assert set(NodeClaim.objects.values_list("phase", "reason")) == {("Pending", "NoGroupPlacement")}
    events = Event.objects.count()

    tick = hosts_idle_check_start()
    assert tick.started == [] and checking() == []
    assert tick.skipped["gpu-server"].startswith("held back: 4 claim(s) wait for a host: one-")
    assert tick.skipped["gpu-server"].endswith(" and 1 more")
    assert Event.objects.count() == events  # a skip writes no Event

    make_rails({"r1": 1}, start=100)  # room for the group: it is placed, nothing waits any more
    call_command("reconcile")
    assert not NodeClaim.objects.filter(phase="Pending").exists()
    tick = hosts_idle_check_start()
    assert len(tick.started) == 2 and tick.skipped == {}
    assert checking() == sorted(tick.started)


@pytest.mark.django_db
def test_a_claim_that_waits_for_something_no_host_gives_or_for_another_type_holds_nothing_back(site):
    make_rails({"r1": 2})
    BareMetalHost.objects.bulk_create([BareMetalHost(name="cpu-01", labels={"role": "cpu"}, state="available",
                                                     bmc_address="redfish://10.9.0.1/redfish/v1/Systems/1",
                                                     boot_mac="52:54:09:00:00:01")])
    make_pool(1, tenant="two", image="no-such-image")  # waits for its OS image: no host would help
    make_pool(3, node_type="cpu-server", name="cpu")  # a cpu-server claim waits for hosts gpu-servers are not
    NodeType.objects.filter(name="cpu-server").update(health={"idle": {"interval": "1h"}})
    call_command("reconcile")
    reasons = dict(NodeClaim.objects.filter(phase="Pending").values_list("pool_name", "reason").distinct())
    assert reasons == {"gpu": "OSImageNotFound", "cpu": "NoCapacity"}

    tick = hosts_idle_check_start()
    assert sorted(tick.started) == ["gpu-00000", "gpu-00001"]
    assert set(tick.skipped) == {"cpu-server"} and "2 claim(s) wait for a host" in tick.skipped["cpu-server"]


# --- a check tried, whatever became of it, counts until the tier's interval has passed --------------------------

@pytest.mark.django_db
def test_a_host_whose_check_was_pre_empted_is_not_tried_again_before_the_interval(site):
    NodeType.objects.filter(name="gpu-server").update(health={"idle": {"interval": "1h", "hostsAtOnce": 1}},
                                                      health_dcgm_level=0)  # a release gate that records no run
    make_rails({"r1": 1})
    assert hosts_idle_check_start().started == ["gpu-00000"]
    pool = make_pool(1)
    call_command("reconcile")  # a claim pre-empts the check
    claim = NodeClaim.objects.get()
    assert (claim.phase, claim.host_name) == (ClaimPhase.PROVISIONING, "gpu-00000")
    # The tenant lets it go: the host comes back through its release without a health run (dcgm level 0, no
    # NCCL); meanwhile a second host joined.
    NodePool.objects.filter(pk=pool.pk).update(quantity=0)
    claims_release(claims=[claim], actor="user:one", reason="pool shrank")
    host = BareMetalHost.objects.get(name="gpu-00000")
    assert host.state == "deprovisioning"
    hosts_transition_batch(hosts=[host], to_state="available", actor="system:flow", reason="released")
    make_rails({"r1": 1}, start=1)
    assert not HealthCheckRun.objects.exists()

    tick = hosts_idle_check_start()
    assert tick.started == ["gpu-00001"]  # not gpu-00000 again, though it was never checked either
    back_from_checking(["gpu-00001"], "idle check passed")
    run_for("gpu-00001")
    tick = hosts_idle_check_start()
    assert tick.started == []
    assert tick.skipped == {"gpu-server": "1 host(s) not tried again within 1h of an idle check that was "
                                          "pre-empted or ended without a result"}

    # An interval after its check was started, it is due again.
    Event.objects.filter(host__name="gpu-00000", to_state="checking").update(
        created_at=timezone.now() - timedelta(hours=1, minutes=1))
    assert hosts_idle_check_start().started == ["gpu-00000"]


@pytest.mark.django_db
def test_a_host_whose_check_ended_without_a_result_waits_the_interval_while_others_are_checked(site):
    make_rails({"r1": 3})
    assert sorted(hosts_idle_check_start().started) == ["gpu-00000", "gpu-00001"]
    back_from_checking(["gpu-00000", "gpu-00001"], "the idle tier had nothing to run")  # no HealthCheckRun
    tick = hosts_idle_check_start()
    assert tick.started == ["gpu-00002"]  # room for 2; the other two wait out their back-off
    assert tick.skipped["gpu-server"].startswith("2 host(s) not tried again within 1h")
    assert checking() == ["gpu-00002"]
