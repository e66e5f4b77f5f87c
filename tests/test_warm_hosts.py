"""Warm hosts (hosts/flows/warm.py): a host kept on in the agent's ramdisk after its release gate, taken first by the
allocator, provisioned without power-on, network boot or lookup; powered off when idle too long or when its agent
goes silent. The lab tests run the real agent, sushy-tools BMCs and a Celery worker with beat on the real broker."""
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from claims.allocation import claims_allocate
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.reconcile import pools_reconcile
from conftest import wait_for
from events.models import Event
from hosts.models import AgentSession, BareMetalHost
from hosts.protocol.api import flow_poll_s
from manifests.export import export_documents
from pools.models import NodeType

from .lab_conftest import gpu_pool, lab_report, wait_hosts
from .factories import ask_in_thread, boot, lookup, make_hosts, make_pool, post, warm_agent

pytest_plugins = ["tests.lab_conftest"]

DEMO_SITE = (Path(__file__).resolve().parent.parent / "demo" / "site.yaml").read_text()
BOOT_STEPS = {"power_on_pxe", "agent_lookup", "inspect"}  # what a warm host's provision has none of
WARM_SITE = """\
apiVersion: management.loft.sh/v1
kind: NodeType
metadata: {{name: gpu-warm}}
spec:
  providerRef: metal3
  bareMetalHosts: {{selector: {{matchLabels: {{role: gpu}}}}}}
  {warm}
"""


# --- the setting: manifest, validation, export ---------------------------------------------------------------

@pytest.mark.django_db
def test_a_node_types_warm_setting_is_applied_and_exported_as_written(apply):
    apply(DEMO_SITE)
    apply(WARM_SITE.format(warm="warm: {hosts: 3, idleMinutes: 15}"))
    node_type = NodeType.objects.get(name="gpu-warm")
    assert (node_type.warm_hosts, node_type.warm_idle_minutes) == (3, 15)
    assert NodeType.objects.get(name="gpu-server").warm_hosts == 1  # the demo keeps one warm gpu-server
    exported = {d["metadata"]["name"]: d for d in export_documents() if d["kind"] == "NodeType"}
    assert exported["gpu-warm"]["spec"]["warm"] == {"hosts": 3, "idleMinutes": 15}
    apply(WARM_SITE.format(warm="warm: {hosts: 0}"))  # none kept warm: left out of the export
    assert "warm" not in {d["metadata"]["name"]: d for d in export_documents()
                          if d["kind"] == "NodeType"}["gpu-warm"]["spec"]


@pytest.mark.django_db
@pytest.mark.parametrize("warm, message", [
    ("warm: {hosts: -1}", "spec.warm.hosts: must be between 0 and 100000 (0: no host kept warm), not -1"),
    ("warm: {hosts: 1, idleMinutes: 0}", "spec.warm.idleMinutes: must be between 1 and 527040 minutes, not 0"),
    ("warm: {hosts: two}", "spec.warm.hosts: must be an integer, not a string"),
    ("warm: {hosts: 1, idle: 5}", "spec.warm.idle: unknown field; expected one of hosts, idleMinutes"),
    ("warm: 2", "spec.warm: must be a mapping, not an integer"),
])
def test_a_bad_warm_setting_is_refused_with_its_place_and_changes_nothing(apply, warm, message):
    apply(DEMO_SITE)
    apply(WARM_SITE.format(warm="warm: {hosts: 2, idleMinutes: 10}"))
    with pytest.raises(CommandError) as refused:
        apply(WARM_SITE.format(warm=warm))
    assert message in str(refused.value)
    node_type = NodeType.objects.get(name="gpu-warm")
    assert (node_type.warm_hosts, node_type.warm_idle_minutes) == (2, 10)


@pytest.mark.django_db
def test_the_api_sets_a_node_types_warm_hosts_and_refuses_a_bad_idle_time(apply, django_user_model):
    apply(DEMO_SITE)
    admin = django_user_model.objects.create_user("root", "r@example.invalid", "pw-pw-pw-pw", is_staff=True,
                                                  is_superuser=True)
    api = APIClient()
    api.force_authenticate(admin)
    node_type = NodeType.objects.get(name="cpu-server")
    path = f"/api/v1/nodetypes/{node_type.pk}/"
    done = api.patch(path, {"warm_hosts": 2, "warm_idle_minutes": 20}, format="json")
    assert done.status_code == 200 and (done.json()["warm_hosts"], done.json()["warm_idle_minutes"]) == (2, 20)
    refused = api.patch(path, {"warm_idle_minutes": 0}, format="json")
    assert refused.status_code == 400 and "warm_idle_minutes" in refused.json()
    node_type.refresh_from_db()
    assert (node_type.warm_hosts, node_type.warm_idle_minutes) == (2, 20)


