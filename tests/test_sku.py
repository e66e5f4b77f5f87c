"""SKU conformance (issue 15.3): a NodeType says what its servers must have; every inspection is compared with
it; a host that deviates goes to repair with the differences instead of to the pool; the API and the host page
say how it deviates; GPU labels can be derived from inspection. And the lab's faults for the fleet's health
(issue 15.5), played by its fake tools."""
import json
import os
import re
import subprocess
import sys
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from conftest import DEMO, wait_for
from events.models import Event
from hosts import services
from hosts.gate.health import parse_dcgmi, parse_nccl
from hosts.models import BareMetalHost
from lab.site import LabHost, lab_sku
from manifests.export import export_documents, export_text
from pools.models import NodeType
from pools.selectors import node_types_selecting
from pools.sku import sku_deviations

from .lab_conftest import lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
MiB = 1024 * 1024
H200 = {"gpu": {"model": "NVIDIA H200", "count": 8}, "memory": "2Ti", "nvme": {"count": 2, "minSize": "256Mi"},
        "nics": {"count": 1, "minSpeedGbps": 100}, "firmware": {"bios": "2.3.1"}}


def inventory(*, gpus=8, model="NVIDIA H200", disks=(256, 256), nic_gbps=100, ram_gib=2048, bios="2.3.1"):
    """An inventory as the agent's `inspect` reports it."""
    return {"ram_mib": ram_gib * 1024, "system": {"bios_version": bios},
            "gpus": [{"index": i, "name": model, "memory_mib": 143771} for i in range(gpus)],
            "disks": [{"name": f"nvme{i}n1", "type": "nvme", "size_bytes": size * MiB} for i, size in enumerate(disks)],
            "nics": [{"name": "eth0", "speed_gbps": nic_gbps}]}


# --- the comparison ---------------------------------------------------------------------------------

def test_a_conforming_inventory_has_no_deviation_and_each_difference_is_one_sentence():
    assert sku_deviations(H200, inventory()) == []
    assert sku_deviations({}, inventory(gpus=0)) == []
    assert sku_deviations(H200, inventory(gpus=7)) == ["GPUs: 7 of 8 NVIDIA H200"]
    assert sku_deviations(H200, inventory(disks=(128, 256))) == ["NVMe: 1 of 2 drives of at least 256 MiB",
                                                                  "nvme0n1: 128 MiB < 256 MiB"]
    assert sku_deviations(H200, inventory(model="NVIDIA H100 80GB HBM3")) == [
        "GPUs: 0 of 8 NVIDIA H200", "GPU model: NVIDIA H100 80GB HBM3, SKU NVIDIA H200"]
    assert sku_deviations(H200, inventory(nic_gbps=25, ram_gib=1536, bios="2.2.0")) == [
        "memory: 1.5 TiB < 2 TiB", "NICs: 0 of 1 at 100 Gb/s or faster", "eth0: 25 Gb/s < 100 Gb/s",
        "BIOS: 2.2.0, SKU 2.3.1"]
    # Drives beyond the count may be smaller (a boot drive); decimal sizes are shown as drives are sold.
    assert sku_deviations({"nvme": {"count": 1, "minSize": "3.84T"}},
                          {"disks": [{"name": "nvme0n1", "type": "nvme", "size_bytes": 3_840_755_982_336},
                                     {"name": "nvme1n1", "type": "nvme", "size_bytes": 480 * 10**9}]}) == []
    # Without a count, every drive (every NIC) must meet the size (the speed).
    assert sku_deviations({"nvme": {"minSize": "256Mi"}, "nics": {"minSpeedGbps": 400}}, inventory(disks=(128, 256))) == [
        "nvme0n1: 128 MiB < 256 MiB", "eth0: 100 Gb/s < 400 Gb/s"]
    # Metal3's imported hardware status: a GPU count without names, storage with sizeBytes.
    metal3 = {"gpus": 8, "ramMebibytes": 2097152, "nics": [{"name": "eth0", "speedGbps": 100}],
              "storage": [{"name": "/dev/nvme0n1", "type": "NVME", "sizeBytes": 1_600_000_000_000}]}
    assert sku_deviations({"gpu": {"model": "NVIDIA H200", "count": 8}, "nvme": {"count": 1, "minSize": "3.84T"}},
                          metal3) == ["NVMe: 0 of 1 drives of at least 3.84 TB", "nvme0n1: 1.6 TB < 3.84 TB"]


