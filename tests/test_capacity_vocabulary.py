"""One capacity vocabulary (hosts.capacity.COLUMNS) for every capacity view: the fleet board's card, /node-types/,
GET /api/v1/capacity/ and the NodeTypes' API. Every host counts once, in exactly one column, so the columns add
up to the host count whatever the hosts' states; a host whose BMC does not answer is "Held back", never plainly
Available, and the board's "Needs attention" says how to fix it."""
import re
from html import unescape

import pytest
from django.test import Client
from django.urls import reverse

from hosts.capacity import COLUMNS, column_of, fleet_capacity, node_type_capacity
from hosts.choices import HostState
from hosts.models import BareMetalHost
from hosts.services import host_bmc_contact
from pools.models import NodeType

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(users):
    client = Client()
    client.force_login(users["admin"])
    return client


@pytest.fixture
def users(django_user_model):
    return {"admin": django_user_model.objects.create_user("root-admin", is_staff=True, is_superuser=True)}


def every_state(demo_site) -> list[BareMetalHost]:
    """The demo's 8 hosts, and one gpu-server host more in each state, two of them free but held back (a red BMC,
    a red preflight)."""
    extra = []
    for n, state in enumerate(HostState.values, start=1):
        extra.append(BareMetalHost.objects.create(
            name=f"gpu-x{n:02d}", state=state, boot_mac=f"52:54:00:99:00:{n:02x}", labels={"role": "gpu", "rack": "r9"},
            bmc_address=f"redfish+http://10.9.0.{n}:8000/redfish/v1/Systems/{n}"))
    BareMetalHost.objects.create(name="gpu-red-bmc", state=HostState.AVAILABLE, boot_mac="52:54:00:99:01:01",
                                 labels={"role": "gpu"}, bmc_ok=False, bmc_error="BMC at 10.9.1.1 unreachable",
                                 bmc_address="redfish+http://10.9.1.1:8000/redfish/v1/Systems/1")
    BareMetalHost.objects.create(name="gpu-red-preflight", state=HostState.CHECKING, boot_mac="52:54:00:99:01:02",
                                 labels={"role": "gpu"}, preflight_ok=False, preflight_reason="no boot route",
                                 bmc_address="redfish+http://10.9.1.2:8000/redfish/v1/Systems/2")
    return extra


def test_the_columns_cover_every_state_once_and_only_free_states_split_into_available_and_held_back():
    owners = {}
    for name, column in COLUMNS.items():
        for state in column.states:
            owners.setdefault(state, []).append(name)
    assert set(owners) == set(HostState.values)
    assert {state: names for state, names in owners.items() if len(names) > 1} == {
        HostState.AVAILABLE: ["available", "held_back"], HostState.CHECKING: ["available", "held_back"]}
    assert [c.label for c in COLUMNS.values()] == ["Available", "Held back", "Provisioned", "Preparing", "Repair",
                                                   "Error", "Maintenance", "Held", "Retired"]


@pytest.mark.parametrize("state", HostState.values)
def test_a_host_in_any_state_counts_in_exactly_one_column_of_every_view(demo_site, state):
    host = BareMetalHost.objects.create(name="gpu-x01", state=state, boot_mac="52:54:00:99:00:01",
                                        labels={"role": "gpu"},
                                        bmc_address="redfish+http://10.9.0.1:8000/redfish/v1/Systems/1")
    gpu = NodeType.objects.get(name="gpu-server")
    before = {k: v for k, v in node_type_capacity([gpu])[gpu.pk].items()}
    BareMetalHost.objects.exclude(pk=host.pk).delete()
    only = node_type_capacity([gpu])[gpu.pk]
    assert only["total"] == 1 and sum(only[c] for c in COLUMNS) == 1
    assert only[column_of(host)] == 1, (state, only)
    card = fleet_capacity([gpu])
    assert card["total"]["total"] == 1 and card["total"][column_of(host)] == 1
    assert before["total"] == sum(before[c] for c in COLUMNS)


def test_the_counts_add_up_to_the_host_count_for_a_fleet_in_every_state(demo_site):
    every_state(demo_site)
    hosts = list(BareMetalHost.objects.all())
    types = list(NodeType.objects.order_by("name"))
    by_type = node_type_capacity(types)
    card = fleet_capacity(types)
    assert card["total"]["total"] == len(hosts) == sum(card["total"][c] for c in COLUMNS)
    for row in [*card["node_types"], *card["racks"]]:
        assert row["total"] == sum(row[c] for c in COLUMNS), row
    for t in types:
        assert by_type[t.pk]["total"] == sum(by_type[t.pk][c] for c in COLUMNS), t.name
        shown = next(r for r in card["node_types"] if r["name"] == t.name)
        assert {c: shown[c] for c in ("total", *COLUMNS)} == by_type[t.pk]
    # Straight from the rows, each host in the one column column_of names.
    want = dict.fromkeys(COLUMNS, 0)
    for h in hosts:
        want[column_of(h)] += 1
    assert {c: card["total"][c] for c in COLUMNS} == want
    assert want["held_back"] == 2 and card["total"]["bmc_red"] == 1 and card["total"]["preflight_red"] == 1
    assert want["maintenance"] == 1 and want["error"] == 1 and want["retired"] == 1


