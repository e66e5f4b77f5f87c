"""Racks, rail groups and fabric partitions (issue 14, point 4 without the allocator): hosts show where they sit;
each tenant gets a VLAN (or InfiniBand P_Key) from its environment's range with its first node, written into the
node's seed, shown on its page, in the API and in `manage.py export`, and freed when the tenant is deleted."""
import csv
import io
import threading

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import close_old_connections

from agent.seed import SeedError, read_seed
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from hosts.models import BareMetalHost
from pools.fabric import FabricRangeFull, fabric_partitions_assign
from pools.models import FabricPartition, NodeProvider, Tenant
from pools.services import tenant_delete

from .lab_conftest import gpu_pool, lab_report

pytest_plugins = ["tests.lab_conftest", "tests.console_conftest"]

ENVIRONMENT = """\
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata:
  name: servers
  namespace: p-default
spec:
  providerRef: metal3
  properties:
    metal3.vcluster.com/network-cidr: 10.0.0.1/24
    metal3.vcluster.com/network-ip-range: 10.0.0.20-10.0.0.30,10.0.0.40-10.0.0.50
    metal3.vcluster.com/dns-servers: 10.0.0.2
    vmetal.dev/fabric-vlan-range: {vlans}
"""
CPU_POOL = """\
privateNodes:
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      static:
        - name: cpu
          quantity: 1
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: cpu-server
"""


def export() -> str:
    out = io.StringIO()
    call_command("export", stdout=out)
    return out.getvalue()


def tenant(name: str) -> Tenant:
    return Tenant.objects.get_or_create(name=name)[0]


def assign(name: str) -> list[FabricPartition]:
    """What the provision flow does at a tenant's first node's seed (claims.steps.claim_fabric_partitions)."""
    return fabric_partitions_assign(tenant=tenant(name), provider_id=NodeProvider.objects.get(name="metal3").pk,
                                    actor="system:flow")


def seed_of(site, host: str) -> dict:
    for path in site.hosts[host].disk_paths():
        try:
            return read_seed(str(path))
        except (SeedError, OSError):
            continue
    raise AssertionError(f"no seed on {host}'s disks")


# --- end to end in the lab ------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_two_tenants_get_different_vlans_and_a_tenants_second_node_reuses_its_own_in_the_seed(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=3, gpu_hosts=3, tenants=["one", "two"])
    apply(ENVIRONMENT.format(vlans="100-199"))
    apply(gpu_pool(2), tenant="one")
    apply(gpu_pool(1), tenant="two")
    try:
        wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 3, timeout=240)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    vlans = dict(FabricPartition.objects.values_list("tenant__name", "value"))
    assert set(vlans) == {"one", "two"} and vlans["one"] != vlans["two"]
    assert set(vlans.values()) == {100, 101}  # the lowest free ones, one each
    assert FabricPartition.objects.get(tenant__name="one").source == "VLAN range 100-199 of NodeEnvironment " \
                                                                     "p-default/servers"
    # Each node's seed, as the agent wrote it on its disk and cloud-init reads it at first boot.
    for claim in NodeClaim.objects.select_related("tenant"):
        network = seed_of(site, claim.host_name)["network-config"]
        vlan = vlans[claim.tenant.name]
        assert f"# vmetal.dev/fabric-vlan: {vlan}\n" in network
        config = yaml.safe_load(network)
        assert config["vlans"] == {f"vlan{vlan}": {"id": vlan, "link": "eth0"}}
        assert config["ethernets"]["eth0"]["addresses"] == [f"{claim.ip_address}/24"]  # the address is kept
    # One assignment per tenant, recorded once: the second node of `one` reused it.
    assigned = Event.objects.filter(message__startswith="fabric partition VLAN")
    assert sorted(assigned.values_list("tenant__name", flat=True)) == ["one", "two"]


# --- the allocator, the range, concurrency ------------------------------------------------------------------

