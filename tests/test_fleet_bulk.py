"""Acting on many hosts from the fleet board, over HTTP as people use it: the search box, sortable columns, bulk
actions for admins (one confirmation, each host through its own service and its own Event, refusals reported
per host), the CSV export of the current view; on the host page, power on and off, the BMC's web interface and
the agent's log of the current flow. Members never see the fleet; auditors read and export, never act."""
import csv
import io
import re
from html import unescape

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from claims.models import NodeClaim
from events.models import Event
from hosts.models import BareMetalHost, HostCommand, RamdiskBoot
from pools.models import NodeProvider, Tenant, TenantMembership

pytestmark = pytest.mark.django_db

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
BMC_PASSWORD = "bulk-bmc-password-4e7a"


@pytest.fixture
def people(db):
    one, two = Tenant.objects.create(name="one"), Tenant.objects.create(name="two")
    admin = User.objects.create_user("root-admin", is_staff=True, is_superuser=True)
    auditor = User.objects.create_user("audrey")
    auditor.groups.add(Group.objects.get_or_create(name="auditors")[0])
    alice = User.objects.create_user("alice")
    TenantMembership.objects.create(tenant=one, user=alice)
    return {"admin": admin, "auditor": auditor, "alice": alice, "one": one, "two": two}


def make_host(name: str, state: str, n: int, *, serial: str = "", gpu: str = "", bmc: str = "", **fields):
    inventory = {}
    if serial or gpu:
        inventory = {"system": {"vendor": "Supermicro", "product": "SYS-821GE", "serial": serial},
                     "disks": [{"name": "nvme0n1", "serial": f"D-{serial}"}],
                     "gpus": [{"index": i, "name": gpu} for i in range(8)] if gpu else []}
    return BareMetalHost.objects.create(
        name=name, state=state, boot_mac=f"52:54:00:ab:00:{n:02x}", bmc_username="admin", bmc_password=BMC_PASSWORD,
        bmc_address=bmc or f"redfish+http://10.1.0.{n}:8000/redfish/v1/Systems/{n}", inventory=inventory, **fields)


@pytest.fixture
def fleet(people):
    """gpu-01 serves tenant one's claim one-k3x9; gpu-02 is free; cpu-03 is in error; gpu-04 in repair."""
    hosts = {
        "gpu-01": make_host("gpu-01", "provisioned", 1, serial="SN-A100-7781", gpu="NVIDIA H100 80GB HBM3"),
        "gpu-02": make_host("gpu-02", "available", 2, serial="SN-B200-1123", gpu="NVIDIA A100-SXM4-40GB",
                            bmc="redfish://bmc-02.example.invalid/redfish/v1/Systems/2"),
        "cpu-03": make_host("cpu-03", "error", 3, error_message="BMC unreachable: connection refused"),
        "gpu-04": make_host("gpu-04", "repair", 4, serial="SN-C300-0042", gpu="NVIDIA H100 80GB HBM3"),
    }
    provider = NodeProvider.objects.create(name="metal3")
    NodeClaim.objects.create(name="one-k3x9", tenant=people["one"], provider=provider, pool_name="gpu",
                             host=hosts["gpu-01"], host_name="gpu-01", phase="Available")
    return hosts


