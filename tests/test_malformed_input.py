"""Malformed input is a 400 that names the field, never a 500: a time zone offset PostgreSQL cannot store, a NUL
character on its way to PostgreSQL (manifests through the API, the console and `manage.py apply`; console YAML
fields; agent calls)."""
pytest_plugins = ["tests.api_conftest"]

import json  # noqa: E402

import pytest  # noqa: E402
from conftest import agent_client_class  # noqa: E402
from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.test import Client  # noqa: E402

from hosts.choices import HostState  # noqa: E402
from hosts.models import BareMetalHost  # noqa: E402
from pools.models import NodePool, NodeProvider, NodeType  # noqa: E402

pytestmark = pytest.mark.django_db

VCLUSTER = """privateNodes:
  autoNodes:
  - provider: metal3
    static:
    - name: gpu
      quantity: 1
      nodeLabels:
        {labels}
"""


def test_a_time_zone_offset_postgresql_cannot_store_is_a_400_naming_the_field(evidence):
    admin = evidence.client("admin")
    for path in ("/api/v1/events/", "/api/v1/erase-certificates/", "/api/v1/health-runs/"):
        for name, value in (("since", "2026-01-01T00:00:00-23:40"), ("until", "2026-01-01T00:00:00+16:00"),
                            ("since", "2026-01-01T00:00:00+15:59:59.5")):
            response = admin.get(path, {name: value})
            assert response.status_code == 400, (path, name, value, response.content[:200])
            assert response.json() == {name: ["the time zone offset must be within ±15:59"]}
        assert admin.get(path, {"since": "2026-01-01T00:00:00-15:59"}).status_code == 200

    console = Client()
    console.force_login(evidence.users["admin"])
    assert console.get("/events/", {"since": "2026-01-01T00:00:00-23:40"}).status_code == 200  # ignored there


def test_a_nul_escape_in_a_vcluster_yaml_is_a_400_naming_its_path_and_line(world):
    member = world.client("member_a")
    for labels, message in (('team: "a\\0b"', "privateNodes.autoNodes[0].static[0].nodeLabels.team: contains a NUL "
                                              "character (\\0)"),
                            ('"te\\x00am": b', "privateNodes.autoNodes[0].static[0].nodeLabels: a key contains a NUL "
                                               "character (\\0)")):
        response = member.post("/api/v1/apply/?tenant=alpha", VCLUSTER.format(labels=labels),
                               content_type="application/yaml")
        assert response.status_code == 400, response.content[:300]
        assert response.json() | {"detail": None} == {"detail": None, "file": "manifest.yaml", "document": 1,
                                                     "line": 8, "message": message,
                                                     "errors": [{"line": 8, "message": message}]}
    assert NodePool.objects.get(tenant=world.alpha).node_labels == {}


def test_a_nul_byte_in_a_manifest_file_is_refused_with_its_line_by_the_console_and_manage_py_apply(world, tmp_path):
    text = VCLUSTER.format(labels="team: a\x00b")
    console = Client()
    console.force_login(world.users["admin"])
    page = console.post("/apply/", {"file": SimpleUploadedFile("pools.yaml", text.encode()), "tenant": "alpha",
                                    "action": "apply"})
    assert page.status_code == 400
    assert "pools.yaml: document 1 (line 8): not valid YAML: unacceptable character #x0000" in page.content.decode()

    path = tmp_path / "pools.yaml"
    path.write_text(text)
    with pytest.raises(CommandError, match=r"pools.yaml: document 1 \(line 8\): not valid YAML: unacceptable "
                                           r"character #x0000"):
        call_command("apply", "-f", str(path), "--tenant", "alpha")


