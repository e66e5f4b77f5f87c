"""IPAM that cannot leak: an address row per claim, taken in the transaction that binds the claim to its host and
given back by every path that ends that binding; the leak check; overlapping ranges refused; overrides."""
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import close_old_connections, connection

from claims import reconcile
from claims.allocation import AllocationResult, claims_allocate
from claims.choices import ClaimPhase
from claims.models import AddressAllocation, NodeClaim
from claims.phases import claims_release
from claims.reconcile import pools_reconcile
from claims.tasks import free_leaked_addresses
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import hosts_transition_batch
from pools.models import NodeEnvironment

from .factories import make_hosts, make_pool

pytest_plugins = ["tests.lab_conftest"]
SERVERS = "p-default/servers"


def environment(ip_range: str, *, name: str = "servers", cidr: str = "10.0.0.1/24", extra: str = "") -> str:
    return f"""\
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata: {{name: {name}, namespace: p-default}}
spec:
  providerRef: metal3
  properties:
    metal3.vcluster.com/network-cidr: {cidr}
    metal3.vcluster.com/network-ip-range: {ip_range}
{extra}"""


@pytest.fixture
def site(apply):
    apply(Path("demo/site.yaml").read_text())


def create_claims_without_allocating(pool_ids=None):
    original = reconcile.claims_allocate
    reconcile.claims_allocate = lambda **kw: AllocationResult()
    try:
        pools_reconcile(pool_ids=pool_ids)
    finally:
        reconcile.claims_allocate = original


def rows() -> dict[str, str]:
    return dict(AddressAllocation.objects.values_list("claim_name", "address"))


def release_through_the_flow(claims: list[NodeClaim]) -> None:
    """A release as the console runs it: the claims go Releasing and their hosts deprovisioning; the flow's end
    (the host erased and available again) releases the claims (claims.reactions)."""
    claims_release(claims=claims, actor="test", reason="pool shrank")
    hosts = list(BareMetalHost.objects.filter(pk__in=[c.host_id for c in claims]))
    hosts_transition_batch(hosts=hosts, to_state=HostState.AVAILABLE, actor="system:flow", reason="cleaned")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_200_concurrent_claims_over_100_addresses_give_100_addresses_once_each_and_the_rest_wait_without_a_host(
        site, apply):
    assert connection.vendor == "postgresql"
    apply(environment("10.0.0.20-10.0.0.119"))  # 100 addresses
    make_hosts(220)
    make_pool("one", 200)
    create_claims_without_allocating()
    ids = list(NodeClaim.objects.values_list("pk", flat=True))
    assert len(ids) == 200
    errors, barrier = [], threading.Barrier(20)

    def worker(chunk):  # as the worker's reconcile does: the allocator, from many processes at once
        try:
            barrier.wait()
            for claim_id in chunk:
                claims_allocate(claim_ids=[claim_id])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=worker, args=(ids[i::20],)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    held = rows()
    assert len(held) == 100 and len(set(held.values())) == 100
    assert set(held.values()) == {f"10.0.0.{i}" for i in range(20, 120)}
    bound = NodeClaim.objects.filter(host__isnull=False)
    assert bound.count() == 100 and BareMetalHost.objects.filter(state="provisioning").count() == 100
    # The copy on the claim (pages, API, seed) is the row's.
    assert {c.name: c.ip_address for c in bound} == held
    waiting = NodeClaim.objects.filter(phase=ClaimPhase.PENDING)
    assert waiting.count() == 100 and not waiting.filter(host__isnull=False).exists()
    assert set(waiting.values_list("reason", "message")) == {
        ("NoAddress", f"no free address in environment {SERVERS}: all 100 are in use")}

    # Every release gives its address back, in the transaction that ends the claim; waiting claims take them.
    released = list(bound.order_by("pk")[:30])
    release_through_the_flow(released)
    assert set(NodeClaim.objects.filter(pk__in=[c.pk for c in released]).values_list("phase", "ip_address")) == {
        (ClaimPhase.RELEASED, None)}
    assert len(rows()) == 70 and not set(rows()) & {c.name for c in released}
    claims_allocate()
    assert len(rows()) == 100 and NodeClaim.objects.filter(phase=ClaimPhase.PENDING).count() == 70