# --- the NodeType's SKU in its manifest ---------------------------------------------------------------

def site_with(sku_yaml: str) -> str:
    """demo/site.yaml with `sku:` under gpu-server (indented as its other fields)."""
    text = (DEMO / "site.yaml").read_text()
    block = "".join(f"        {line}\n" for line in sku_yaml.strip("\n").splitlines())
    return text.replace("        displayName: 8x H200 GPU server\n",
                        "        displayName: 8x H200 GPU server\n        sku:\n" + block, 1)


GOOD_SKU = """\
  gpu: {model: NVIDIA H200, count: 8}
  memory: 2Ti
  nvme: {count: 4, minSize: 3.84T}
  nics: {count: 1, minSpeedGbps: 100}
  firmware: {bios: "2.3.1"}
"""


@pytest.mark.django_db
def test_a_sku_is_applied_exported_as_written_and_applying_it_again_changes_nothing(apply, demo_site):
    apply(site_with(GOOD_SKU))
    assert NodeType.objects.get(name="gpu-server").sku == {
        "gpu": {"model": "NVIDIA H200", "count": 8}, "memory": "2Ti", "nvme": {"count": 4, "minSize": "3.84T"},
        "nics": {"count": 1, "minSpeedGbps": 100}, "firmware": {"bios": "2.3.1"}}
    assert "minSize: 3.84T" in export_text()
    assert "nodetype/gpu-server unchanged" in apply(site_with(GOOD_SKU))


@pytest.mark.django_db
@pytest.mark.parametrize("bad, where, message", [
    ("  gpu: {model: NVIDIA H200, count: seven}\n", "sku.gpu.count", "must be a whole number, 0 or more"),
    ("  gpu: {model: NVIDIA H200}\n", "sku.gpu.count", "required: how many GPUs"),
    ("  nvme: {count: 8, minSize: huge}\n", "sku.nvme.minSize", "'huge' is not a size such as 3.84T"),
    ("  nics: {count: 2, minSpeed: 100}\n", "sku.nics.minSpeed", "unknown field; expected count, minSpeedGbps"),
    ("  memory: lots\n", "sku.memory", "'lots' is not an amount of memory"),
    ("  firmware: {bios: 2.3}\n", "sku.firmware.bios", "must be a non-empty string"),
    ("  gpus: 8\n", "sku.gpus", "unknown field; expected gpu, memory, nvme, nics, firmware"),
])
def test_a_bad_sku_is_refused_with_its_place_and_changes_nothing(apply, demo_site, bad, where, message):
    before = list(NodeType.objects.order_by("name").values_list("name", "sku", "updated_at"))
    with pytest.raises(CommandError) as info:
        apply(site_with(bad), names=["site.yaml"])
    text = str(info.value)
    assert f"spec.metal3.nodeTypes[0].{where}" in text and message in text, text
    assert "(line " in text, text
    assert list(NodeType.objects.order_by("name").values_list("name", "sku", "updated_at")) == before


@pytest.mark.django_db
def test_a_host_imported_as_available_with_hardware_short_of_its_sku_is_inspected_instead(apply):
    apply(site_with(GOOD_SKU.replace("count: 4", "count: 8")))  # the demo's servers have 4 NVMe drives
    apply((DEMO / "hosts.yaml").read_text())
    states = dict(BareMetalHost.objects.values_list("name", "state"))
    assert {s for n, s in states.items() if n.startswith("gpu-")} == {"registering"}
    assert {s for n, s in states.items() if n.startswith("cpu-")} == {"available"}  # cpu-server has no SKU
    created = Event.objects.get(object_name="gpu-01", kind="transition")
    assert "does not match its SKU (gpu-server: NVMe: 4 of 8 drives of at least 3.84 TB)" in created.message
    assert created.data["imported"]["sku_deviations"] == {"gpu-server": ["NVMe: 4 of 8 drives of at least 3.84 TB"]}


# --- the API and the host page ------------------------------------------------------------------------------

@pytest.fixture
def admin(demo_site) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("sku-admin", "sku@example.invalid", "pw-sku-page-8e2f",
                                                is_staff=True, is_superuser=True))
    return client


def sku_on_page(client: Client, host: str) -> str:
    html = unescape(client.get(reverse("host", args=[host])).content.decode())
    found = re.search(r'<dd id="host-sku"[^>]*>(.*?)</dd>', html, re.DOTALL)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip() if found else ""


