"""The fleet timing page's charts tell the truth (issue 17.5): hosts count only from their creation (and until
their deletion), the history starts where the data starts, steps come in the order their flow runs them,
flows are named in one case, axes name their units. Over HTTP, as an admin or auditor sees /timing/."""
import re
from datetime import timedelta
from html import unescape

import pytest
from django.urls import reverse
from django.utils import timezone

from claims import charts
from events.models import Event
from hosts.lifecycle import FLOWS
from hosts.models import BareMetalHost
from hosts.services import host_delete

pytest.register_assert_rewrite("tests.console_conftest")
pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db

NEW_HOST = """apiVersion: v1
kind: Secret
metadata:
  name: {name}-bmc
  namespace: metal3
stringData: {{username: admin, password: new-host-password-5e}}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: {name}
  namespace: metal3
spec:
  bmc:
    address: redfish+http://127.0.0.1:8001/redfish/v1/Systems/{name}
    credentialsName: {name}-bmc
  bootMACAddress: 52:54:00:00:17:05
"""


def age(*, hours: float, hosts=None) -> None:
    """Test setup, as data: the given hosts (all when None), and their events, came `hours` ago."""
    then = timezone.now() - timedelta(hours=hours)
    rows = BareMetalHost.objects.all() if hosts is None else BareMetalHost.objects.filter(pk__in=[h.pk for h in hosts])
    ids = list(rows.values_list("pk", flat=True))
    Event.objects.filter(object_type="host", host_id__in=ids).update(created_at=then)
    rows.update(created_at=then)


def totals(history: dict) -> list[int]:
    return [sum(values[b] for values in history["series"].values()) for b in range(history["buckets"] + 1)]


def moments(history: dict) -> list:
    step = (history["end"] - history["start"]) / history["buckets"]
    return [history["start"] + step * b for b in range(history["buckets"] + 1)]


def test_a_host_created_two_hours_ago_counts_nothing_before_its_creation(users, apply):
    fleet = BareMetalHost.objects.count()
    age(hours=30)  # the demo fleet was there all day
    apply(NEW_HOST.format(name="gpu-new"))
    new = BareMetalHost.objects.get(name="gpu-new")
    age(hours=2, hosts=[new])
    new.refresh_from_db()
    created = new.created_at

    history = charts.state_history(hours=24)
    assert history["start"] <= timezone.now() - timedelta(hours=23, minutes=59)  # the fleet's data fills the day
    for moment, total in zip(moments(history), totals(history)):
        assert total == (fleet + 1 if moment >= created else fleet), moment
    assert history["series"][new.state][-1] >= 1
    assert not history["data_starts_late"]


def test_a_deleted_host_counts_until_its_deletion(users):
    fleet = BareMetalHost.objects.count()
    age(hours=30)
    host = BareMetalHost.objects.filter(state="available").order_by("name").first()
    host_delete(host=host, actor="test")
    deleted_at = timezone.now() - timedelta(hours=1)
    Event.objects.filter(host_id=host.pk, message="deleted").update(created_at=deleted_at)

    history = charts.state_history(hours=24)
    for moment, total in zip(moments(history), totals(history)):
        assert total == (fleet if moment < deleted_at else fleet - 1), moment


def test_the_history_starts_at_the_first_data_point_not_a_day_ago(client, users):
    fleet = BareMetalHost.objects.count()
    age(hours=3)  # the whole fleet came three hours ago
    first = Event.objects.filter(object_type="host").order_by("created_at").first().created_at

    history = charts.state_history(hours=24)
    assert history["start"] == first
    assert totals(history)[0] == fleet  # the first point is the fleet, not nothing squeezed to the right edge

    client.force_login(users["auditor"])
    html = client.get(reverse("timing")).content.decode()
    svg = html[html.index('<svg id="state-history"'):]
    assert f'data-start="{timezone.localtime(first).isoformat()}"' in svg[:svg.index(">")]
    first_x = float(re.search(r'<polyline [^>]*points="([\d.]+),', svg).group(1))
    assert first_x == charts.history_chart(history)["left"]  # the data's first point is the axis's start
    assert "time (UTC)" in svg and ">hosts</text>" in svg  # both axes say what they count
    assert "(where the data starts: no host before)" in html


def test_an_empty_fleet_draws_no_history(client, users):
    BareMetalHost.objects.all().delete()
    Event.objects.filter(object_type="host").update(object_type="claim")  # no host has any history either
    client.force_login(users["admin"])
    html = client.get(reverse("timing")).content.decode()
    assert 'id="state-history"' not in html and "No hosts yet." in html


def record_steps(flow: str, steps: list[str]) -> None:
    from events.services import event_record

    host = BareMetalHost.objects.order_by("name").first()
    for i, step in enumerate(steps):
        event_record(kind="step", object_type="host", object_name=host.name, host=host, step=step, message="done",
                     duration_s=1.0 + i, actor="system:flow", data={"flow": flow})


def test_steps_are_ordered_as_their_flow_runs_them(client, users):
    inspect = [step.name for step in FLOWS["inspect"].steps]
    deprovision = list(dict.fromkeys(step.name for step in FLOWS["deprovision"].steps))
    record_steps("inspect", sorted(inspect, reverse=True))  # first seen last, and not alphabetical either
    record_steps("deprovision", sorted(deprovision))
    record_steps("provision", ["write_image", "power_on_pxe"])

    client.force_login(users["admin"])
    html = client.get(reverse("timing")).content.decode()
    rows = re.findall(r'<tr data-step="([^"]+)"><td>([^<]+)</td>', html)
    assert [step for step, flow in rows if flow == "inspect"] == inspect
    assert [step for step, flow in rows if flow == "deprovision"] == deprovision
    assert [flow for _, flow in rows] == ["inspect"] * len(inspect) + ["provision"] * 2 + ["deprovision"] * len(
        deprovision)  # flows as a host lives them: inspected, provisioned, released
    bars = re.findall(r'<g data-step="([^"]+)" data-flow="([^"]+)">', html)
    assert bars == rows


def test_flows_are_named_in_one_case_and_the_axis_names_its_unit(client, users):
    record_steps("provision", ["write_image"])
    record_steps("deprovision", ["erase"])
    client.force_login(users["admin"])
    html = client.get(reverse("timing")).content.decode()
    chart = unescape(html[html.index('<svg id="timing-chart"'):html.index("</svg>")])
    labels = re.findall(r'<text class="label"[^>]*>([^<]+)</text>', chart)
    assert labels == ["provision · write_image", "deprovision · erase"]
    assert "Release (" not in html and "Provision ·" not in html
    assert ">step duration (s)</text>" in chart


def test_minutes_on_the_axis_once_a_step_takes_minutes():
    chart = charts.timing_chart([{"flow": "provision", "step": "write_image", "n": 1, "p50": 300.0, "p95": 480.0,
                                  "max": 480.0}])
    assert chart["axis_title"] == "step duration (min)"
    assert [t["label"] for t in chart["ticks"]] == ["0", "2", "4", "6", "8"]
    assert chart["bars"][0]["value"] == "5.0 / 8.0 min"


def test_a_tenant_member_gets_no_timing_page(client, users):
    client.force_login(users["alice"])
    assert client.get(reverse("timing")).status_code == 403
