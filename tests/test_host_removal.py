"""Removing hosts (issue 16.3): one service (hosts.services.host_delete) behind the API, `manage.py delete -f`
and the Django admin; only a host no flow drives and no tenant uses goes, and its certificates, health runs and
Events stay. `delete -f` removes catalogue objects too, all or nothing."""
import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from claims.models import NodeClaim
from events.models import Event
from hosts.admin import BareMetalHostAdmin
from hosts.choices import HostState
from hosts.engine import drive as engine
from hosts.lifecycle import IllegalTransition
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun
from hosts.services import REMOVABLE_STATES, host_delete, host_transition
from pools.models import (
    NodeEnvironment,
    NodePool,
    NodeProvider,
    NodeType,
    OSImage,
    Tenant,
)
from tests.api_conftest import gate_evidence

pytestmark = pytest.mark.django_db

HOST = """apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: {name}
  namespace: metal3
spec:
  bmc:
    address: redfish+http://127.0.0.1:8001/redfish/v1/Systems/{name}
    credentialsName: {name}-bmc
  bootMACAddress: 52:54:00:00:00:01
"""
SECRET = """apiVersion: v1
kind: Secret
metadata:
  name: {name}-bmc
  namespace: metal3
"""


def free_host(world, role: str = "gpu") -> BareMetalHost:
    return BareMetalHost.objects.filter(state="available", name__startswith=role).order_by("name").first()


def set_state(host: BareMetalHost, state: str) -> BareMetalHost:
    """Test setup: put a host in `state` directly (the paths there are other tests' business)."""
    BareMetalHost.objects.filter(pk=host.pk).update(state=state)
    host.refresh_from_db()
    return host


@pytest.fixture
def delete(tmp_path, capsys):
    """delete(*texts, tenant=None, dry_run=False, ignore_not_found=False) → the output lines of `manage.py delete`."""

    def run(*texts: str, tenant=None, dry_run=False, ignore_not_found=False):
        args = []
        for i, text in enumerate(texts):
            path = tmp_path / f"delete{i}.yaml"
            path.write_text(text)
            args += ["-f", str(path)]
        args += ["--tenant", tenant] if tenant else []
        args += ["--dry-run"] if dry_run else []
        args += ["--ignore-not-found"] if ignore_not_found else []
        capsys.readouterr()
        call_command("delete", *args)
        return capsys.readouterr().out.splitlines()

    return run


# --- the service ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", HostState.values)
def test_a_host_is_deleted_only_in_a_removable_state(world, state):
    host = set_state(free_host(world), state)
    if state in REMOVABLE_STATES:
        host_delete(host=host, actor="user:test")
        assert not BareMetalHost.objects.filter(pk=host.pk).exists()
    else:
        with pytest.raises(IllegalTransition, match=f"{host.name} cannot be deleted: the host is {state}"):
            host_delete(host=host, actor="user:test")
        assert BareMetalHost.objects.filter(pk=host.pk, state=state).exists()
    assert set(REMOVABLE_STATES) == {"available", "maintenance", "error", "repair", "retired"}


def test_a_host_serving_a_claim_is_refused_whatever_its_state(world):
    host = set_state(world.host_a, HostState.ERROR)  # a host in error that still holds alpha's claim
    with pytest.raises(IllegalTransition, match="a host serving a tenant must be released first"):
        host_delete(host=host, actor="user:test")
    assert NodeClaim.objects.get(pk=world.claim_a.pk).host_id == host.pk


def test_certificates_health_runs_and_events_outlive_the_host(world):
    host = free_host(world)
    cert, run = gate_evidence(host, flow_id="release-old", tenant="alpha")
    events_before = set(Event.objects.filter(host_id=host.pk).values_list("pk", flat=True))
    assert events_before
    host_delete(host=host, actor="user:ada-admin")
    cert, run = EraseCertificate.objects.get(pk=cert.pk), HealthCheckRun.objects.get(pk=run.pk)
    assert (cert.host_id, cert.host_name, run.host_id, run.host_name) == (None, host.name, None, host.name)
    kept = Event.objects.filter(host_id=host.pk)
    assert events_before < set(kept.values_list("pk", flat=True))
    deleted = kept.get(message="deleted")
    assert (deleted.kind, deleted.object_type, deleted.object_name, deleted.from_state, deleted.actor) == (
        "change", "host", host.name, "available", "user:ada-admin")


def test_a_drive_of_a_deleted_host_asks_for_no_further_drive(world, django_capture_on_commit_callbacks):
    host = free_host(world)
    host_delete(host=host, actor="user:test")
    with django_capture_on_commit_callbacks() as callbacks:
        engine.drive(host.pk)
    assert callbacks == []  # on main: a drive every 0.3 s, for ever
    # A host that exists but that another worker drives is looked at again (the check above can fail).
    other = free_host(world)
    BareMetalHost.objects.filter(pk=other.pk).update(drive_lease_until="2999-01-01T00:00:00Z")
    with django_capture_on_commit_callbacks() as callbacks:
        engine.drive(other.pk)
    assert len(callbacks) == 1


# --- the API ----------------------------------------------------------------------------------------------