@pytest.mark.django_db
def test_the_host_api_and_page_show_how_a_host_deviates_from_its_sku(admin, apply):
    # The demo's hosts were imported with Metal3's status: four 3.84 TB NVMe drives each.
    apply(site_with(GOOD_SKU.replace("count: 4", "count: 8")))
    host = BareMetalHost.objects.get(name="gpu-01")
    expected = ["NVMe: 4 of 8 drives of at least 3.84 TB"]
    assert admin.get(f"/api/v1/hosts/{host.pk}/").json()["sku_deviations"] == {"gpu-server": expected}
    listed = {h["name"]: h["sku_deviations"] for h in admin.get("/api/v1/hosts/").json()["results"]}
    assert listed["gpu-01"] == {"gpu-server": expected} and listed["cpu-01"] == {}
    assert sku_on_page(admin, "gpu-01") == "Deviates from the gpu-server SKU: NVMe: 4 of 8 drives of at least 3.84 TB"

    apply(site_with(GOOD_SKU))  # the SKU the servers really have
    assert admin.get(f"/api/v1/hosts/{host.pk}/").json()["sku_deviations"] == {}
    assert sku_on_page(admin, "gpu-01") == "Conforms to the SKU of gpu-server"
    assert sku_on_page(admin, "cpu-01") == ""  # cpu-server states no SKU