@pytest.mark.django_db
def test_a_full_range_keeps_the_claim_pending_with_the_reason_until_a_tenant_is_deleted(demo_site, apply):
    apply(ENVIRONMENT.format(vlans="100-100"))
    assert [p.value for p in assign("one")] == [100]
    assert [p.value for p in assign("one")] == [100]  # idempotent
    apply(CPU_POOL, tenant="two")
    call_command("reconcile", stdout=io.StringIO())
    claim = NodeClaim.objects.get(tenant__name="two")
    assert claim.phase == ClaimPhase.PENDING and claim.host is None and claim.reason == "NoFabricPartition"
    assert claim.message == ("no free VLAN for tenant two: the VLAN range 100-100 of NodeEnvironment "
                             "p-default/servers is full (1 assigned to other tenants)")
    assert not BareMetalHost.objects.exclude(state="available").exists()  # no host was touched for it
    with pytest.raises(FabricRangeFull):
        assign("two")

    tenant_delete(tenant=Tenant.objects.get(name="one"), actor="user:test")  # no nodes left: it goes at once
    assert not FabricPartition.objects.exists()
    assert Event.objects.filter(object_name="one", message="fabric partition VLAN 100 freed: the tenant is deleted",
                                actor="user:test").exists()
    call_command("reconcile", stdout=io.StringIO())
    claim.refresh_from_db()
    assert claim.phase == ClaimPhase.PROVISIONING and claim.host is not None


@pytest.mark.django_db
def test_a_tenant_whose_partition_is_held_is_not_held_back_by_a_full_range(demo_site, apply):
    apply(ENVIRONMENT.format(vlans="100-100"))
    assign("two")
    apply(CPU_POOL, tenant="two")
    call_command("reconcile", stdout=io.StringIO())
    assert NodeClaim.objects.get(tenant__name="two").phase == ClaimPhase.PROVISIONING


@pytest.mark.django_db
def test_no_range_configured_gives_no_partition_and_the_seed_as_before(demo_site, apply):
    from claims.steps import network_config

    apply(CPU_POOL, tenant="two")
    call_command("reconcile", stdout=io.StringIO())
    host = NodeClaim.objects.get(tenant__name="two").host
    assert assign("two") == [] and not FabricPartition.objects.exists()
    assert network_config(host, None) == yaml.safe_dump(
        {"version": 2, "ethernets": {"eth0": {"match": {"macaddress": host.boot_mac}, "set-name": "eth0",
                                              "dhcp4": True}}}, sort_keys=False)
    apply(ENVIRONMENT.format(vlans="100-199"))
    text = network_config(host, None)
    assert text.startswith("# vmetal.dev/fabric-vlan: 100\n")
    assert yaml.safe_load(text)["vlans"] == {"vlan100": {"id": 100, "link": "eth0"}}


@pytest.mark.django_db
def test_an_infiniband_range_on_the_provider_gives_a_pkey_noted_in_the_seed(demo_site, apply):
    from claims.steps import network_config

    provider = NodeProvider.objects.get(name="metal3")
    provider.properties = {**provider.properties, "vmetal.dev/fabric-pkey-range": "0x8001-0x80ff"}
    provider.full_clean()
    provider.save()
    apply(CPU_POOL, tenant="two")
    call_command("reconcile", stdout=io.StringIO())
    host = NodeClaim.objects.get(tenant__name="two").host
    text = network_config(host, None)
    assert text.startswith("# vmetal.dev/fabric-ib-pkey: 0x8001\n") and "vlans" not in yaml.safe_load(text)
    assert FabricPartition.objects.get().source == "P_Key range 0x8001-0x80ff of NodeProvider metal3"


