"""Auto Nodes' pod watchers: a tenant's unschedulable pods become its demand (PendingPod rows) through a watch of its
Kubernetes API (the lab's), batched into one decision per burst, resumed after a dropped stream, backed off alone
when the tenant API is down, and run by `manage.py watch-pods` as a process that stops cleanly."""
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from autonodes.choices import DemandStatus, WatchState
from autonodes.models import PendingPod, TenantWatch
from autonodes.watcher import Supervisor, backoff_s, parse_shard
from conftest import wait_for
from lab.kube import PODS, TenantAPIServer, TenantEmulator
from pools.models import NodePool, Tenant
from pools.services import pool_delete, tenant_set_api

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

SITE = (ROOT / "demo" / "site.yaml").read_text()
DYNAMIC = """\
privateNodes:
  enabled: true
  autoNodes:
    - provider: metal3
      properties:
        vcluster.com/os-image: ubuntu2404-20260926
      dynamic:
        - name: gpu-auto
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: gpu-server
          limits:
            nodes: "4"
"""


@pytest.fixture(autouse=True)
def quick(settings):
    settings.AUTONODES_WATCH_POLL_S = 0.3
    settings.AUTONODES_WATCH_BACKOFF_S = 0.2
    settings.AUTONODES_WATCH_BACKOFF_MAX_S = 1
    settings.AUTONODES_BATCH_IDLE_S = 1
    settings.AUTONODES_BATCH_MAX_S = 10
    settings.TENANT_API_TIMEOUT_S = 2


@pytest.fixture
def lists(monkeypatch):
    """How many lists and watches of pods each lab tenant API served: {("list" | "watch", admin token): n}
    (the emulator's handlers, counted from before the servers start)."""
    counts: dict[tuple[str, str], int] = {}
    serve_list, serve_watch = TenantEmulator._serve_list, TenantEmulator._serve_watch

    def count(self, what, request):
        if request.resource == PODS:
            counts[what, self.admin_token] = counts.get((what, self.admin_token), 0) + 1

    async def counting_list(self, request):
        count(self, "list", request)
        return await serve_list(self, request)

    def counting_watch(self, request):
        count(self, "watch", request)
        return serve_watch(self, request)

    monkeypatch.setattr(TenantEmulator, "_serve_list", counting_list)
    monkeypatch.setattr(TenantEmulator, "_serve_watch", counting_watch)
    return counts


@pytest.fixture
def expire(monkeypatch, lists):
    """expire["watches"] = n: the lab's next n pod watches answer with an ERROR event, 410 Gone (a resourceVersion
    older than the API server's watch history), as kube-apiserver does."""
    state = {"watches": 0}
    serve_watch = TenantEmulator._serve_watch

    async def watch(self, request):
        if request.resource == PODS and state["watches"] > 0:
            state["watches"] -= 1
            yield b""
            yield {"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure",
                                               "code": 410, "reason": "Expired",
                                               "message": "too old resource version"}}
            return
        async for item in serve_watch(self, request):
            yield item

    monkeypatch.setattr(TenantEmulator, "_serve_watch", watch)
    return state


@pytest.fixture
def acme(lists):
    with TenantAPIServer("acme") as server:
        yield server


@pytest.fixture
def globex(lists):
    with TenantAPIServer("globex") as server:
        yield server


def tenant_with_dynamic_pool(apply, name: str, server: TenantAPIServer | None) -> Tenant:
    apply(SITE)
    apply(DYNAMIC, tenant=name)
    tenant = Tenant.objects.get(name=name)
    if server is not None:
        tenant_set_api(tenant=tenant, api_endpoint=server.endpoint, kubeconfig=server.kubeconfig(), actor="test")
    return tenant


@pytest.fixture
def kubectl_of():
    """The tenant's own kubectl (the official client with its kubeconfig), to make and change pods."""
    clients = []

    def make(server: TenantAPIServer) -> client.CoreV1Api:
        api = config.new_client_from_config_dict(yaml.safe_load(server.kubeconfig()), persist_config=False)
        clients.append(api)
        return client.CoreV1Api(api)

    yield make
    for api in clients:
        api.close()


