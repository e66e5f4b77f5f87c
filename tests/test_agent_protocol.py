"""The console's side of the agent protocol: per-boot tokens, commands, results. A stale, forged or
foreign token gets 403 and changes nothing."""
import json

import pytest

from hosts.models import AgentSession, BareMetalHost, CommandStatus, HostCommand
from hosts.protocol.api import flow_poll_s
from hosts.services import host_transition

from .factories import boot, lookup, post

pytestmark = pytest.mark.django_db


@pytest.fixture
def inspecting(demo_site):
    """gpu-01 and gpu-02 booted into the ramdisk (inspecting), each with an inspect command queued; each
    host's `boot_secret` is what its boot path delivered."""
    hosts = []
    for name in ("gpu-01", "gpu-02"):
        host = BareMetalHost.objects.get(name=name)
        host_transition(host=host, to_state="inspecting", actor="test")
        BareMetalHost.objects.filter(pk=host.pk).update(flow={"name": "inspect", "id": f"flow-{name}"})
        HostCommand.objects.create(host=host, flow_id=f"flow-{name}", step="inspect", name="inspect")
        host = BareMetalHost.objects.get(pk=host.pk)
        host.boot_secret = boot(host)
        hosts.append(host)
    return hosts


def test_lookup_by_mac_gives_the_host_and_a_token_kept_only_as_a_hash(agent_client, inspecting):
    body = lookup(agent_client, inspecting[0])
    assert body["host"] == "gpu-01" and body["host_id"] == inspecting[0].pk and len(body["token"]) > 30
    assert (body["heartbeat_s"], body["progress_s"]) == (1, 2)  # ask for work each second, report progress each 2
    session = AgentSession.objects.get(host=inspecting[0])
    assert body["token"] not in session.token_hash


def test_an_unknown_mac_or_a_host_not_booting_the_agent_is_refused(agent_client, inspecting):
    assert post(agent_client, "/agent/lookup", {"macs": ["52:54:00:ff:ff:ff"], "boot_secret": "x" * 43})[0] == 403
    available = BareMetalHost.objects.get(name="cpu-01")
    assert post(agent_client, "/agent/lookup", {"macs": [available.boot_mac], "boot_secret": "x" * 43})[0] == 403
    assert post(agent_client, "/agent/lookup", {"macs": "not a list"})[0] == 400


def test_a_heartbeat_hands_out_the_queued_command_once_and_a_result_closes_it(agent_client, inspecting):
    host = inspecting[0]
    token = lookup(agent_client, host)["token"]
    status, body = post(agent_client, "/agent/heartbeat", {"host_id": host.pk, "status": "idle"}, token)
    assert status == 200 and body["command"]["name"] == "inspect"
    command_id = body["command"]["id"]
    post(agent_client, "/agent/heartbeat", {"host_id": host.pk, "status": "busy", "command_id": command_id,
                                      "progress": 42}, token)
    assert HostCommand.objects.get(host=host).progress == 42
    status, _ = post(agent_client, "/agent/result", {"host_id": host.pk, "command_id": command_id, "ok": True,
                                               "result": {"cpu": {"count": 192}}}, token)
    command = HostCommand.objects.get(host=host)
    assert status == 200 and command.status == CommandStatus.DONE and command.result == {"cpu": {"count": 192}}
    # the same result again (a lost answer) changes nothing
    assert post(agent_client, "/agent/result", {"host_id": host.pk, "command_id": command_id, "ok": False,
                                          "error": "late"}, token)[0] == 200
    assert HostCommand.objects.get(host=host).status == CommandStatus.DONE
    # Nothing more to do: its next idle ask may be held until the flow queues another command (FLOW_POLL_S).
    assert post(agent_client, "/agent/heartbeat", {"host_id": host.pk, "status": "idle"}, token)[1] == {
        "command": None, "heartbeat_s": 1, "wait_s": flow_poll_s()}


@pytest.mark.parametrize("who", ["forged", "stale", "foreign", "missing"])
def test_a_bad_token_gets_403_and_changes_nothing(agent_client, inspecting, who):
    host, other = inspecting
    stale = lookup(agent_client, host)["token"]
    current = lookup(agent_client, host, secret=boot(host))["token"]  # a second boot: the first token is now stale
    foreign = lookup(agent_client, other)["token"]
    token = {"forged": current[:-4] + "AAAA", "stale": stale, "foreign": foreign, "missing": None}[who]
    command = HostCommand.objects.get(host=host)
    for path, body in (("/agent/heartbeat", {"host_id": host.pk, "status": "idle"}),
                       ("/agent/result", {"host_id": host.pk, "command_id": f"c-{command.pk}", "ok": True,
                                          "result": {"forged": True}})):
        status, answer = post(agent_client, path, body, token)
        assert status == 403, (path, answer)
        assert "token" not in json.dumps(answer).lower().replace("token is not valid", "").replace(
            "token belongs", "").replace("missing or malformed token", "")
    command.refresh_from_db()
    assert command.status == CommandStatus.QUEUED and command.result == {} and command.sent_at is None
    # the current token still works
    assert post(agent_client, "/agent/heartbeat", {"host_id": host.pk, "status": "idle"}, current)[1]["command"]