def as_user(user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def text(response) -> str:
    return unescape(response.content.decode())


def board_rows(client: Client, query: str = "") -> list[str]:
    """The host names in the fleet board's table, in its order."""
    response = client.get(reverse("fleet") + query)
    assert response.status_code == 200
    table = text(response).split('id="fleet-table"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'<tr id="host-\d+"[^>]*>.*?<a href="/hosts/([^/]+)/">', table, re.DOTALL)


def bulk(client: Client, action: str, hosts: list[str], reason: str = "", next_query: str = ""):
    """Open the bulk confirmation for these hosts, then submit its form (with its CSRF token)."""
    query = [("action", action), ("next", next_query)] + [("host", h) for h in hosts]
    confirmation = client.get(reverse("fleet-bulk"), query)
    assert confirmation.status_code == 200, confirmation.status_code
    token = CSRF.search(confirmation.content.decode())
    assert token, "the confirmation has no form"
    data = {"csrfmiddlewaretoken": token.group(1), "action": action, "host": hosts, "reason": reason,
            "next": next_query}
    return confirmation, client.post(reverse("fleet-bulk"), data, follow=True)


def events_of(name: str, **filters):
    return Event.objects.filter(object_name=name, object_type="host", **filters)


# --- search and sort -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("query, found", [
    ("SN-B200", ["gpu-02"]),                    # a system serial from the inventory
    ("d-sn-c300", ["gpu-04"]),                  # a disk serial, any case
    ("52:54:00:AB:00:03", ["cpu-03"]),          # the boot MAC, any case
    ("bmc-02.example", ["gpu-02"]),             # the BMC address
    ("one-k3x9", ["gpu-01"]),                   # the claim it serves
    ("one", ["gpu-01"]),                        # the tenant it serves (no host name has "one" in it)
    ("H100 80GB", ["gpu-01", "gpu-04"]),        # the GPU model
    ("gpu-0", ["gpu-01", "gpu-02", "gpu-04"]),  # the name
])
def test_the_search_box_finds_hosts_by_serial_mac_bmc_address_claim_tenant_gpu_model_and_name(fleet, people,
                                                                                                query, found):
    assert board_rows(as_user(people["admin"]), f"?q={query.replace(' ', '+')}") == found


def test_the_search_box_is_the_apis_too(fleet, people):
    api = as_user(people["admin"])
    names = [h["name"] for h in api.get("/api/v1/hosts/", {"q": "SN-A100"}).json()["results"]]
    assert names == ["gpu-01"]


def test_the_columns_sort_both_ways_and_keep_the_filters(fleet, people):
    admin = as_user(people["admin"])
    assert board_rows(admin) == ["cpu-03", "gpu-01", "gpu-02", "gpu-04"]
    assert board_rows(admin, "?sort=-name") == ["gpu-04", "gpu-02", "gpu-01", "cpu-03"]
    assert board_rows(admin, "?sort=state") == ["gpu-02", "cpu-03", "gpu-01", "gpu-04"]  # by the state's value
    assert board_rows(admin, "?q=gpu&sort=-tenant") == ["gpu-01", "gpu-02", "gpu-04"]  # tenant first, then names
    html = text(admin.get(reverse("fleet"), {"q": "gpu", "sort": "name", "per_page": 50, "page": 1}))
    # The header that sorts now turns it round, the others sort by theirs; the filters stay, the page starts anew.
    assert '<a class="sort sorted" href="?q=gpu&sort=-name&per_page=50">Host ▲</a>' in html
    assert 'href="?q=gpu&sort=since&per_page=50">Since</a>' in html
    # The filter form keeps the sort, and the export link takes the same view.
    assert '<input type="hidden" name="sort" value="name">' in html
    assert 'href="/fleet/export.csv?q=gpu&sort=name&per_page=50"' in html


# --- bulk actions -----------------------------------------------------------------------------------------------

def test_an_admin_puts_many_hosts_in_maintenance_with_one_event_each(fleet, people):
    admin = as_user(people["admin"])
    confirmation, done = bulk(admin, "maintenance-on", ["gpu-02", "cpu-03", "gpu-04"], reason="rack r7 fan swap",
                              next_query="q=0&per_page=50")
    assert "Maintenance on: 3 hosts?" in text(confirmation)
    assert done.redirect_chain[-1][0] == "/hosts/?q=0&per_page=50"  # back to the board as it was
    assert "Maintenance on: done for 3 hosts (cpu-03, gpu-02, gpu-04)" in text(done)
    for name in ("gpu-02", "cpu-03", "gpu-04"):
        assert BareMetalHost.objects.get(name=name).state == "maintenance"
        event = events_of(name, to_state="maintenance").get()
        assert (event.actor, event.message) == ("user:root-admin", "rack r7 fan swap")