# --- the allocator and the pages -----------------------------------------------------------------------------

@pytest.mark.django_db
def test_the_allocator_takes_a_warm_host_before_a_cold_one(apply):
    apply(DEMO_SITE)
    make_hosts(3)
    warm = BareMetalHost.objects.order_by("pk").last()  # not the first by pk: the order would pick that one
    BareMetalHost.objects.filter(pk=warm.pk).update(warm_since=timezone.now())
    make_pool("one", 1)
    pools_reconcile()
    claims_allocate()
    claim = NodeClaim.objects.get()
    assert claim.host_id == warm.pk
    # Allocated, it is no longer warm (warm is a kind of available), and the next claim takes a cold host.
    assert BareMetalHost.objects.get(pk=warm.pk).warm_since is None


@pytest.mark.django_db
def test_a_warm_host_shows_as_warm_on_its_page_the_fleet_board_and_the_api(apply, django_user_model, client):
    apply(DEMO_SITE)
    make_hosts(2)
    warm, cold = BareMetalHost.objects.order_by("pk")
    BareMetalHost.objects.filter(pk=warm.pk).update(warm_since=timezone.now(),
                                                    warm_until=timezone.now() + timedelta(minutes=30))
    admin = django_user_model.objects.create_user("root", "r@example.invalid", "pw-pw-pw-pw", is_staff=True,
                                                  is_superuser=True)
    client.force_login(admin)
    assert 'id="host-warm"' in client.get(f"/hosts/{warm.name}/").content.decode()
    assert 'id="host-warm"' not in client.get(f"/hosts/{cold.name}/").content.decode()
    board = client.get("/hosts/").content.decode()
    row = board[board.index(f'id="host-{warm.pk}"'):]
    assert "warm</span>" in row[:row.index("</tr>")]
    row = board[board.index(f'id="host-{cold.pk}"'):]
    assert "warm</span>" not in row[:row.index("</tr>")]
    api = APIClient()
    api.force_authenticate(admin)
    assert api.get(f"/api/v1/hosts/{warm.pk}/").json()["warm"] is True
    assert api.get(f"/api/v1/hosts/{cold.pk}/").json()["warm"] is False


# --- the agent protocol ------------------------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_warm_hosts_agent_keeps_its_session_and_is_told_to_ask_in_a_long_poll_and_a_cold_ones_is_refused(
        agent_client, demo_site, settings):
    from hosts.services import host_transition

    settings.WARM_POLL_S = 3
    warm, cold = BareMetalHost.objects.get(name="gpu-01"), BareMetalHost.objects.get(name="gpu-02")
    tokens = {}
    for host in (warm, cold):
        host_transition(host=host, to_state="inspecting", actor="test")
        host.boot_secret = boot(host)
        tokens[host.name] = lookup(agent_client, host)["token"]
    BareMetalHost.objects.filter(pk=warm.pk).update(warm_since=timezone.now())  # the gate's keep_warm step
    for host in (warm, cold):
        host_transition(host=BareMetalHost.objects.get(pk=host.pk), to_state="available", actor="test")
    assert AgentSession.objects.get(host=warm).active and not AgentSession.objects.get(host=cold).active
    status, answer = post(agent_client, "/agent/heartbeat", {"host_id": warm.pk, "status": "idle"}, tokens["gpu-01"])
    assert (status, answer) == (200, {"command": None, "heartbeat_s": 1, "wait_s": 3})  # ask in a long poll next
    assert post(agent_client, "/agent/heartbeat", {"host_id": cold.pk, "status": "idle"}, tokens["gpu-02"])[0] == 403
    # Allocated: the same agent asks in a provisioning host's held ask (FLOW_POLL_S) and gets the provision's first
    # command.
    host_transition(host=BareMetalHost.objects.get(pk=warm.pk), to_state="provisioning", actor="test")
    assert BareMetalHost.objects.get(pk=warm.pk).warm_since is None
    assert AgentSession.objects.get(host=warm).active
    status, answer = post(agent_client, "/agent/heartbeat", {"host_id": warm.pk, "status": "idle"}, tokens["gpu-01"])
    assert (status, answer) == (200, {"command": None, "heartbeat_s": 1, "wait_s": flow_poll_s()})