@pytest.fixture
def decisions():
    """The decisions the supervisor asked for, as (tenant id, when)."""
    return []


@pytest.fixture
def supervisor(decisions):
    started = []

    def start(**kwargs) -> Supervisor:
        sup = Supervisor(send=lambda tenant_ids: decisions.extend((t, time.monotonic()) for t in tenant_ids), **kwargs).start()
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop()


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/0 nodes are available: no nodes available to schedule pods."}


def pending_pod(kubectl, name: str, gpus: int = 8, owner: str | None = "train-7", namespace: str = "default",
                owner_kind: str = "Job", **spec) -> dict:
    """A pod as the tenant's scheduler leaves one it could not place: Pending, PodScheduled False Unschedulable."""
    body = {
        "metadata": {"name": name, "labels": {"app": "train"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": owner_kind, "name": owner,
                                          "uid": "0b8c6c8e-0000-4000-8000-000000000001", "controller": True}]
                     if owner else []},
        "spec": {"containers": [{"name": "c", "image": "trainer",
                                 "resources": {"requests": {"cpu": "4", "memory": "16Gi"},
                                               "limits": {"nvidia.com/gpu": str(gpus)}}}], **spec},
        "status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]},
    }
    return kubectl.create_namespaced_pod(namespace, body)


def merge(kubectl, name: str, patch: dict, namespace: str = "default"):
    return kubectl.patch_namespaced_pod(name, namespace, patch, _content_type="application/merge-patch+json")


def rows(tenant) -> dict[str, PendingPod]:
    return {str(p): p for p in PendingPod.objects.filter(tenant=tenant)}


def watch_of(tenant) -> TenantWatch | None:
    return TenantWatch.objects.filter(tenant=tenant).first()


def watching(tenant) -> bool:
    return (w := watch_of(tenant)) is not None and w.state == WatchState.WATCHING


def close_watches(server: TenantAPIServer) -> None:
    """The tenant API ends every open watch stream (as an API server restart or a load balancer would)."""
    server.call(lambda emu: asyncio.ensure_future(emu.close_watches()))


# -- demand