@pytest.mark.django_db
def test_the_node_type_api_reads_and_writes_the_sku_with_the_same_rules(admin):
    node_type = NodeType.objects.get(name="gpu-server")
    url = f"/api/v1/nodetypes/{node_type.pk}/"
    bad = admin.patch(url, {"sku": {"gpu": {"model": "NVIDIA H200", "count": -1}}}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["sku"] == ["gpu.count: must be a whole number, 0 or more"]
    assert NodeType.objects.get(pk=node_type.pk).sku == {}
    good = admin.patch(url, {"sku": {"gpu": {"model": "NVIDIA H200", "count": 8}}}, content_type="application/json")
    assert good.status_code == 200 and good.json()["sku"] == {"gpu": {"model": "NVIDIA H200", "count": 8}}


# --- labels derived from inspection ---------------------------------------------------------------------

DERIVING = (DEMO / "site.yaml").read_text().replace("  metal3:\n", "  metal3:\n    deriveLabels: true\n", 1)


@pytest.mark.django_db
def test_derived_gpu_labels_land_on_the_host_select_node_types_and_stay_out_of_its_manifest(apply, demo_site):
    host = BareMetalHost.objects.get(name="gpu-01")
    BareMetalHost.objects.filter(pk=host.pk).update(inventory=inventory(gpus=7))
    host.refresh_from_db()
    assert services.host_derive_labels(host=host) == {}  # no provider derives labels yet: nothing written
    assert "nvidia.com/gpu.count" not in BareMetalHost.objects.get(pk=host.pk).labels

    apply(DERIVING)
    changes = services.host_derive_labels(host=host)
    assert changes == {"nvidia.com/gpu.product": [None, "NVIDIA-H200"], "nvidia.com/gpu.count": [None, "7"],
                       "nvidia.com/gpu.memory": [None, "143771"]}
    labels = BareMetalHost.objects.get(pk=host.pk).labels
    assert labels == {"role": "gpu", "rack": "r1", "nvidia.com/gpu.product": "NVIDIA-H200",
                      "nvidia.com/gpu.count": "7", "nvidia.com/gpu.memory": "143771"}
    event = Event.objects.filter(host_id=host.pk, kind="change").latest("id")
    assert "nvidia.com/gpu.count (none) → 7" in event.message and event.data["labels"] == changes

    # A NodeType may select on them like on any label.
    NodeType.objects.filter(name="gpu-server").update(
        host_selector={"matchLabels": {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "8"}})
    assert node_types_selecting(labels) == []  # 7 GPUs: not an 8-GPU server
    # Applying the host's manifest again keeps them; export leaves them out (they are the inventory's).
    assert "baremetalhost/gpu-01 unchanged" in apply((DEMO / "hosts.yaml").read_text())
    assert BareMetalHost.objects.get(pk=host.pk).labels == labels
    exported = next(d for d in export_documents() if d["kind"] == "BareMetalHost" and d["metadata"]["name"] == "gpu-01")
    assert exported["metadata"]["labels"] == {"rack": "r1", "role": "gpu"}
    # The GPU is back: the count follows the inspection.
    BareMetalHost.objects.filter(pk=host.pk).update(inventory=inventory(gpus=8))
    host.refresh_from_db()
    assert services.host_derive_labels(host=host) == {"nvidia.com/gpu.count": ["7", "8"]}
    assert node_types_selecting(BareMetalHost.objects.get(pk=host.pk).labels)[0].name == "gpu-server"


@pytest.mark.django_db
def test_derive_labels_must_be_true_or_false(apply, demo_site):
    with pytest.raises(CommandError) as info:
        apply(DERIVING.replace("deriveLabels: true", "deriveLabels: sometimes"), names=["site.yaml"])
    assert "spec.metal3.deriveLabels" in str(info.value) and "must be true or false" in str(info.value)


# --- the lab's faults, played by its fake tools -------------------------------------------------------

def tool(host: LabHost, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VMETAL_LAB_PROFILE": str(host.profile_path)}
    return subprocess.run([sys.executable, "-m", "lab.fake_tools", *args], capture_output=True, text=True, env=env,
                          cwd=str(DEMO.parent), timeout=60, check=False)


def lab_host(tmp_path, fault: str) -> LabHost:
    from lab.site import LabSite

    host = LabHost(name="gpu-01", role="gpu", mac="52:54:00:1a:00:00", password="x", directory=tmp_path / "gpu-01",
                   fault=fault, disk_bytes=64 * MiB)
    host.directory.mkdir(parents=True)
    LabSite._write_profile(host)
    return host


def dcgm(host: LabHost, level: int) -> dict:
    run = tool(host, "dcgmi", "diag", "-r", str(level), "-j")
    return parse_dcgmi(run.stdout, run.returncode)


def test_gpu_missing_and_disk_small_break_the_sku_where_the_agent_looks(tmp_path):
    missing = lab_host(tmp_path / "a", "gpu-missing")
    listed = tool(missing, "nvidia-smi", "--query-gpu=index,name", "--format=csv,noheader").stdout.splitlines()
    assert listed == [f"{i}, NVIDIA H200" for i in range(7)]
    profile = json.loads(missing.profile_path.read_text())
    assert sku_deviations(lab_sku("gpu", 64 * MiB), profile) == ["GPUs: 7 of 8 NVIDIA H200"]

    small = lab_host(tmp_path / "b", "disk-small")
    assert os.path.getsize(small.directory / "nvme0n1.img") == 32 * MiB  # the disk file itself is smaller
    assert os.path.getsize(small.directory / "nvme1n1.img") == 64 * MiB
    assert sku_deviations(lab_sku("gpu", 64 * MiB), json.loads(small.profile_path.read_text())) == [
        "NVMe: 1 of 2 drives of at least 64 MiB", "nvme0n1: 32 MiB < 64 MiB"]
    assert sku_deviations(lab_sku("gpu", 64 * MiB), lab_host(tmp_path / "c", "").profile()) == []


def test_an_intermittent_xid_fails_the_first_diagnostic_only_until_the_fault_is_set_again(tmp_path):
    host = lab_host(tmp_path, "xid-intermittent:2")
    first = dcgm(host, 2)
    assert first["verdict"] == "fail" and any("Detected XID 94 for GPU 2" in r for r in first["reasons"]), first
    assert dcgm(host, 2)["verdict"] == "pass"  # the retest
    assert (host.directory / "xid-intermittent.fired").exists()
    from lab.site import LabSite

    LabSite._write_profile(host)  # the lab starts again (or the fault is set again): armed anew
    assert dcgm(host, 2)["verdict"] == "fail"


def test_burnin_fail_passes_the_short_checks_and_fails_only_the_long_diagnostic(tmp_path):
    host = lab_host(tmp_path, "burnin-fail")
    assert dcgm(host, 1)["verdict"] == "pass" and dcgm(host, 2)["verdict"] == "pass"
    nccl = tool(host, "all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "8")
    assert parse_nccl(nccl.stdout, exit_code=nccl.returncode, min_busbw=400)["verdict"] == "pass"
    for level in (3, 4):
        burnin = dcgm(host, level)
        assert burnin["verdict"] == "fail", burnin
        assert any("did not reach desired stress level" in r and "GPU 0" in r for r in burnin["reasons"]), burnin


def test_nvlink_slow_shows_inactive_links_and_all_reduce_under_the_threshold(tmp_path):
    host = lab_host(tmp_path, "nvlink-slow:3")
    status = tool(host, "nvidia-smi", "nvlink", "--status", "-i", "3").stdout
    assert status.count("<inactive>") == 6 and status.count("26.562 GB/s") == 12, status
    assert "<inactive>" not in tool(host, "nvidia-smi", "nvlink", "--status", "-i", "0").stdout
    nccl = tool(host, "all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "8")
    parsed = parse_nccl(nccl.stdout, exit_code=nccl.returncode, min_busbw=400)
    assert parsed["verdict"] == "fail" and 300 < parsed["busbw_gbps"] < 400, parsed
    assert dcgm(host, 2)["verdict"] == "pass"  # only the bandwidth is short


# --- the whole path, in the lab -------------------------------------------------------------------------

def to_repair(host: BareMetalHost) -> Event:
    return Event.objects.filter(host_id=host.pk, kind="transition", to_state="repair").latest("id")


@pytest.mark.django_db
def test_hosts_with_a_missing_gpu_or_a_small_disk_go_to_repair_and_never_become_available_as_gpu_servers(
        lab_factory, celery_worker_process, apply):
    site = lab_factory(hosts=3, gpu_hosts=3, faults={"gpu-01": "gpu-missing", "gpu-02": "disk-small"},
                disk_bytes=96 * MiB)
    wait_hosts("available", 1, timeout=90)
    wait_hosts("repair", 2, timeout=60)
    hosts = {h.name: h for h in BareMetalHost.objects.all()}
    assert hosts["gpu-03"].state == "available", lab_report()
    for name, deviation in (("gpu-01", "GPUs: 7 of 8 NVIDIA H200"), ("gpu-02", "nvme0n1: 48 MiB < 96 MiB")):
        event = to_repair(hosts[name])
        assert event.from_state == "inspecting" and event.step == "sku_check", lab_report()
        assert deviation in event.message, event.message
        assert deviation in event.data["evidence"]["deviations"]["gpu-server"], event.data
        assert not Event.objects.filter(host_id=hosts[name].pk, to_state="available").exists()
        # Nothing past the SKU check ran: no erase, no health run for a server that is not what it claims.
        assert not hosts[name].health_runs.exists()
    assert services.host_last_repair_verdict(host=hosts["gpu-02"])["message"].endswith(
        "does not match its SKU: gpu-server: NVMe: 1 of 2 drives of at least 96 MiB; nvme0n1: 48 MiB < 96 MiB")

    # Labels derived from now on; a retest inspects again, derives them, and checks the SKU again: still 7 GPUs.
    apply(DERIVING)
    site.configure_node_types()  # the demo's manifest states no SKU: the lab's again
    gpu01 = hosts["gpu-01"]
    services.host_retest(host=gpu01, actor="user:ops")
    wait_for(lambda: Event.objects.filter(host_id=gpu01.pk, from_state="retesting", to_state="repair").exists(),
             timeout=60)
    retest = to_repair(gpu01)
    assert retest.data["retest"] == "failed" and "GPUs: 7 of 8 NVIDIA H200" in retest.message, lab_report()
    assert BareMetalHost.objects.get(pk=gpu01.pk).labels["nvidia.com/gpu.count"] == "7"


@pytest.mark.django_db
def test_an_intermittent_xid_sends_a_host_to_repair_once_and_a_burnin_fault_passes_the_release_gate(
        lab_factory, celery_worker_process):
    lab_factory(hosts=2, gpu_hosts=2, faults={"gpu-01": "xid-intermittent:5", "gpu-02": "burnin-fail"},
                disk_bytes=96 * MiB)
    wait_hosts("repair", 1, timeout=90)
    wait_hosts("available", 1, timeout=60)  # gpu-02: DCGM level 2 and NCCL pass; only a burn-in would fail it
    gpu01 = BareMetalHost.objects.get(name="gpu-01")
    failed = to_repair(gpu01)
    assert failed.step == "health_dcgm" and "Detected XID 94 for GPU 5" in failed.message, lab_report()

    services.host_retest(host=gpu01, actor="user:ops")  # the same server, nothing replaced: the Xid is gone
    wait_for(lambda: Event.objects.filter(host_id=gpu01.pk, from_state="retesting", to_state="repair").exists(),
             timeout=60)
    assert to_repair(gpu01).data.get("retest") == "passed", lab_report()
