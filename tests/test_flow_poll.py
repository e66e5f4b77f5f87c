"""The idle agent of a host that a flow drives asks in a long poll, as a warm host's does (hosts/protocol/poll.py): the
listener holds its ask until the flow queues a command for it (FLOW_POLL_S at most) and answers at once then; a held
ask never hands a command to an agent whose session or host has meanwhile lost the right to ask for it."""
import pytest

from agent.client import TokenRejected
from hosts.engine.agent import agent_command
from hosts.engine.flow import Run, Waiting
from hosts.models import AgentSession, BareMetalHost
from hosts.services import host_transition

from .factories import ask_in_thread, boot

pytestmark = pytest.mark.django_db(transaction=True)


def inspecting_agent(url: str, settings, hold_s: float = 60):
    """gpu-01 in its inspection flow, booted into the ramdisk, its agent's session open (the real agent client)."""
    from agent.client import ConsoleClient

    settings.FLOW_POLL_S, settings.AGENT_SILENCE_S = hold_s, 4 * hold_s
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state="inspecting", actor="test")
    BareMetalHost.objects.filter(pk=host.pk).update(flow={"id": "f-1", "name": "inspect", "step": "inspect"})
    client = ConsoleClient(url, timeout=5)
    session = client.lookup([host.boot_mac], "boot-1", boot(host))
    return BareMetalHost.objects.get(pk=host.pk), client, session


def held(client, session) -> dict:
    assert client.heartbeat(session, status="idle") is None  # nothing to do yet: told it may be held next time
    assert session.wait_s > 0
    box = ask_in_thread(client, session)
    box["thread"].join(1.5)
    assert box["thread"].is_alive(), box  # held: no command yet
    return box


def queue_command(host) -> None:
    with pytest.raises(Waiting, match="queued for the agent"):
        agent_command(Run(BareMetalHost.objects.get(pk=host.pk)), "inspect", {})


@pytest.mark.parametrize("wake", ["redis", "database"])
def test_an_idle_agents_ask_in_a_flow_is_held_and_answered_with_the_command_its_flow_queues(
        agent_server, demo_site, settings, wake):
    settings.WARM_POLL_TICK_S = 0.2
    if wake == "database":
        settings.REDIS_URL = ""  # the embedded mode: the held ask looks at the database
    host, client, session = inspecting_agent(agent_server.url, settings)
    assert session.wait_s == 0  # a fresh session asks plainly first
    box = held(client, session)
    assert session.wait_s == 60
    queue_command(host)
    box["thread"].join(30)  # long before the 60 s hold is over
    assert not box["thread"].is_alive() and "error" not in box, box
    assert box["answer"]["name"] == "inspect", box
    assert session.wait_s == 60  # its next idle ask, after the result, may be held too


def test_an_agent_whose_session_ended_while_its_ask_was_held_is_refused_not_given_the_command(
        agent_server, demo_site, settings):
    host, client, session = inspecting_agent(agent_server.url, settings)
    box = held(client, session)
    AgentSession.objects.filter(host=host).update(active=False)  # e.g. the boot was voided
    queue_command(host)
    box["thread"].join(30)
    assert not box["thread"].is_alive(), box
    assert isinstance(box.get("error"), TokenRejected), box


def test_an_agent_whose_host_left_the_agents_states_while_its_ask_was_held_is_refused(
        agent_server, demo_site, settings):
    host, client, session = inspecting_agent(agent_server.url, settings, hold_s=2)
    box = held(client, session)
    BareMetalHost.objects.filter(pk=host.pk).update(state="available")  # no flow of the agent's any more
    box["thread"].join(30)  # the hold ends after 2 s: nothing wakes it
    assert not box["thread"].is_alive(), box
    assert isinstance(box.get("error"), TokenRejected), box


def test_an_agents_ask_is_not_held_when_the_flow_poll_is_off(agent_server, demo_site, settings):
    host, client, session = inspecting_agent(agent_server.url, settings, hold_s=0)
    assert client.heartbeat(session, status="idle") is None
    assert session.wait_s == 0  # asked every second, as before long polls