def test_unschedulable_pods_become_pending_pods_and_leave_when_bound_or_deleted(apply, acme, kubectl_of, supervisor,
                                                                                decisions):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    kubectl.create_namespace({"metadata": {"name": "ml"}})
    pending_pod(kubectl, "before-0", namespace="ml")  # there before the watcher starts: found by its list
    kubectl.create_namespaced_pod("default", {  # a scheduled pod is no demand
        "metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "nginx"}], "nodeName": "n1"},
        "status": {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}})
    supervisor()
    wait_for(lambda: set(rows(tenant)) == {"ml/before-0"}, timeout=15)

    pending_pod(kubectl, "train-7-0")
    pending_pod(kubectl, "train-7-1", gpus=4, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists",
                                                           "effect": "NoSchedule"}],
                nodeSelector={"workload": "gpu"})
    pending_pod(kubectl, "gpu-plugin", owner="nvidia-device-plugin", owner_kind="DaemonSet")  # follows nodes
    kubectl.create_namespaced_pod("default", {  # Pending but gated: not the scheduler's "Unschedulable"
        "metadata": {"name": "gated"}, "spec": {"containers": [{"name": "c", "image": "x"}],
                                                "schedulingGates": [{"name": "example.com/quota"}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                       "reason": "SchedulingGated"}]}})
    wanted = {"ml/before-0", "default/train-7-0", "default/train-7-1"}
    found = wait_for(lambda: set(r := rows(tenant)) == wanted and r, timeout=10)
    pod = found["default/train-7-1"]
    assert (pod.owner, pod.status, pod.claim_id) == ("Job/train-7", DemandStatus.NEW, None)
    assert pod.requests == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "4"}
    assert pod.node_selector == {"workload": "gpu"}
    assert pod.tolerations == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    said = next(c.message for c in kubectl.read_namespaced_pod("train-7-1", "default").status.conditions
                if c.type == "PodScheduled")
    wait_for(lambda: PendingPod.objects.get(pk=pod.pk).scheduler_message == said, timeout=10)
    assert pod.uid == kubectl.read_namespaced_pod("train-7-1", "default").metadata.uid
    assert watching(tenant) and watch_of(tenant).connected_at is not None

    # The scheduler binds one (nodeName, Running), the other is deleted: both leave the demand.
    merge(kubectl, "train-7-0", {"spec": {"nodeName": "gpu-node-1"}, "status": {
        "phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}})
    kubectl.delete_namespaced_pod("train-7-1", "default")
    wait_for(lambda: set(rows(tenant)) == {"ml/before-0"}, timeout=10)
    wait_for(lambda: watch_of(tenant).last_event_at is not None and watch_of(tenant).resource_version, timeout=10)


def test_the_consoles_answer_stays_until_the_pods_spec_changes(apply, acme, kubectl_of, supervisor, decisions):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    supervisor()
    wait_for(lambda: watching(tenant), timeout=15)
    pending_pod(kubectl, "train-7-0")
    wait_for(lambda: len(decisions) == 1, timeout=10)
    PendingPod.objects.filter(tenant=tenant).update(status=DemandStatus.WAITING, reason="not added: limit nodes 4")

    # A CPU node joins; the scheduler looks again and writes a new message: still the same demand, the same answer.
    kubectl.create_node({"metadata": {"name": "cpu-node-1"}, "status": {
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}]}})
    wait_for(lambda: "Insufficient nvidia.com/gpu" in PendingPod.objects.get(tenant=tenant).scheduler_message,
             timeout=10)
    time.sleep(1.5)
    pod = PendingPod.objects.get(tenant=tenant)
    assert (pod.status, pod.reason) == (DemandStatus.WAITING, "not added: limit nodes 4")
    assert len(decisions) == 1

    # A new toleration is another demand: decided again, from scratch.
    merge(kubectl, "train-7-0", {"spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}})
    wait_for(lambda: PendingPod.objects.get(tenant=tenant).status == DemandStatus.NEW, timeout=10)
    assert PendingPod.objects.get(tenant=tenant).reason == ""
    wait_for(lambda: len(decisions) == 2, timeout=10)


# -- batching


def test_twenty_pods_arriving_over_three_seconds_make_one_decision(apply, acme, kubectl_of, supervisor, decisions):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    supervisor()
    wait_for(lambda: watching(tenant), timeout=15)
    assert decisions == []  # nothing pending, nothing to decide

    began = time.monotonic()
    for i in range(20):
        time.sleep(0.16 if i else 0)
        pending_pod(kubectl, f"train-7-{i}")
    last = time.monotonic()
    assert last - began >= 3
    wait_for(lambda: PendingPod.objects.filter(tenant=tenant).count() == 20, timeout=10)
    wait_for(lambda: decisions, timeout=5)
    time.sleep(2)  # longer than the idle window: nothing else comes

    assert [tenant_id for tenant_id, _ in decisions] == [tenant.pk]
    assert decisions[0][1] - last >= 0.9  # it waited for the idle window after the last pod


def test_a_steady_trickle_of_pods_is_cut_into_batches_at_the_maximum_window(apply, acme, kubectl_of, supervisor,
                                                                            decisions, settings):
    settings.AUTONODES_BATCH_MAX_S = 1.5
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    supervisor()
    wait_for(lambda: watching(tenant), timeout=15)

    began = time.monotonic()
    for i in range(9):  # one every 0.5 s, always inside the 1 s idle window
        pending_pod(kubectl, f"trickle-{i}")
        time.sleep(0.5)
    wait_for(lambda: PendingPod.objects.filter(tenant=tenant).count() == 9, timeout=10)
    time.sleep(1.5)

    assert 2 <= len(decisions) <= 4
    assert decisions[0][1] - began < 2.5  # closed at its maximum, not when the trickle ended


# -- resumption and faults


def test_a_dropped_stream_resumes_from_its_resource_version_without_listing_or_deciding_again(
        apply, acme, kubectl_of, supervisor, decisions, lists):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    sup = supervisor()
    wait_for(lambda: watching(tenant), timeout=15)
    for i in range(3):
        pending_pod(kubectl, f"train-7-{i}")
    wait_for(lambda: len(decisions) == 1, timeout=10)
    assert lists["list", acme.token] == 1 and lists["watch", acme.token] == 1

    for dropped in range(2):
        close_watches(acme)
        # It watches again at once, from where it was.
        wait_for(lambda n=2 + dropped: lists["watch", acme.token] == n, timeout=10)
    pending_pod(kubectl, "late")  # seen through the resumed watch
    wait_for(lambda: "default/late" in rows(tenant), timeout=10)
    wait_for(lambda: len(decisions) == 2, timeout=10)
    time.sleep(1.5)

    assert lists["list", acme.token] == 1  # resumed, never listed again
    assert sup.watchers[tenant.pk].lists == 1
    assert len(decisions) == 2  # the three pods were not decided again; the late one was
    assert PendingPod.objects.filter(tenant=tenant).count() == 4
    assert watching(tenant) and watch_of(tenant).failures == 0


def test_an_expired_resource_version_lists_again_without_deciding_the_same_pods_again(
        expire, apply, acme, kubectl_of, supervisor, decisions, lists):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    sup = supervisor()
    wait_for(lambda: watching(tenant), timeout=15)
    for i in range(3):
        pending_pod(kubectl, f"train-7-{i}")
    wait_for(lambda: len(decisions) == 1, timeout=10)

    expire["watches"] = 1
    close_watches(acme)
    wait_for(lambda: lists["list", acme.token] == 2, timeout=10)  # 410: listed again, at once
    time.sleep(1.5)  # longer than the idle window
    assert len(decisions) == 1  # the list found the same three pods: nothing to decide again
    pending_pod(kubectl, "late")
    wait_for(lambda: "default/late" in rows(tenant), timeout=10)
    wait_for(lambda: len(decisions) == 2, timeout=10)  # for the late pod only: the list found nothing new
    time.sleep(1.5)
    assert len(decisions) == 2 and watching(tenant)

    expire["watches"] = 4  # a server that keeps answering 410 is not asked in a tight loop
    close_watches(acme)
    wait_for(lambda: watch_of(tenant).state == WatchState.BACKING_OFF, timeout=10)
    assert "410" in watch_of(tenant).error
    wait_for(lambda: expire["watches"] == 0 and watching(tenant), timeout=15)
    assert sup.watchers[tenant.pk].lists == lists["list", acme.token] <= 2 + 4
    assert PendingPod.objects.filter(tenant=tenant).count() == 4


def test_a_tenant_api_that_goes_down_backs_off_alone_and_recovers(apply, acme, globex, kubectl_of, supervisor,
                                                                   decisions, lists):
    one = tenant_with_dynamic_pool(apply, "acme", acme)
    two = tenant_with_dynamic_pool(apply, "globex", globex)
    supervisor()
    wait_for(lambda: watching(one) and watching(two), timeout=15)
    pending_pod(kubectl_of(acme), "stale")
    wait_for(lambda: "default/stale" in rows(one), timeout=10)

    acme.stop()
    down = wait_for(lambda: (w := watch_of(one)).state == WatchState.BACKING_OFF and w, timeout=15)
    assert down.error.startswith(f"tenant API unreachable: http://{acme.endpoint}")
    assert down.failures >= 1 and down.retry_at is not None
    assert acme.token not in down.error
    failures = wait_for(lambda: (w := watch_of(one)).failures >= 3 and w, timeout=15)  # it keeps trying, backing off
    assert failures.state == WatchState.BACKING_OFF

    pending_pod(kubectl_of(globex), "other-tenant")  # the other tenant is watched all along
    wait_for(lambda: "default/other-tenant" in rows(two), timeout=10)
    assert watching(two) and watch_of(two).failures == 0

    acme.start()  # back on the same port, with an empty store: the stale pod went while nobody watched
    wait_for(lambda: watching(one), timeout=15)
    assert watch_of(one).failures == 0 and watch_of(one).error == ""
    wait_for(lambda: rows(one) == {}, timeout=10)  # listed again after the outage, and resynced
    pending_pod(kubectl_of(acme), "after")
    wait_for(lambda: "default/after" in rows(one), timeout=10)


def test_a_rejected_kubeconfig_is_reported_without_its_token(apply, acme, supervisor, caplog):
    tenant = tenant_with_dynamic_pool(apply, "acme", None)
    wrong = acme.kubeconfig().replace(acme.token, "not-the-token-but-still-a-secret-1234")
    tenant_set_api(tenant=tenant, api_endpoint=acme.endpoint, kubeconfig=wrong, actor="test")
    supervisor()

    down = wait_for(lambda: (w := watch_of(tenant)) and w.state == WatchState.BACKING_OFF and w, timeout=15)
    assert down.error == "tenant API rejected credentials (401)"
    assert "not-the-token-but-still-a-secret-1234" not in caplog.text  # (the leak check reads every log too)

    tenant_set_api(tenant=tenant, api_endpoint=acme.endpoint, kubeconfig=acme.kubeconfig(), actor="test")
    wait_for(lambda: watching(tenant), timeout=15)  # a new kubeconfig: a new watcher, no restart needed


def test_a_tenant_without_dynamic_pools_is_not_watched_and_one_that_loses_its_pool_stops(apply, acme, kubectl_of,
                                                                                       supervisor):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    apply("privateNodes:\n  enabled: true\n", tenant="static-only")
    sup = supervisor()
    wait_for(lambda: watching(tenant), timeout=15)
    pending_pod(kubectl_of(acme), "train-7-0")
    wait_for(lambda: rows(tenant), timeout=10)
    assert not TenantWatch.objects.filter(tenant__name="static-only").exists()

    pool_delete(pool=NodePool.objects.get(tenant=tenant, name="gpu-auto"), actor="test")
    wait_for(lambda: watch_of(tenant).state == WatchState.STOPPED, timeout=10)
    assert rows(tenant) == {}  # nobody watches it now: no stale demand
    assert tenant.pk not in sup.watchers


def test_shards_split_the_tenants_by_id(apply, acme, supervisor):
    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    assert parse_shard("1/3") == (1, 3)
    for bad in ("3/3", "x", "1/0", "-1/2"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
    count = 2
    assert set(Supervisor(shard=(tenant.pk % count, count)).wanted()) == {tenant.pk}
    assert set(Supervisor(shard=((tenant.pk + 1) % count, count)).wanted()) == set()


def test_back_off_doubles_with_jitter_up_to_its_cap():
    for failures, ceiling in ((1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (50, 60)):
        delays = [backoff_s(failures, base=1, cap=60) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered


# -- the command


def test_manage_py_watch_pods_runs_as_a_process_sends_one_decide_and_stops_on_sigterm_and_sigint(
        apply, acme, kubectl_of, subprocess_env, celery_worker_process, tmp_path):
    from tests.api_conftest import watch_child_log
    from django.conf import settings

    tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    kubectl = kubectl_of(acme)
    env = {**subprocess_env, "AUTONODES_WATCH_POLL_S": "0.3", "PYTHONUNBUFFERED": "1",
           "CELERY_QUEUE_PREFIX": settings.CELERY_QUEUE_PREFIX}  # the test worker's queues
    for sig in (signal.SIGTERM, signal.SIGINT):
        log = tmp_path / f"watch-pods-{sig.name}.log"
        watch_child_log(log)
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "manage.py", "watch-pods"], cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(lambda: watching(tenant), timeout=30)
            if sig == signal.SIGTERM:
                for i in range(5):
                    pending_pod(kubectl, f"train-7-{i}")
                wait_for(lambda: PendingPod.objects.filter(tenant=tenant).count() == 5, timeout=15)
                wait_for(lambda: "autonodes.tasks.decide" in celery_worker_process.log.read_text(), timeout=15)
            proc.send_signal(sig)
            assert proc.wait(10) == 0, log.read_text()[-3000:]  # it stops at once: a hang is TimeoutExpired
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        output = log.read_text()
        assert "pod watchers stopped" in output
        assert "Traceback" not in output
        assert watch_of(tenant).state == WatchState.STOPPED
    def received() -> int:
        return sum("Task autonodes.tasks.decide[" in line and "received" in line
                   for line in celery_worker_process.log.read_text().splitlines())

    # One for the batch of five; one at the second start, which found demand pending (sent at the latest when
    # that process stopped: an open batch is sent, not dropped).
    wait_for(lambda: received() >= 2, timeout=15)
    time.sleep(1)
    assert received() == 2
    wait_for(lambda: celery_worker_process.log.read_text().count("autonodes.tasks.decide[") >= 4, timeout=15)
    assert "succeeded" in celery_worker_process.log.read_text().split("Task autonodes.tasks.decide[")[-1]
    assert PendingPod.objects.filter(tenant=tenant).count() == 5  # a stop keeps the demand for the next start

    bad = subprocess.run([sys.executable, "manage.py", "watch-pods", "--shard", "2/2"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 1 and "want 0 <= I < N" in bad.stderr


# -- several processes: leases


def watch_count(logs: list[Path], tenant_name: str) -> list[int]:
    """Per process, its running watches of the tenant, from what it logged: started, less given up or lost."""
    counts = []
    for log in logs:
        text = log.read_text()
        counts.append(text.count(f"pod watch of tenant {tenant_name}: started")
                      - text.count(f"pod watch of tenant {tenant_name}: given to another watcher")
                      - text.count(f"pod watch of tenant {tenant_name}: its lease lapsed"))
    return counts


def holder_pid(tenant) -> int | None:
    watch = watch_of(tenant)
    return int(watch.holder.split(":")[1]) if watch is not None and watch.holder else None


def test_two_watch_pods_processes_share_the_tenants_and_a_killed_ones_tenants_move_to_the_other(
        apply, acme, globex, kubectl_of, spawn, subprocess_env, tmp_path):
    from autonodes.models import PodWatcher
    from tests.api_conftest import watch_child_log
    from tests.test_beat_leader import unread_queues

    first_tenant = tenant_with_dynamic_pool(apply, "acme", acme)
    second_tenant = tenant_with_dynamic_pool(apply, "globex", globex)
    env = {**subprocess_env, "AUTONODES_WATCH_POLL_S": "0.5", "AUTONODES_WATCH_LEASE_S": "6",
           "PYTHONUNBUFFERED": "1", **unread_queues()}  # decisions go to queues nobody reads
    procs, logs = [], []
    for i in range(2):
        logs.append(tmp_path / f"watch-pods-{i}.log")
        watch_child_log(logs[-1])
        with open(logs[-1], "w") as out:
            procs.append(spawn([sys.executable, "manage.py", "watch-pods"], cwd=ROOT, env=env, stdout=out,
                               stderr=subprocess.STDOUT))
        if i == 0:  # the first one alone takes both; the second's arrival gives it its share
            wait_for(lambda: watching(first_tenant) and watching(second_tenant), timeout=30)

    def shared() -> bool:
        pids = {holder_pid(first_tenant), holder_pid(second_tenant)}
        return pids == {p.pid for p in procs} and watching(first_tenant) and watching(second_tenant)

    wait_for(shared, timeout=30)
    for name in ("acme", "globex"):
        assert sorted(watch_count(logs, name)) == [0, 1], (name, watch_count(logs, name))  # watched once
    assert PodWatcher.objects.count() == 2

    # The holder of acme's watch dies without a word: its lease lapses and the other takes acme too.
    victim = next(p for p in procs if p.pid == holder_pid(first_tenant))
    survivor = next(p for p in procs if p is not victim)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(10)
    killed = time.monotonic()
    wait_for(lambda: holder_pid(first_tenant) == survivor.pid and watching(first_tenant), timeout=30)
    assert time.monotonic() - killed <= 30  # the lease's promise: AUTONODES_WATCH_LEASE_S plus a poll
    assert holder_pid(second_tenant) == survivor.pid
    pending_pod(kubectl_of(acme), "after-the-move")
    wait_for(lambda: "default/after-the-move" in rows(first_tenant), timeout=15)  # the new holder records demand

    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(15) == 0
    assert holder_pid(first_tenant) is None and holder_pid(second_tenant) is None  # a clean stop gives them back
    assert "Traceback" not in "".join(log.read_text() for log in logs)
