"""Adopt (Ironic's adopt): a server that already runs an OS, installed outside the console, and serves a tenant's node is
registered as provisioned, bound to the claim of that node, neither powered nor re-imaged; its first release goes through
the full release gate. Bad input (a wrong BMC password, a BMC nobody answers on, a node of another tenant) is refused
with a clear error and changes nothing."""
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from claims.tenant_api import TenantAPI
from conftest import wait_for
from hosts.choices import HostState
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun, HostCommand
from hosts.services import host_delete
from pools.models import Tenant

from .lab_conftest import closed_port, gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]


def adopt(site, tmp_path, *, password=None, address=None, tenant="one", name="gpu-01"):
    secret = tmp_path / "bmc-password"
    secret.write_text((password or site.hosts[name].password) + "\n")
    call_command("adopt", name, "--bmc-address", address or site.redfish.system_address(name),
                 "--bmc-username", "admin", "--bmc-password-file", str(secret), "--boot-mac", site.hosts[name].mac,
                 "--label", "role=gpu", "--tenant", tenant)


def test_a_running_server_is_adopted_without_a_power_action_and_its_first_release_runs_the_gate(
        lab_factory, celery_worker_process, apply, tmp_path):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one", "two"])
    wait_hosts("available", 1, timeout=150)
    # The console forgets the server; someone installs an OS on it outside the console and joins it to tenant one as the
    # node of the claim that waits for a host there.
    host_delete(host=BareMetalHost.objects.get(name="gpu-01"), actor="user:test")
    apply(gpu_pool(1), tenant="one")
    claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.PENDING).first())
    site.redfish.power_changed("gpu-01", "On", cause="installed-outside")
    token = TenantAPI(Tenant.objects.get(name="one").kubeconfig).create_bootstrap_token()
    site.tenants["one"].kubelet_join(token.token, "gpu-01", labels={"vmetal.dev/claim": claim.name})
    mark = max(e["seq"] for e in site.redfish.events())

    # Refused, each with its reason, and nothing changed.
    refusals = [({"password": "not-the-password"}, "401"),
                ({"address": f"redfish+http://127.0.0.1:{closed_port()}/redfish/v1/Systems/gpu-01"}, "unreachable"),
                ({"tenant": "two"}, "node gpu-01 belongs to tenant one, not two")]
    for kwargs, words in refusals:
        with pytest.raises(CommandError) as refused:
            adopt(site, tmp_path, **kwargs)
        assert words in str(refused.value), str(refused.value)
        assert "not-the-password" not in str(refused.value)
        assert not BareMetalHost.objects.exists()
        assert NodeClaim.objects.get(pk=claim.pk).phase == ClaimPhase.PENDING

    adopt(site, tmp_path)
    host = BareMetalHost.objects.get(name="gpu-01")
    claim.refresh_from_db()
    assert (host.state, claim.phase, claim.host_id, claim.node_name) == (
        HostState.PROVISIONED, ClaimPhase.AVAILABLE, host.pk, "gpu-01")
    assert not HostCommand.objects.filter(host=host).exists()  # not inspected, not re-imaged
    assert site.redfish.events(mark) == []  # not powered
    assert site.tenants["one"].objects("nodes")[0]["metadata"]["name"] == "gpu-01"

    # Its first release: the whole gate (drain and delete its node, erase with certificates, health), then the pool.
    apply(gpu_pool(0), tenant="one")
    try:
        wait_for(lambda: BareMetalHost.objects.filter(pk=host.pk, state=HostState.AVAILABLE).exists(), timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    assert EraseCertificate.objects.filter(host=host, result="pass").count() == len(site.hosts["gpu-01"].disks())
    assert HealthCheckRun.objects.filter(host=host, verdict="pass").exists()
    assert site.tenants["one"].objects("nodes") == []
    assert NodeClaim.objects.get(pk=claim.pk).phase == ClaimPhase.RELEASED