@pytest.mark.django_db
def test_a_release_keeps_the_address_until_the_host_is_erased_and_a_lost_host_frees_it(site, apply):
    apply(environment("10.0.0.20-10.0.0.21"))
    make_hosts(3)
    make_pool("one", 3)
    call_command("reconcile")
    assert sorted(rows().values()) == ["10.0.0.20", "10.0.0.21"]
    third = NodeClaim.objects.get(phase=ClaimPhase.PENDING)
    assert (third.reason, third.host) == ("NoAddress", None)
    assert BareMetalHost.objects.filter(state="available").count() == 1
    first, second = NodeClaim.objects.filter(host__isnull=False).order_by("ip_address")
    # Releasing: the node is drained and the host erased; the address is still the node's until then.
    claims_release(claims=[first], actor="test", reason="pool shrank")
    assert rows()[first.name] == "10.0.0.20"
    hosts_transition_batch(hosts=[BareMetalHost.objects.get(pk=first.host_id)], to_state=HostState.AVAILABLE,
                           actor="system:flow", reason="cleaned")
    assert first.name not in rows()
    # A host lost while provisioning: the claim waits for another host, its address goes back meanwhile.
    hosts_transition_batch(hosts=[BareMetalHost.objects.get(pk=second.host_id)], to_state=HostState.ERROR,
                           actor="system:flow", reason="power_on_pxe failed")
    second.refresh_from_db()
    assert second.phase == ClaimPhase.PENDING and second.ip_address is None and second.name not in rows()
    call_command("reconcile")
    assert sorted(rows().values()) == ["10.0.0.20", "10.0.0.21"]
    assert AddressAllocation.objects.filter(claim_id=third.pk).exists()


@pytest.mark.django_db
def test_a_claim_deleted_behind_the_consoles_back_is_found_by_the_leak_check_and_freed_with_an_event(
        site, apply, admin_client):
    make_hosts(2)
    make_pool("one", 2)
    call_command("reconcile")
    gone, kept = NodeClaim.objects.order_by("pk")
    address = rows()[gone.name]
    with connection.cursor() as cursor:  # not through the console: SQL
        cursor.execute("DELETE FROM claims_nodeclaim WHERE id = %s", [gone.pk])
    page = admin_client.get("/environments/").content.decode()
    assert "2 used · 20 free of 22" in page and "1 leaked" in page and 'data-leaked="1"' in page
    env = NodeEnvironment.objects.get(name="servers")
    assert admin_client.get(f"/api/v1/nodeenvironments/{env.pk}/").json()["addresses"] == {
        "size": 22, "used": 2, "free": 20, "leaked": 1}

    assert free_leaked_addresses() == {"freed": [address]}  # the beat task
    assert set(rows()) == {kept.name}
    event = Event.objects.get(step="ipam_leak")
    assert event.object_name == SERVERS and address in event.message and f"its claim {gone.name} is gone" in event.message
    assert event.data["address"] == address
    assert free_leaked_addresses() == {"freed": []}
    page = admin_client.get("/environments/").content.decode()
    assert "1 used · 21 free of 22" in page and 'data-leaked="0"' in page and "1 leaked" not in page