def test_a_bulk_action_reports_each_refusal_and_does_the_rest(fleet, people):
    admin = as_user(people["admin"])
    confirmation, done = bulk(admin, "retest", ["gpu-04", "gpu-02", "cpu-03"])
    page = text(confirmation)
    assert "Retest: 3 hosts?" in page and "Retest: 1 host</button>" in page
    assert "will be refused: gpu-02 is available, so retest does not apply: only a host in repair is retested" in page
    result = text(done)
    assert "Retest: done for 1 host (gpu-04)" in result
    assert "Retest: gpu-02 is available; only a host in repair can be retested" in result
    assert "Retest: cpu-03 is error; only a host in repair can be retested" in result
    assert BareMetalHost.objects.get(name="gpu-04").state == "retesting"
    assert BareMetalHost.objects.get(name="gpu-02").state == "available"
    assert not events_of("gpu-02", to_state="retesting").exists()


def test_a_bulk_release_releases_the_claims_of_serving_hosts(fleet, people):
    admin = as_user(people["admin"])
    confirmation, done = bulk(admin, "release", ["gpu-01", "gpu-02"], reason="tenant one moves out")
    assert "will be refused: gpu-02 serves no claim: nothing to release" in text(confirmation)
    result = text(done)
    assert "Release: done for 1 host (gpu-01)" in result
    assert "gpu-02 serves no claim: nothing to release" in result
    assert NodeClaim.objects.get(name="one-k3x9").phase == "Releasing"
    assert BareMetalHost.objects.get(name="gpu-01").state == "deprovisioning"
    assert events_of("gpu-01", to_state="deprovisioning", actor="user:root-admin").count() == 1


@pytest.mark.parametrize("who", ["auditor", "alice"])
def test_members_and_auditors_may_not_act_in_bulk(fleet, people, who):
    client = as_user(people[who])
    query = {"action": "maintenance-on", "host": ["gpu-02", "gpu-04"]}
    assert client.get(reverse("fleet-bulk"), query).status_code == 403
    post = Client()
    post.force_login(people[who])
    assert post.post(reverse("fleet-bulk"), query).status_code == 403
    assert set(BareMetalHost.objects.values_list("state", flat=True)) == {"provisioned", "available", "error",
                                                                          "repair"}
    assert not Event.objects.filter(to_state="maintenance").exists()


def test_only_admins_get_the_selection_on_the_board(fleet, people):
    admin_page = text(as_user(people["admin"]).get(reverse("fleet")))
    assert 'id="bulk-form"' in admin_page and 'class="selectable"' in admin_page and 'id="select-all"' in admin_page
    auditor_page = text(as_user(people["auditor"]).get(reverse("fleet")))
    assert 'id="bulk-form"' not in auditor_page and 'class="selectable"' not in auditor_page
    assert 'id="fleet-export"' in auditor_page


# --- CSV export -------------------------------------------------------------------------------------------------

def export(client: Client, query: dict) -> tuple[int, list[dict]]:
    response = client.get(reverse("fleet-export"), query)
    if response.status_code != 200:
        return response.status_code, []
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="fleet-')
    body = b"".join(response.streaming_content).decode()
    assert BMC_PASSWORD not in body and "bmc_password" not in body
    return 200, list(csv.DictReader(io.StringIO(body)))


def test_the_csv_export_holds_the_boards_current_view_filtered_and_sorted(fleet, people):
    status, rows = export(as_user(people["admin"]), {"state": ["available", "provisioned", "repair"],
                                                     "sort": "-name", "page": 2})
    assert status == 200
    assert [r["name"] for r in rows] == ["gpu-04", "gpu-02", "gpu-01"]  # every page of it, not page 2
    served = rows[2]
    assert (served["state"], served["claim"], served["tenant"]) == ("provisioned", "one-k3x9", "one")
    assert served["bmc_address"] == "redfish+http://10.1.0.1:8000/redfish/v1/Systems/1"
    assert served["boot_mac"] == "52:54:00:ab:00:01"
    status, rows = export(as_user(people["admin"]), {"q": "SN-C300"})
    assert [r["name"] for r in rows] == ["gpu-04"]
    _, rows = export(as_user(people["admin"]), {"state": "error"})
    assert rows[0]["error"] == "BMC unreachable: connection refused"