def test_an_admin_deletes_a_free_host_over_the_api(world, api):
    host = free_host(world)
    for role, status in (("member_a", 403), ("auditor", 403), ("anonymous", 401)):
        assert api(role, "delete", f"/api/v1/hosts/{host.pk}/").status_code == status
    assert BareMetalHost.objects.filter(pk=host.pk).exists()
    response = api("admin", "delete", f"/api/v1/hosts/{host.pk}/")
    assert response.status_code == 204
    assert api("admin", "get", f"/api/v1/hosts/{host.pk}/").status_code == 404
    assert Event.objects.get(host_id=host.pk, message="deleted").actor == "user:ada-admin"


def test_a_refused_delete_is_a_409_with_the_reason_and_changes_nothing(world, api):
    inspecting = host_transition(host=free_host(world), to_state=HostState.INSPECTING, actor="user:test")
    events = Event.objects.count()
    busy = api("admin", "delete", f"/api/v1/hosts/{inspecting.pk}/")
    assert busy.status_code == 409
    assert "the host is inspecting: a flow drives it now" in busy.json()["detail"]
    serving = api("admin", "delete", f"/api/v1/hosts/{world.host_a.pk}/")
    assert serving.status_code == 409
    assert f"it serves claim {world.claim_a.name}: a host serving a tenant must be released first" in \
        serving.json()["detail"]
    assert BareMetalHost.objects.filter(pk__in=[inspecting.pk, world.host_a.pk]).count() == 2
    assert Event.objects.count() == events


def test_a_node_type_in_use_is_refused_with_409_and_a_spare_one_is_deleted(world, api):
    in_use = api("admin", "delete", f"/api/v1/nodetypes/{NodeType.objects.get(name='gpu-server').pk}/")
    assert in_use.status_code == 409
    assert f"in use by claim(s) {world.claim_a.name}" in in_use.json()["detail"]
    assert NodeType.objects.filter(name="gpu-server").exists()
    assert api("admin", "delete", f"/api/v1/nodetypes/{world.spare_type.pk}/").status_code == 204
    assert not NodeType.objects.filter(pk=world.spare_type.pk).exists()


# --- manage.py delete -f ----------------------------------------------------------------------------------

def test_delete_f_removes_a_host_and_its_secret_as_kubectl_prints_it(world, delete):
    host = free_host(world)
    out = delete(SECRET.format(name=host.name) + "---\n" + HOST.format(name=host.name))
    assert out == [f"baremetalhost/{host.name} deleted", f"secret/metal3/{host.name}-bmc deleted"]
    assert not BareMetalHost.objects.filter(pk=host.pk).exists()
    assert Event.objects.get(host_id=host.pk, message="deleted").actor.startswith("cli:")


def test_delete_f_dry_run_prints_what_would_go_and_deletes_nothing(world, delete):
    host = free_host(world)
    events = Event.objects.count()
    out = delete(HOST.format(name=host.name), dry_run=True)
    assert out == [f"baremetalhost/{host.name} deleted (dry run)"]
    assert BareMetalHost.objects.filter(pk=host.pk).exists() and Event.objects.count() == events


def test_delete_f_is_all_or_nothing_and_names_the_document_line_and_reason(world, delete):
    free = free_host(world)
    text = HOST.format(name=free.name) + "---\n" + HOST.format(name=world.host_a.name)
    events = Event.objects.count()
    with pytest.raises(CommandError) as refused:
        delete(text)
    message = str(refused.value)
    assert "delete0.yaml: document 2 (line 15): metadata.name: " in message
    assert f"{world.host_a.name} cannot be deleted: it serves claim" in message
    assert BareMetalHost.objects.filter(pk__in=[free.pk, world.host_a.pk]).count() == 2
    assert Event.objects.count() == events


def test_delete_f_says_what_is_not_found_unless_told_to_ignore_it(world, delete):
    host = free_host(world)
    text = HOST.format(name="gpu-99") + "---\n" + HOST.format(name=host.name)
    with pytest.raises(CommandError, match=r"document 1 \(line 4\): metadata.name: baremetalhost/gpu-99 not found"):
        delete(text)
    assert BareMetalHost.objects.filter(pk=host.pk).exists()
    assert delete(text, ignore_not_found=True) == [f"baremetalhost/{host.name} deleted"]


def test_delete_f_keeps_a_secret_that_a_remaining_host_uses(world, delete):
    host = free_host(world)
    with pytest.raises(CommandError, match=f"secret/metal3/{host.name}-bmc holds the BMC credentials of "
                                           f"baremetalhost {host.name}"):
        delete(SECRET.format(name=host.name))