@pytest.mark.django_db
def test_overlapping_ranges_on_one_network_are_refused_on_apply_naming_both(site, apply):
    with pytest.raises(CommandError) as refused:
        apply(environment("10.0.0.25-10.0.0.35", name="tenant-net"))
    message = str(refused.value)
    assert "NodeEnvironment p-default/tenant-net" in message and "NodeEnvironment p-default/servers" in message
    assert "10.0.0.25-10.0.0.35" in message and "10.0.0.20-10.0.0.30" in message
    assert not NodeEnvironment.objects.filter(name="tenant-net").exists()
    # Overlapping networks (a /16 around the /24) are one network too.
    with pytest.raises(CommandError, match="p-default/servers"):
        apply(environment("10.0.0.50-10.0.1.10", name="wide", cidr="10.0.0.1/16"))
    # The same network with ranges of their own is fine, and so is another network.
    apply(environment("10.0.0.60-10.0.0.70", name="tenant-net"))
    apply(environment("10.0.1.20-10.0.1.30", name="other", cidr="10.0.1.1/24"))
    assert NodeEnvironment.objects.filter(name__in=["tenant-net", "other"]).count() == 2


@pytest.mark.django_db
def test_a_network_data_override_is_honoured_and_takes_no_address(site, apply, admin_client):
    make_hosts(2)
    override = "version: 2\nethernets:\n  lan:\n    match: {macaddress: '52:54:00:00:00:00'}\n    dhcp4: true\n"
    BareMetalHost.objects.filter(name="gpu-00000").update(network_data=override)
    make_pool("one", 2)
    call_command("reconcile")
    by_host = {c.host_name: c for c in NodeClaim.objects.all()}
    assert set(by_host) == {"gpu-00000", "gpu-00001"}
    assert by_host["gpu-00000"].ip_address is None and by_host["gpu-00001"].ip_address == "10.0.0.20"
    assert set(rows()) == {by_host["gpu-00001"].name}
    from claims.ipam import claim_environment, network_data_override

    host = BareMetalHost.objects.get(name="gpu-00000")
    assert network_data_override(host, claim_environment(by_host["gpu-00000"])) == override


@pytest.mark.django_db
def test_a_network_data_annotation_is_applied_validated_and_exported(site, apply, capsys):
    host = """\
apiVersion: v1
kind: Secret
metadata: {name: bmc-n1, namespace: metal3}
stringData: {username: admin, password: pw}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: n1
  namespace: metal3
  annotations:
    metal3.vcluster.com/network-data: %s
spec:
  bmc: {address: "redfish://10.1.0.1/redfish/v1/Systems/1", credentialsName: bmc-n1}
  bootMACAddress: "52:54:00:aa:00:01"
"""
    with pytest.raises(CommandError, match="network-data"):
        apply(host % "'[not, a, mapping]'")
    assert not BareMetalHost.objects.filter(name="n1").exists()
    apply(host % "'{\"version\": 2, \"ethernets\": {\"eth0\": {\"dhcp4\": true}}}'")
    assert BareMetalHost.objects.get(name="n1").network_data == '{"version": 2, "ethernets": {"eth0": {"dhcp4": true}}}'
    capsys.readouterr()
    call_command("export")
    assert "metal3.vcluster.com/network-data" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_in_the_lab_an_overridden_hosts_seed_carries_its_network_data_as_written(
        lab_factory, celery_worker_process, apply):
    from agent.seed import SeedError, read_seed
    from conftest import wait_for

    from .lab_conftest import gpu_pool, lab_report, wait_hosts

    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    override = "version: 2\nethernets:\n  lan0:\n    match: {macaddress: '52:54:00:1a:00:01'}\n    addresses: [192.168.50.7/24]\n"
    BareMetalHost.objects.filter(name="gpu-01").update(network_data=override)
    apply(gpu_pool(1), tenant="one")
    try:
        wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).exists(), timeout=180)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    claim = NodeClaim.objects.get()
    assert claim.ip_address is None and not AddressAllocation.objects.exists()
    seeds = []
    for path in site.hosts["gpu-01"].disk_paths():
        try:
            seeds.append(read_seed(str(path)))
        except SeedError:  # the other disk holds no seed
            pass
    assert [s["network-config"] for s in seeds] == [override]
