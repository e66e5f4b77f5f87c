"""Durations are parsed once (pools.validators.parse_duration), by the rules the validator accepts them with, and
a pool's terminationGracePeriod reaches each eviction as written."""
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError

from claims.steps import step_drain_node
from claims.tenant_api import TenantAPI
from hosts.engine.flow import Waiting
from lab.kube import TenantAPIServer, kubelet_join
from pools.validators import parse_duration, validate_duration


@pytest.mark.parametrize("text, length", [
    ("1h30m", timedelta(hours=1, minutes=30)), ("90.5s", timedelta(seconds=90.5)),
    ("500ms", timedelta(milliseconds=500)), ("0s", timedelta(0)), ("720h", timedelta(days=30)),
    ("1m0.25s", timedelta(seconds=60.25)), ("Never", None)])
def test_each_form_the_validator_accepts_parses_to_its_length_and_never_to_no_limit(text, length):
    validate_duration(text)
    assert parse_duration(text) == length


@pytest.mark.parametrize("text", ["30", "1d", "5 m", "-1s", "never", "1h30", "s", "1.s", ""])
def test_anything_else_is_refused_by_the_parser(text):
    with pytest.raises(ValueError):
        parse_duration(text)
    if text:  # blank is "not set" for the validator
        with pytest.raises(ValidationError):
            validate_duration(text)


@pytest.fixture
def tenant():
    with TenantAPIServer("acme") as server:
        yield server


def first_drain_pass(tenant, grace: str) -> dict[str, int | None]:
    """The release's drain step, one pass, for a node of a pool with this terminationGracePeriod: the grace
    period of each eviction the tenant's API was asked for."""
    console = TenantAPI(tenant.kubeconfig(), timeout=5)
    token = console.create_bootstrap_token()
    kubelet_join(tenant.endpoint, token.token, "gpu-node-1")
    claim = SimpleNamespace(node_name="gpu-node-1", bootstrap_token_id=token.id,
                            tenant=SimpleNamespace(name="acme", kubeconfig=tenant.kubeconfig()),
                            pool=SimpleNamespace(termination_grace_period=grace))
    flow = {"data": {}}
    run = SimpleNamespace(claim=claim, flow=flow, data=flow["data"], save_flow=lambda: None)
    try:
        step_drain_node(run)
    except Waiting:
        pass  # pods terminating: the next drive looks again
    return dict(tenant.evictions())


@pytest.mark.parametrize("grace, asked", [("0s", 0), ("90.5s", 91), ("500ms", 1), ("1h30m", 5400),
                                          ("", 7), ("Never", None)])
def test_a_drain_asks_for_the_pools_termination_grace_period_as_written(tenant, settings, grace, asked, monkeypatch):
    settings.DRAIN_GRACE_S = 7  # unset: the console's default; Never: each pod's own
    # The pass runs outside a drive (no host row): the pods left make it wait, without a try recorded on a host.
    monkeypatch.setattr("claims.steps.step_retry", lambda run, error, recheck_s: Waiting(error, recheck_s))
    assert first_drain_pass(tenant, grace) == {"default/notebook-gpu-node-1": asked,
                                               "default/trainer-gpu-node-1": asked}