@pytest.mark.django_db
@pytest.mark.parametrize("vlans, message", [
    ("100", "vmetal.dev/fabric-vlan-range: '100' is not a range such as 100-199"),
    ("0-10", "vmetal.dev/fabric-vlan-range: 0 is outside the VLAN ids 1-4094"),
    ("200-100", "vmetal.dev/fabric-vlan-range: '200-100' ends before it starts"),
    ("a-b", "vmetal.dev/fabric-vlan-range: 'a' is not a VLAN id such as 100"),
])
def test_a_bad_range_is_refused_on_apply_and_changes_nothing(demo_site, apply, vlans, message):
    with pytest.raises(CommandError) as info:
        apply(ENVIRONMENT.format(vlans=vlans))
    assert message in str(info.value)
    assert "vmetal.dev/fabric-vlan-range" not in export()


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_nodes_of_many_tenants_never_share_a_value(demo_site, apply):
    apply(ENVIRONMENT.format(vlans="100-109"))
    names = [f"t{i:02d}" for i in range(14)]
    for name in names:
        tenant(name)
    full, errors = [], []
    barrier = threading.Barrier(len(names))

    def first_node(name):
        try:
            barrier.wait()
            assign(name)
            assign(name)
        except FabricRangeFull as exc:
            full.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            close_old_connections()

    threads = [threading.Thread(target=first_node, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    values = list(FabricPartition.objects.values_list("value", flat=True))
    assert sorted(values) == list(range(100, 110))  # each once
    assert len(full) == 4 and all("is full" in message for message in full)


# --- export and apply -----------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_export_lists_the_assignments_and_applying_the_export_round_trips(demo_site, apply):
    from tests.factories import empty_the_database

    apply(ENVIRONMENT.format(vlans="100-199"))
    apply(CPU_POOL, tenant="one")
    apply(CPU_POOL, tenant="two")
    assign("two")
    assign("one")
    first = export()
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(first) if d["kind"] == "VirtualClusterInstance"}
    # The switch tool's view: each tenant's partitions on its VirtualClusterInstance.
    assert docs["two"]["metadata"]["annotations"]["vmetal.dev/fabric-partitions"] == "vlan=100"
    assert docs["one"]["metadata"]["annotations"]["vmetal.dev/fabric-partitions"] == "vlan=101"
    empty_the_database()
    lines = apply(first)
    assert "fabricpartition/one/vlan created" in lines
    assert export() == first
    assert dict(FabricPartition.objects.values_list("tenant__name", "value")) == {"one": 101, "two": 100}
    assert "fabricpartition/one/vlan unchanged" in apply(first)  # idempotent

    # A value another tenant holds, or a different one for a tenant that holds one: refused, nothing applied.
    moved = first.replace("vmetal.dev/fabric-partitions: vlan=101", "vmetal.dev/fabric-partitions: vlan=100")
    with pytest.raises(CommandError) as info:
        apply(moved)
    assert "tenant one holds VLAN 101, not 100" in str(info.value)
    with pytest.raises(CommandError) as info:
        apply(first.replace("vlan=100", "vlan=9999"))
    assert "9999 is outside the VLAN ids 1-4094" in str(info.value)
    assert export() == first


# --- pages and the API ------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_tenant_page_and_the_api_show_the_partition_to_its_members_only(client, users, apply):
    apply(ENVIRONMENT.format(vlans="100-199"))
    assign("one")
    client.force_login(users["alice"])
    page = client.get("/tenants/one/").content.decode()
    assert 'data-kind="vlan" data-value="100"' in page and "VLAN 100" in page
    body = client.get("/api/v1/tenants/").json()
    rows = body["results"] if isinstance(body, dict) else body
    assert [(t["name"], [(p["kind"], p["value"], p["value_text"]) for p in t["fabric_partitions"]]) for t in rows] \
        == [("one", [("vlan", 100, "100")])]
    client.force_login(users["bob"])
    assert "VLAN 100" not in client.get("/tenants/two/").content.decode()
    body = client.get("/api/v1/tenants/").json()
    rows = body["results"] if isinstance(body, dict) else body
    assert [t["fabric_partitions"] for t in rows] == [[]]
    # Read-only: a write that names it changes nothing.
    client.force_login(users["admin"])
    response = client.patch(f"/api/v1/tenants/{Tenant.objects.get(name='one').pk}/", {"fabric_partitions": []}, content_type="application/json")
    assert FabricPartition.objects.filter(tenant__name="one", value=100).exists(), response.content


@pytest.mark.django_db
def test_the_host_page_and_the_fleet_board_show_rack_and_rail_group(client, users):
    BareMetalHost.objects.filter(name="gpu-01").update(labels={"role": "gpu", "topology.vmetal.dev/rack": "r7",
                                                                 "topology.vmetal.dev/rail-group": "rail-a",
                                                                 "topology.vmetal.dev/fabric": "ib0"})
    client.force_login(users["admin"])
    page = client.get("/hosts/gpu-01/").content.decode()
    assert "rack r7 · rail group rail-a · fabric ib0" in page
    rack_only = client.get("/hosts/gpu-02/").content.decode()
    assert "rack r2 · rail group —" in rack_only  # the short `rack` label counts
    board = client.get("/hosts/", {"rail_group": "rail-a"}).content.decode()
    assert "r7 · rail-a" in board and 'href="/hosts/gpu-01/"' in board and 'href="/hosts/gpu-02/"' not in board
    board = client.get("/hosts/", {"rack": "r2"}).content.decode()
    assert 'href="/hosts/gpu-02/"' in board and 'href="/hosts/gpu-01/"' not in board
    # The board's CSV export carries them too, filtered the same way.
    response = client.get("/fleet/export.csv", {"rail_group": "rail-a"})
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [(r["name"], r["rack"], r["rail_group"]) for r in rows] == [("gpu-01", "r7", "rail-a")]