def held_ask(url: str):
    """A warm agent (warm_agent) told to long-poll, and its next idle ask in a thread, held by the listener."""
    host, client, session = warm_agent(url)
    client.heartbeat(session, status="idle")
    box = ask_in_thread(client, session)
    box["thread"].join(1.5)
    assert box["thread"].is_alive(), box  # held: no work yet
    return host, client, session, box


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wake", ["redis", "database"])
def test_a_warm_agents_long_poll_is_held_and_answered_at_once_when_its_host_gets_a_command(
        agent_server, demo_site, settings, wake):
    """The listener holds a warm agent's idle ask (WARM_POLL_S, 60 s here) and answers it with the command as
    soon as one is queued: woken through Redis, or (the embedded mode, no Redis) by its look at the database."""
    import time

    from hosts.engine.agent import agent_command
    from hosts.engine.flow import Run, Waiting
    from hosts.services import host_transition

    settings.WARM_POLL_S = 60
    settings.WARM_POLL_TICK_S = 0.2
    if wake == "database":
        settings.REDIS_URL = ""
    host, client, session = warm_agent(agent_server.url)
    assert client.heartbeat(session, status="idle") is None and session.wait_s == 60  # told to long-poll
    box = ask_in_thread(client, session)
    box["thread"].join(1.5)
    assert box["thread"].is_alive(), box  # held: no work yet
    seen = AgentSession.objects.get(host=host, active=True).last_seen_at

    # A claim takes it: the provision's first step queues a command for its agent (hosts.engine.agent.agent_command).
    host_transition(host=host, to_state="provisioning", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"id": "f-1", "name": "provision", "step": "check_tenant_api"})
    started = time.monotonic()
    with pytest.raises(Waiting, match="queued for the agent"):
        agent_command(Run(BareMetalHost.objects.get(pk=host.pk)), "check_endpoint", {"host": "127.0.0.1", "port": 6443})
    box["thread"].join(30)
    assert not box["thread"].is_alive() and "error" not in box, box
    assert box["answer"]["name"] == "check_endpoint", box
    assert time.monotonic() - started < 30  # long before the 60 s hold was over
    assert session.wait_s == flow_poll_s() > 0  # provisioning: its next idle ask may be held too (FLOW_POLL_S)
    assert AgentSession.objects.get(host=host, active=True).last_seen_at > seen  # heard from when woken


@pytest.mark.django_db(transaction=True)
def test_a_warm_agents_held_ask_is_refused_when_its_host_stops_being_warm(agent_server, demo_site, settings):
    from agent.client import TokenRejected
    from hosts.flows.warm import host_warm_end

    settings.WARM_POLL_S = 60
    host, _, _, box = held_ask(agent_server.url)
    assert host_warm_end(host=host, reason="test", actor="test")  # no BMC password here: no power call
    box["thread"].join(30)
    assert not box["thread"].is_alive() and isinstance(box.get("error"), TokenRejected), box


@pytest.mark.django_db(transaction=True)
def test_a_warm_agent_gets_one_held_ask_at_a_time(agent_server, demo_site, settings):
    """Whoever holds a warm agent's token cannot tie up the listener's threads: while one ask is held, the
    session's next one is answered at once."""
    settings.WARM_POLL_S = 60
    host, client, session, first = held_ask(agent_server.url)
    second = ask_in_thread(client, session)
    second["thread"].join(30)
    assert not second["thread"].is_alive() and second.get("answer", "x") is None, second
    assert first["thread"].is_alive()  # still held
    from hosts.flows.warm import host_warm_end

    host_warm_end(host=host, reason="test", actor="test")  # ends the held ask (no thread outlives the test)
    first["thread"].join(30)
    assert not first["thread"].is_alive()