def test_delete_f_removes_catalogue_objects_tenants_and_pools_through_their_services(world, delete):
    spare_provider = NodeType.objects.create(name="spare-provider-type", provider=world.spare_provider,
                                             host_selector={"matchLabels": {"role": "none"}})
    catalogue = f"""apiVersion: management.loft.sh/v1
kind: OSImage
metadata:
  name: {world.spare_image.name}
---
apiVersion: management.loft.sh/v1
kind: NodeEnvironment
metadata:
  name: {world.spare_env.name}
  namespace: p-default
---
apiVersion: management.loft.sh/v1
kind: NodeType
metadata:
  name: {world.spare_type.name}
---
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata:
  name: {world.spare_provider.name}
"""
    assert delete(catalogue) == [
        "nodeenvironment/p-default/spare-env deleted", "osimage/spare-image deleted", "nodetype/spare-type deleted",
        f"nodetype/{spare_provider.name} deleted", "nodeprovider/spare deleted"]
    assert not (OSImage.objects.filter(name="spare-image").exists() or NodeType.objects.filter(
        name__startswith="spare").exists() or NodeProvider.objects.filter(name="spare").exists()
        or NodeEnvironment.objects.filter(name="spare-env").exists())
    # A node type a claim uses stays, and so does everything else in the run.
    in_use = "apiVersion: management.loft.sh/v1\nkind: NodeType\nmetadata:\n  name: gpu-server\n"
    with pytest.raises(CommandError, match=f"node type gpu-server is in use by claim.s. {world.claim_a.name}"):
        delete(in_use + "---\n" + HOST.format(name=free_host(world).name))
    assert NodeType.objects.filter(name="gpu-server").exists()
    # A vcluster.yaml's pools (with --tenant), and a tenant holding a node (it goes once its claims are released).
    pools = "privateNodes:\n  autoNodes:\n    - provider: metal3\n      static:\n        - name: cpu\n"
    assert delete(pools, tenant="bravo") == ["nodepool/bravo/cpu deleted"]
    assert not NodePool.objects.filter(tenant=world.bravo).exists()
    vci = "apiVersion: management.loft.sh/v1\nkind: VirtualClusterInstance\nmetadata:\n  name: alpha\n"
    assert delete(vci) == ["virtualclusterinstance/alpha deleting: 1 claim(s) release first, then it goes"]
    assert Tenant.objects.get(name="alpha").deleting_since is not None


# --- the Django admin -------------------------------------------------------------------------------------

def admin_url(view: str, *args) -> str:
    return reverse(f"admin:hosts_baremetalhost_{view}", args=args)


def test_the_admin_deletes_through_the_service_and_refuses_a_host_in_inspection(world, admin_client):
    inspecting = host_transition(host=free_host(world), to_state=HostState.INSPECTING, actor="user:test")
    page = admin_client.get(admin_url("delete", inspecting.pk)).content.decode()
    assert f"{inspecting.name} cannot be deleted: the host is inspecting" in page
    admin_client.post(admin_url("delete", inspecting.pk), {"post": "yes"})
    assert BareMetalHost.objects.filter(pk=inspecting.pk, state="inspecting").exists()
    # A selection is all or nothing: one refused host keeps the free one too.
    free = free_host(world)
    selection = {"action": "delete_selected", "_selected_action": [free.pk, inspecting.pk], "post": "yes"}
    admin_client.post(admin_url("changelist"), selection)
    assert BareMetalHost.objects.filter(pk__in=[free.pk, inspecting.pk]).count() == 2
    response = admin_client.post(admin_url("delete", free.pk), {"post": "yes"})
    assert response.status_code == 302 and not BareMetalHost.objects.filter(pk=free.pk).exists()
    event = Event.objects.get(host_id=free.pk, message="deleted")
    assert (event.actor, event.from_state) == ("user:admin", "available")


def test_the_admin_refuses_a_node_type_in_use(world, admin_client):
    gpu = NodeType.objects.get(name="gpu-server")
    page = admin_client.get(reverse("admin:pools_nodetype_delete", args=[gpu.pk])).content.decode()
    assert f"in use by claim(s) {world.claim_a.name}" in page
    admin_client.post(reverse("admin:pools_nodetype_delete", args=[gpu.pk]), {"post": "yes"})
    assert NodeType.objects.filter(pk=gpu.pk).exists()


def test_a_refusal_met_at_the_last_moment_is_an_error_in_the_admin_and_deletes_nothing(world, admin_client,
                                                                                     monkeypatch):
    # The confirmation page saw a removable host; by the POST it was inspecting (the service's lock decides).
    monkeypatch.setattr(BareMetalHostAdmin, "delete_refusal", lambda self, obj: "")
    inspecting = host_transition(host=free_host(world), to_state=HostState.INSPECTING, actor="user:test")
    free = free_host(world)
    for url, data in ((admin_url("delete", inspecting.pk), {"post": "yes"}),
                      (admin_url("changelist"), {"action": "delete_selected", "post": "yes",
                                                 "_selected_action": [free.pk, inspecting.pk]})):
        response = admin_client.post(url, data)
    # Both refusals (the first not yet read), and no "Successfully deleted".
    refusal = (f"nothing deleted: {inspecting.name} cannot be deleted: the host is inspecting: a flow drives it now; "
               "wait until it is done, or put the host in maintenance first")
    assert [str(m) for m in get_messages(response.wsgi_request)] == [refusal, refusal]
    assert BareMetalHost.objects.filter(pk__in=[free.pk, inspecting.pk]).count() == 2
    assert not Event.objects.filter(message="deleted").exists()