def test_auditors_export_and_members_never_see_the_fleet(fleet, people):
    status, rows = export(as_user(people["auditor"]), {})
    assert status == 200 and len(rows) == 4
    assert export(as_user(people["alice"]), {})[0] == 403
    assert Client().get(reverse("fleet-export")).status_code == 302  # to the login


# --- the host page: power on and off, the BMC's web interface, the agent's log -----------------------------------

def test_the_host_page_offers_power_on_and_off_beside_power_cycle(fleet, people):
    html = text(as_user(people["admin"]).get(reverse("host", args=["gpu-02"])))
    for action in ("power-on", "power-off", "power-cycle"):
        assert f'href="/hosts/gpu-02/actions/{action}/"' in html
    confirmation = text(as_user(people["admin"]).get(reverse("host-action", args=["gpu-02", "power-off"])))
    assert "Switch gpu-02 off through its BMC, at once" in confirmation


def test_a_power_off_is_refused_while_a_flow_drives_the_power(fleet, people):
    BareMetalHost.objects.filter(name="gpu-02").update(state="provisioning")
    page = text(as_user(people["admin"]).get(reverse("host-action", args=["gpu-02", "power-off"])))
    assert "Not possible now: the host is provisioning: a flow drives its power now" in page
    _, done = bulk(as_user(people["admin"]), "power-off", ["gpu-02"])
    assert "gpu-02 cannot be powered off now: the host is provisioning" in text(done)
    assert not events_of("gpu-02", step="power_off").exists()


def test_a_bulk_power_off_writes_one_request_per_host(fleet, people):
    _, done = bulk(as_user(people["admin"]), "power-off", ["gpu-02", "gpu-04"], reason="power work in row 3")
    assert "Power off: done for 2 hosts (gpu-02, gpu-04)" in text(done)
    for name in ("gpu-02", "gpu-04"):
        request = events_of(name, step="power_off").get()
        assert (request.kind, request.actor, request.message) == ("action", "user:root-admin",
                                                                  "power off requested: power work in row 3")
        assert request.data["action"] == "power-off"


def test_the_host_page_links_the_bmcs_web_interface(fleet, people):
    admin = as_user(people["admin"])
    assert 'id="host-bmc-web" href="http://10.1.0.1:8000/"' in text(admin.get(reverse("host", args=["gpu-01"])))
    assert 'id="host-bmc-web" href="https://bmc-02.example.invalid/"' in text(admin.get(reverse("host",
                                                                                            args=["gpu-02"])))
    member_page = text(as_user(people["alice"]).get(reverse("host", args=["gpu-01"])))
    assert "host-bmc-web" not in member_page and "10.1.0.1" not in member_page


def test_the_host_page_shows_what_the_console_keeps_of_the_current_flows_agent_run(fleet, people):
    host = fleet["gpu-04"]
    BareMetalHost.objects.filter(pk=host.pk).update(
        state="retesting", flow={"id": "f-retest-1", "name": "retest", "step": "erase"})
    RamdiskBoot.objects.create(host=host, flow_id="f-retest-1", secret_hash="a" * 64, delivered_via="ipxe")
    HostCommand.objects.create(host=host, flow_id="f-retest-1", step="erase", name="erase", status="sent",
                               progress=37.5, message="nvme0n1: 37% overwritten")
    HostCommand.objects.create(host=host, flow_id="f-old", step="erase", name="erase", status="done",
                               message="an earlier flow's erase")
    html = text(as_user(people["admin"]).get(reverse("host", args=["gpu-04"])))
    log = html.split('id="host-flow-log"', 1)[1].split("</div>", 1)[0]
    assert "The console keeps no boot or console log of the server itself" in log
    assert "f-retest-1" in log and "ipxe" in log
    assert "nvme0n1: 37% overwritten" in log and "37.5%" in log
    assert "an earlier flow's erase" not in log
    assert "host-flow-log" in text(as_user(people["auditor"]).get(reverse("host", args=["gpu-04"])))