def raw_held_ask(url: str, session) -> "socket.socket":
    """The warm agent's idle long poll sent over a socket of the test's own, which it can drop at will."""
    import json
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    body = json.dumps({"host_id": session.host_id, "status": "idle", "wait_s": 60}).encode()
    sock = socket.create_connection((where.hostname, where.port), timeout=10)
    sock.sendall(b"POST /agent/heartbeat HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (where.netloc.encode(), session.token.encode(), len(body), body))
    return sock


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("wake", ["redis", "database"])
def test_a_held_ask_whose_client_is_gone_lets_go_and_its_command_reaches_the_agents_next_ask(
        agent_server, demo_site, settings, wake):
    """The agent's connection drops while its ask is held (a reset, a proxy's timeout): the listener notices and
    ends the hold, so the command queued next is not marked sent into the dead connection; the agent's next ask
    is held as usual and receives it."""
    from django.core.cache import cache

    from hosts.engine.agent import agent_command
    from hosts.engine.flow import Run, Waiting
    from hosts.models import CommandStatus, HostCommand
    from hosts.protocol.poll import held_key
    from hosts.services import host_transition

    settings.WARM_POLL_S = 60
    settings.WARM_POLL_TICK_S = 0.2
    if wake == "database":
        settings.REDIS_URL = ""
    host, client, session = warm_agent(agent_server.url)
    client.heartbeat(session, status="idle")  # told to long-poll
    held = held_key(AgentSession.objects.get(host=host, active=True).pk)
    sock = raw_held_ask(agent_server.url, session)
    wait_for(lambda: cache.get(held), timeout=10)
    sock.close()
    wait_for(lambda: cache.get(held) is None, timeout=15)  # let go long before its 60 s

    box = ask_in_thread(client, session)
    wait_for(lambda: cache.get(held), timeout=10)  # the next ask is held, not answered at once
    host_transition(host=host, to_state="provisioning", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"id": "f-1", "name": "provision", "step": "check_tenant_api"})
    with pytest.raises(Waiting, match="queued for the agent"):
        agent_command(Run(BareMetalHost.objects.get(pk=host.pk)), "check_endpoint", {"host": "127.0.0.1", "port": 6443})
    box["thread"].join(30)
    assert not box["thread"].is_alive() and box.get("answer", {}).get("name") == "check_endpoint", box
    assert HostCommand.objects.get(host=host).status == CommandStatus.SENT


@pytest.mark.django_db
def test_a_warm_hosts_agent_counts_as_silent_only_after_a_whole_long_poll_and_the_silence(demo_site, settings):
    """Between two asks of a warm agent lie up to WARM_POLL_S: the sweep allows that and AGENT_SILENCE_S on top."""
    from hosts.flows.warm import hosts_warm_sweep, warm_session

    settings.WARM_POLL_S, settings.AGENT_SILENCE_S = 100, 20
    host = BareMetalHost.objects.get(name="gpu-01")
    BareMetalHost.objects.filter(pk=host.pk).update(warm_since=timezone.now(),
                                                    warm_until=timezone.now() + timedelta(minutes=30))
    session = AgentSession.objects.create(host=host, boot_id="b", token_hash="h" * 64)
    AgentSession.objects.filter(pk=session.pk).update(last_seen_at=timezone.now() - timedelta(seconds=110))
    assert warm_session(host.pk) is not None and hosts_warm_sweep() == []  # 110 s: within a poll and the silence
    AgentSession.objects.filter(pk=session.pk).update(last_seen_at=timezone.now() - timedelta(seconds=125))
    assert warm_session(host.pk) is None
    assert hosts_warm_sweep() == ["gpu-01"]
    assert "not heard from for more than 120s" in Event.objects.get(host=host, step="warm_end").message


# --- in the lab ----------------------------------------------------------------------------------------------

@pytest.fixture
def warm_worker(worker_settings):
    """After lab_factory's FAST settings: beat sweeps warm hosts every second and a joining node is looked at
    twice a second (so that the order in which two claims are Ready is the order of their work, not of a poll)."""
    worker_settings.update(WITH_BEAT="1", WARM_SWEEP_EVERY_S="1", NODE_READY_POLL_S="0.5")
    return worker_settings


@pytest.fixture
def long_poll(lab_factory, warm_worker, settings):
    """After lab_factory's FAST settings (WARM_POLL_S 3 s): a warm agent's ask is held for a minute, as in
    production, so a claim reaches it only through the wake (hosts/protocol/poll.py)."""
    warm_worker["WARM_POLL_S"] = "60"
    settings.WARM_POLL_S = 60.0
    return warm_worker


def claim_of(host: str) -> NodeClaim:
    return NodeClaim.objects.get(host_name=host)


def steps_of(claim: NodeClaim) -> list[str]:
    return list(Event.objects.filter(claim=claim, kind="step", message="started", data__flow="provision")
                .order_by("id").values_list("step", flat=True))