def cells(html: str, row_id: str) -> dict[str, int]:
    row = html[html.index(row_id):]
    row = row[: row.index("</tr>")]
    return {name: int(n) for name, n in re.findall(r'<td class="cap-(\w+)[^"]*"[^>]*>(\d+)</td>', row)}


def test_the_node_types_page_and_the_boards_card_show_every_column_adding_up_to_the_total(demo_site, admin):
    every_state(demo_site)
    gpu = NodeType.objects.get(name="gpu-server")
    page = unescape(admin.get(reverse("node-types")).content.decode())
    for label in ("Available", "Held back", "Provisioned", "Preparing", "Repair", "Error", "Maintenance", "Retired"):
        assert f">{label}</th>" in page, label
    row = cells(page, f'id="node-type-{gpu.pk}"')
    total = BareMetalHost.objects.filter(labels__role="gpu").count()
    assert row["total"] == total == sum(row[c] for c in COLUMNS), row
    assert (row["maintenance"], row["error"], row["held_back"]) == (1, 1, 2)

    board = unescape(admin.get(reverse("fleet")).content.decode())
    card = board[board.index('id="capacity"'):]
    for label in ("Available", "Held back", "Maintenance", "Retired"):
        assert f">{label}</th>" in card, label
    for key in ("type:gpu-server", "rack:r9", "total"):
        counted = cells(card, f'data-capacity="{key}"')
        assert counted["total"] == sum(counted[c] for c in COLUMNS), key
    assert cells(card, 'data-capacity="total"')["total"] == BareMetalHost.objects.count()
    for old_word in (">Free<", ">Allocatable<", ">Serving<", ">Broken<"):
        assert old_word not in card


def test_a_host_whose_bmc_is_red_is_held_back_not_available_and_needs_attention_with_its_fix(demo_site, admin):
    host = BareMetalHost.objects.get(name="gpu-01")
    host_bmc_contact(host=host, ok=False, error="BMC at 10.0.0.11 unreachable: connection refused")
    assert column_of(BareMetalHost.objects.get(pk=host.pk)) == "held_back"
    gpu = NodeType.objects.get(name="gpu-server")
    assert node_type_capacity([gpu])[gpu.pk]["available"] == BareMetalHost.objects.filter(
        labels__role="gpu", state=HostState.AVAILABLE).count() - 1

    board = unescape(admin.get(reverse("fleet")).content.decode())
    row = board[board.index(f'<tr id="host-{host.pk}"'):]
    row = row[: row.index("</tr>")]
    assert "Held back" in row and ">Available<" not in row
    attention = board[board.index('id="attention"'):]
    attention = attention[: attention.index("</table>")]
    mine = attention[attention.index(f'id="attention-{host.pk}"'):]
    mine = mine[: mine.index("</tr>")]
    assert "its BMC does not answer (BMC at 10.0.0.11 unreachable: connection refused)" in mine
    assert f'href="{reverse("host-edit", args=[host.name])}"' in mine
    assert "check the BMC address and credentials: edit" in mine
    # The host's own page says so too, beside its state.
    page = unescape(admin.get(reverse("host", args=[host.name])).content.decode())
    assert 'id="host-held-back"' in page and "its BMC does not answer: not allocated until it is fixed" in page


def test_a_host_in_error_whose_bmc_is_red_is_fixed_by_an_edit_not_a_retry(demo_site, admin):
    host = BareMetalHost.objects.get(name="gpu-02")
    BareMetalHost.objects.filter(pk=host.pk).update(state=HostState.ERROR, error_message="BMC did not answer")
    host_bmc_contact(host=host, ok=False, error="BMC at 10.0.0.12 unreachable")
    board = unescape(admin.get(reverse("fleet")).content.decode())
    mine = board[board.index(f'id="attention-{host.pk}"'):]
    mine = mine[: mine.index("</tr>")]
    assert f'href="{reverse("host-edit", args=[host.name])}"' in mine and "/actions/retry/" not in mine


def test_manage_py_status_counts_each_node_types_hosts_in_the_same_columns(demo_site, capsys):
    from django.core.management import call_command

    every_state(demo_site)
    call_command("status")
    line = next(row for row in capsys.readouterr().out.splitlines() if row.strip().startswith("gpu-server"))
    gpu = NodeType.objects.get(name="gpu-server")
    counts = node_type_capacity([gpu])[gpu.pk]
    assert f" {counts['total']} " in line
    for words in (f"{counts['available']} available", "2 held back", "1 maintenance", "1 error", "1 retired"):
        assert words in line, (words, line)
