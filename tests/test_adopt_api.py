"""POST /api/v1/hosts/adopt/: admins only; a server whose BMC does not answer, or a body that is not valid, is refused with
400 and the reason, and nothing changes (the lab test, tests/test_adopt.py, adopts a running server)."""
pytest_plugins = ["tests.api_conftest"]

import pytest  # noqa: E402

from hosts.models import BareMetalHost  # noqa: E402

from .lab_conftest import closed_port  # noqa: E402

pytestmark = pytest.mark.django_db

PATH = "/api/v1/hosts/adopt/"


def body(**changes) -> dict:
    return {"name": "gpu-99", "bmc_address": f"redfish+http://127.0.0.1:{closed_port()}/redfish/v1/Systems/gpu-99",
            "bmc_username": "admin", "bmc_password": "adopt-secret-7f3a", "boot_mac": "52:54:00:99:00:01",
            "tenant": "alpha", **changes}


@pytest.mark.parametrize("role", ["member_a", "auditor", "anonymous"])
def test_only_an_admin_may_adopt_a_server(api, role):
    response = api(role, "post", PATH, body())
    assert response.status_code in (401, 403)
    assert not BareMetalHost.objects.filter(name="gpu-99").exists()


def test_a_server_whose_bmc_does_not_answer_is_refused_and_nothing_changes(api):
    before = sorted(BareMetalHost.objects.values_list("name", "state"))
    response = api("admin", "post", PATH, body())
    assert response.status_code == 400
    assert "unreachable" in response.json()["non_field_errors"][0]
    assert "adopt-secret-7f3a" not in response.content.decode()
    assert sorted(BareMetalHost.objects.values_list("name", "state")) == before


def test_a_body_that_is_not_valid_is_refused_field_by_field(api, world):
    taken = world.host_a
    response = api("admin", "post", PATH, body(boot_mac=taken.boot_mac, bmc_address="ftp://10.0.0.1", colour="red"))
    assert response.status_code == 400
    assert set(response.json()) == {"colour"}  # unknown fields first
    response = api("admin", "post", PATH, body(boot_mac=taken.boot_mac, bmc_address="ftp://10.0.0.1"))
    assert response.status_code == 400 and {"boot_mac", "bmc_address"} <= set(response.json())
    assert taken.name in response.json()["boot_mac"][0]