def available_at(claim: NodeClaim):
    return Event.objects.get(claim=claim, kind="transition", to_state=ClaimPhase.AVAILABLE).created_at


def powered(site, host: str) -> str:
    return site.redfish.state(host)["power_state"]


@pytest.mark.django_db(transaction=True)
def test_of_a_warm_and_a_cold_host_the_warm_one_is_ready_first_without_power_on_boot_or_lookup(
        lab_factory, long_poll, celery_worker_process, apply):
    site = lab_factory(hosts=2, gpu_hosts=2, tenants=["one"], warm=1, power_delay=(1.5, 1.5))
    wait_hosts("available", 2)
    # Warm count respected: of two hosts that passed their gate, one stays on in the ramdisk, the other is off.
    warm = BareMetalHost.objects.get(warm_since__isnull=False)
    cold = BareMetalHost.objects.exclude(pk=warm.pk).get()
    assert cold.warm_since is None
    assert warm.warm_until == warm.warm_since + timedelta(minutes=30)
    wait_for(lambda: powered(site, cold.name) == "Off", timeout=10)
    assert powered(site, warm.name) == "On"
    assert AgentSession.objects.filter(host=warm, active=True).exists()
    keep = Event.objects.filter(host=warm, step="keep_warm", message="done").get()
    assert keep.data["warm"] is True and keep.data["warm_hosts"] == "1 of 1"
    assert Event.objects.filter(host=cold, step="keep_warm", message="done").get().data["warm"] is False
    assert not Event.objects.filter(host=warm, step="power_off", data__flow="inspect").exists()

    # Its agent's ask is held for a minute (long_poll): the claim's first command reaches it through the wake, or
    # the provision would find it silent (AGENT_SILENCE_S 4 s) and go the cold way, with boot steps.
    apply(gpu_pool(2), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 2, timeout=120)
    on_warm, on_cold = claim_of(warm.name), claim_of(cold.name)
    assert available_at(on_warm) < available_at(on_cold), lab_report()
    warm_steps, cold_steps = steps_of(on_warm), steps_of(on_cold)
    assert not BOOT_STEPS & set(warm_steps), warm_steps
    assert warm_steps[:2] == ["check_tenant_api", "write_image"], warm_steps
    assert {"power_on_pxe", "agent_lookup"} <= set(cold_steps), cold_steps
    assert site.read_disk(warm.name, 0, 16) == b"VMETAL-LAB-IMAGE"


@pytest.mark.django_db(transaction=True)
def test_a_warm_host_idle_past_its_time_is_powered_off_and_then_provisioned_cold(
        lab_factory, warm_worker, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"], warm=1)
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get(warm_since__isnull=False)
    assert powered(site, host.name) == "On"
    # Its idle minutes are over (warm_until is warm_since + idleMinutes): the beat's sweep powers it off.
    BareMetalHost.objects.filter(pk=host.pk).update(warm_until=timezone.now())
    wait_for(lambda: BareMetalHost.objects.get(pk=host.pk).warm_since is None, timeout=15)
    ended = Event.objects.get(host=host, step="warm_end")
    assert ended.message.startswith("no longer warm: idle since")
    assert not AgentSession.objects.filter(host=host, active=True).exists()
    wait_for(lambda: powered(site, host.name) == "Off", timeout=10)

    apply(gpu_pool(1), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 1, timeout=120)
    assert {"power_on_pxe", "agent_lookup"} <= set(steps_of(claim_of(host.name)))


@pytest.mark.django_db(transaction=True)
def test_a_warm_host_whose_agent_dies_is_no_longer_warm_and_its_claim_succeeds_cold(
        lab_factory, warm_worker, celery_worker_process, apply):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"], warm=1)
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get(warm_since__isnull=False)
    site.kill_agent(host.name)  # the ramdisk hangs; the power stays on
    # AGENT_SILENCE_S (4 s here) without a heartbeat, then the next sweep: not warm, powered off.
    wait_for(lambda: BareMetalHost.objects.get(pk=host.pk).warm_since is None, timeout=20)
    assert "its agent was not heard from" in Event.objects.get(host=host, step="warm_end").message
    wait_for(lambda: powered(site, host.name) == "Off", timeout=10)

    apply(gpu_pool(1), tenant="one")
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).count() == 1, timeout=120)
    steps = steps_of(claim_of(host.name))
    assert {"power_on_pxe", "agent_lookup"} <= set(steps), steps
