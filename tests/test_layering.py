"""One direction of dependencies: the import contracts hold, hosts tell claims of a move through one hook
(claims keep the table of reactions), and pools tell claims of a deletion the same way."""
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.reactions import REACTIONS
from hosts import lifecycle
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_transition, hosts_sweep_overdue
from pools.models import NodePool
from pools import services as pool_services

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db


def test_the_import_contracts_hold():
    """Apps depend downward only, the agent imports nothing of the console, no product app imports the lab
    (function-local imports included): bin/lint, which CI runs first."""
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 kept, 0 broken" in done.stdout


@pytest.fixture
def provisioning_claim(apply, demo_site, seed_block):
    from django.core.management import call_command

    apply(seed_block, tenant="one")
    call_command("reconcile")
    claim = NodeClaim.objects.get(pool_name="gpu")
    assert claim.phase == ClaimPhase.PROVISIONING
    return claim


def test_a_host_move_reaches_every_registered_receiver_inside_its_transaction(provisioning_claim, monkeypatch):
    seen = []
    monkeypatch.setattr(lifecycle, "TRANSITION_RECEIVERS", [*lifecycle.TRANSITION_RECEIVERS])
    monkeypatch.setattr("hosts.services.TRANSITION_RECEIVERS", lifecycle.TRANSITION_RECEIVERS)
    lifecycle.on_host_transition(seen.append)
    host = BareMetalHost.objects.get(pk=provisioning_claim.host_id)
    host_transition(host=host, to_state=HostState.ERROR, actor="test", reason="broken", data={"fault": "host"})
    [moved] = seen
    assert (moved.host_ids, moved.from_state, moved.to_state, moved.reason) == (
        [host.pk], HostState.PROVISIONING, HostState.ERROR, "broken")

    def refuse(moved):
        raise RuntimeError("a receiver failed")

    lifecycle.on_host_transition(refuse)
    host = BareMetalHost.objects.get(pk=host.pk)
    with pytest.raises(RuntimeError):
        host_transition(host=host, to_state=HostState.REGISTERING, actor="test")
    assert BareMetalHost.objects.get(pk=host.pk).state == HostState.ERROR  # the move rolled back with it


def test_the_sweeper_holds_no_claim_code_its_claim_moves_by_the_claims_reaction(provisioning_claim, monkeypatch):
    host = BareMetalHost.objects.get(pk=provisioning_claim.host_id)
    BareMetalHost.objects.filter(pk=host.pk).update(deadline_at=timezone.now() - timedelta(seconds=1))
    monkeypatch.setattr("hosts.services.TRANSITION_RECEIVERS", [])  # hosts on their own
    assert hosts_sweep_overdue() == [host.name]
    provisioning_claim.refresh_from_db()
    assert provisioning_claim.phase == ClaimPhase.PROVISIONING  # nothing in hosts touched the claim

    monkeypatch.undo()
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.PROVISIONING,
                                                    deadline_at=timezone.now() - timedelta(seconds=1))
    assert hosts_sweep_overdue() == [host.name]
    provisioning_claim.refresh_from_db()
    assert provisioning_claim.phase == ClaimPhase.PENDING and provisioning_claim.reason == "HostFailed"


def test_claims_keep_one_table_of_reactions_for_every_move_out_of_a_claimed_state():
    moves_out = {(frm, to) for frm in (HostState.PROVISIONING, HostState.PROVISIONED)
                 for to in lifecycle.TRANSITIONS[frm] if to != HostState.DEPROVISIONING or frm == HostState.PROVISIONING}
    assert moves_out <= set(REACTIONS), moves_out - set(REACTIONS)
    assert {(HostState.DEPROVISIONING, to) for to in lifecycle.TRANSITIONS[HostState.DEPROVISIONING]} <= set(REACTIONS)


def test_a_pool_deletion_reaches_claims_through_its_receivers_only(provisioning_claim, monkeypatch):
    pool = NodePool.objects.get(pk=provisioning_claim.pool_id)
    monkeypatch.setattr(pool_services, "POOL_DELETE_RECEIVERS", [])  # pools on their own
    pool_services.pool_delete(pool=pool, actor="test")
    provisioning_claim.refresh_from_db()
    assert not NodePool.objects.filter(pk=pool.pk).exists()
    assert provisioning_claim.phase == ClaimPhase.PROVISIONING  # pools released nothing themselves


def test_a_pool_change_reaches_the_reconciler_through_its_receivers_once_it_commits(django_capture_on_commit_callbacks,
                                                                                    provisioning_claim, monkeypatch):
    heard = []
    monkeypatch.setattr(pool_services, "POOLS_CHANGED_RECEIVERS", [lambda *, pool_ids: heard.append(pool_ids)])
    pool = NodePool.objects.get(pk=provisioning_claim.pool_id)
    with django_capture_on_commit_callbacks(execute=True):
        pool_services.pool_update(pool=pool, values={"quantity": 2}, actor="test")
        assert heard == []  # not before the change commits
    assert len(heard) == 1 and pool.pk in heard[0]  # one call for the transaction's changes (the fixture's too)


def test_a_node_type_in_use_is_named_by_the_claims_source(provisioning_claim):
    from core.errors import InUse
    from pools.models import NodeType

    with pytest.raises(InUse, match=f"in use by claim\\(s\\) {provisioning_claim.name}"):
        pool_services.node_type_delete(node_type=NodeType.objects.get(pk=provisioning_claim.node_type_id), actor="test")


@pytest.mark.parametrize("module, register, call, source", [
    ("pools.capacity", "capacity_source", lambda m: m.node_type_capacity([]), "hosts.capacity"),
    ("pools.capacity", "address_usage_source", lambda m: m.environment_addresses([]), "claims.ipam"),
    ("pools.usage", "claims_unreleased_source", lambda m: m.claims_unreleased(tenant=None), "claims.selectors"),
    ("pools.api_check", "tenant_api_check_source", lambda m: m.tenant_api_check(None, probe_now=False),
     "claims.tenant_check"),
])
def test_a_registry_without_its_source_says_which_one_is_missing(module, register, call, source, monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    registry = importlib.import_module(module)
    attribute = {"capacity_source": "_source", "address_usage_source": "_address_usage"}.get(register, "_source")
    monkeypatch.setattr(registry, attribute, None)
    with pytest.raises(ImproperlyConfigured, match=source):
        call(registry)