def test_a_nul_in_a_console_yaml_field_is_an_error_next_to_the_field(demo_site):
    from django.contrib.auth.models import User

    console = Client()
    console.force_login(User.objects.create_user("root-admin", is_staff=True, is_superuser=True))
    response = console.post("/catalogue/node-types/new/", {
        "name": "nul-type", "provider": NodeProvider.objects.get(name="metal3").pk, "resources": "",
        "host_selector": 'matchLabels: {role: "g\\0pu"}', "properties": "", "cost": ""})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="error-host_selector"' in html and "matchLabels.role: contains a NUL character" in html
    assert not NodeType.objects.filter(name="nul-type").exists()


def test_a_nul_in_an_agent_call_is_a_400_naming_where_it_is(demo_site):
    agent = agent_client_class()(REMOTE_ADDR="fd00::7e57")
    for path, body, where in (("/agent/lookup", {"macs": ["52:54:00:00:00:01\x00"], "boot_id": "b"}, "macs[0]"),
                              ("/agent/heartbeat", {"host_id": 1, "status": "idle", "message": "a\x00"}, "message"),
                              ("/agent/result", {"host_id": 1, "result": {"stdout\x00": ""}}, "a key in result")):
        response = agent.post(path, json.dumps(body), content_type="application/json")
        assert response.status_code == 400, (path, response.content[:200])
        assert response.json() == {"error": f"{where}: contains a NUL character (\\u0000)"}


def test_a_nul_in_a_label_filter_is_a_400_in_the_api_and_ignored_on_the_fleet_board(world):
    response = world.client("admin").get("/api/v1/hosts/", {"label": "role=g\x00pu"})
    assert response.status_code == 400
    assert response.json() == {"label": ["Null characters are not allowed."]}
    console = Client()
    console.force_login(world.users["admin"])
    assert console.get("/hosts/", {"label": "role=g\x00pu"}).status_code == 200


def test_a_nul_in_a_field_looked_up_by_name_is_a_400_naming_it(world):
    """A related field (a pool's provider, by name) queries PostgreSQL with what it was given: refused first."""
    member = world.client("member_b")
    pools = NodePool.objects.count()
    response = member.post("/api/v1/pools/", {"provider": "\x00", "name": "gpu2", "tenant": "bravo"},
                           content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"provider": ["Null characters are not allowed."]}
    response = member.post("/api/v1/pools/", {"provider": "metal3", "name": "gpu2", "tenant": "bra\x00vo"},
                           content_type="application/json")
    assert response.status_code == 400 and response.json() == {"tenant": ["Null characters are not allowed."]}
    assert NodePool.objects.count() == pools


def test_a_nul_in_a_console_path_is_no_such_page(world):
    console = Client()
    console.force_login(world.users["admin"])
    for path in ("/hosts/gpu%00/", "/hosts/gpu%00/actions/retry/", "/claims/a%00/", "/tenants/alpha%00/",
                 "/tenants/alpha/pools/gpu%00/quantity/", "/tenants/alpha%00/join/",
                 "/catalogue/tenants/alpha%00/edit/"):
        assert console.get(path).status_code == 404, path
        assert console.post(path).status_code == 404, path


def test_a_nul_in_a_host_action_s_reason_is_a_400_and_changes_nothing(world):
    console = Client()
    console.force_login(world.users["admin"])
    host = BareMetalHost.objects.filter(state=HostState.AVAILABLE).first()
    response = console.post(f"/hosts/{host.name}/actions/maintenance-on/", {"reason": "disk swap\x00"})
    assert response.status_code == 400 and response.content == b"reason: contains a NUL character"
    host.refresh_from_db()
    assert host.state == HostState.AVAILABLE


def test_a_nul_in_an_admin_list_filter_is_a_400_naming_it_not_a_server_error(admin_client, demo_site):
    for path, name in (("/admin/hosts/baremetalhost/?state=%00", "state"), ("/admin/pools/tenant/?q=a%00b", "q")):
        response = admin_client.get(path)
        assert response.status_code == 400, (path, response.status_code)
        assert response.json() == {name: ["a NUL character is not allowed"]}
