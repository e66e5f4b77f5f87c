"""The world reconcile's decision after a restore (claims.restore.decide), row by row of the table in
docs/operations.md, including the rows the lab test (tests/test_restore.py) does not meet: a BMC or a tenant API that
does not answer, a release that resumes, a node labelled for another claim, a node that binds a waiting claim."""
pytest_plugins = ["tests.api_conftest"]

import pytest  # noqa: E402

from claims.choices import ClaimPhase as P  # noqa: E402
from claims.models import NodeClaim  # noqa: E402
from claims.restore import World, decide  # noqa: E402
from hosts.choices import HostState as S  # noqa: E402

pytestmark = pytest.mark.django_db


def held(host, was: str):
    host.state, host.held_from = S.HELD, was
    return host


def world_of(host, *, power="on", node=None, labels=None, unread=None, contested=None) -> World:
    world = World(unread=unread or {}, contested={host.name: contested} if contested else {})
    if power:
        world.power[host.pk] = power
    else:
        world.power_errors[host.pk] = "BMC unreachable: connection refused"
    if node:
        world.nodes[host.name] = (node, labels or {})
    return world


def verdict(world, host, was, claim, **kwargs):
    decision = decide(held(host, was), world_of(host, **kwargs), claim)
    return decision.verdict, decision.to_state, decision.bind.name if decision.bind else None


def test_each_row_of_the_table(world):
    host, claim, alpha, bravo = world.host_a, world.claim_a, world.alpha, world.bravo
    NodeClaim.objects.filter(pk=claim.pk).update(phase=P.AVAILABLE)
    claim.refresh_from_db()
    assert verdict(world, host, S.PROVISIONED, claim, power=None, node=alpha) == ("still held", None, None)
    assert verdict(world, host, S.PROVISIONED, claim, node=alpha) == ("left alone", S.PROVISIONED, None)
    assert verdict(world, host, S.PROVISIONED, claim, node=alpha, labels={"vmetal.dev/claim": claim.name}) == (
        "left alone", S.PROVISIONED, None)
    assert verdict(world, host, S.PROVISIONING, claim, node=alpha) == ("adopted", S.PROVISIONED, None)
    # Its node, but of another tenant, or labelled for another claim: not its claim's; a person decides.
    assert verdict(world, host, S.PROVISIONED, claim, node=bravo)[:2] == ("adopted: in maintenance", S.MAINTENANCE)
    assert verdict(world, host, S.PROVISIONED, claim, node=alpha, labels={"vmetal.dev/claim": "alpha-later"})[:2] == (
        "adopted: in maintenance", S.MAINTENANCE)
    assert verdict(world, host, S.DEPROVISIONING, claim, node=alpha) == ("release resumed", S.DEPROVISIONING, None)
    # Free in the database, serving a node labelled for a claim that waits for a host: bound to it.
    waiting = world.claim_b
    NodeClaim.objects.filter(pk=waiting.pk).update(phase=P.PENDING, host=None)
    assert verdict(world, host, S.AVAILABLE, None, node=bravo, labels={"vmetal.dev/claim": waiting.name}) == (
        "adopted", S.PROVISIONED, waiting.name)
    assert verdict(world, host, S.AVAILABLE, None, node=alpha, labels={"vmetal.dev/claim": waiting.name})[:2] == (
        "adopted: in maintenance", S.MAINTENANCE)  # that claim is bravo's, the node alpha's
    # No node: a claimed host is released through the gate, whatever its power; the rest go back.
    assert verdict(world, host, S.PROVISIONED, claim, power="off") == (
        "released through the gate", S.DEPROVISIONING, None)
    assert verdict(world, host, S.PROVISIONING, claim, power="on")[:2] == ("released through the gate",
                                                                         S.DEPROVISIONING)
    assert verdict(world, host, S.CHECKING, None) == ("left alone", S.AVAILABLE, None)
    assert verdict(world, host, S.ERROR, None, power="off") == ("left alone", S.ERROR, None)
    # A firmware update under way when the backup was taken is not resumed: a person checks the firmware.
    assert verdict(world, host, S.SERVICING, None, power="off") == ("left alone: in maintenance", S.MAINTENANCE, None)
    # A tenant API that did not answer: the host may serve a node there; it stays held.
    assert verdict(world, host, S.AVAILABLE, None, unread={"bravo": "tenant API unreachable"}) == (
        "still held", None, None)


def test_a_node_name_two_tenants_show_binds_no_claim_and_the_host_waits_for_a_person(world):
    # A tenant writes its own API: one that names a node after a free host, labelled for its own waiting claim, must
    # not be handed the server another tenant really runs on it.
    host, waiting = world.host_a, world.claim_b
    NodeClaim.objects.filter(pk=waiting.pk).update(phase=P.PENDING, host=None)
    decision = decide(held(host, S.AVAILABLE), world_of(host, node=world.bravo, contested=["alpha", "bravo"],
                                                        labels={"vmetal.dev/claim": waiting.name}), None)
    assert (decision.verdict, decision.to_state, decision.bind) == ("adopted: in maintenance", S.MAINTENANCE, None)
    assert decision.reason.startswith(f"tenants alpha, bravo each show a node {host.name}")
