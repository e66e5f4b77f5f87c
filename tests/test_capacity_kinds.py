"""Capacity across provider kinds: an external provider's NodeType counts its machines, not the console's hosts.
Its total is what its kind says (a kubeVirt maxCapacity; none: no limit, shown as such and null in JSON), its
claimed count its live machines; a provider that cannot be asked (a Metal3 cluster whose API is down) shows the
reason instead of failing the page. The node types page, the NodeTypes' API and `manage.py status` say the same;
the hosts' types keep counting hosts, and the queries per page stay fixed however many external types there are."""
import io
import json
import re
import socket
from html import unescape

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from claims.models import NodeClaim
from hosts.capacity import fleet_capacity
from hosts.models import BareMetalHost
from machines.choices import MachineState
from machines.models import Machine, ProviderSecret
from machines.services import claims_fill
from pools.models import NodeType

pytestmark = pytest.mark.django_db

KUBEVIRT = """
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {{name: kv}}
spec:
  kubeVirt:
    clusterRef: {{cluster: kv-lab, namespace: vms}}
    nodeTypes:
{types}
"""
KV_TYPE = """      - name: {name}
        resources: {{cpu: "2", memory: 4Gi}}
{limit}"""
FAR_METAL3 = """
apiVersion: management.loft.sh/v1
kind: NodeProvider
metadata: {name: far}
spec:
  metal3:
    clusterRef: {cluster: far-site, namespace: metal3}
    nodeTypes:
      - name: far-gpu
        resources: {cpu: "64", nvidia.com/gpu: "8"}
        bareMetalHosts: {selector: {matchLabels: {role: gpu}}}
"""
POOL = """
privateNodes:
  autoNodes:
    - provider: kv
      static:
        - name: vms
          quantity: {quantity}
          nodeTypeSelector:
            - property: vcluster.com/node-type
              value: vm-small
"""
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
"""


def kubevirt(extra: int = 0) -> str:
    types = [KV_TYPE.format(name="vm-small", limit="        maxCapacity: 3\n"),
             KV_TYPE.format(name="vm-any", limit="")]  # no maxCapacity: no limit
    types += [KV_TYPE.format(name=f"vm-extra-{n}", limit="        maxCapacity: 5\n") for n in range(extra)]
    return KUBEVIRT.format(types="".join(types).rstrip("\n"))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def site(demo_site, apply):
    """The demo's hosts and types; a kubeVirt provider (vm-small up to 3, vm-any no limit); a Metal3 cluster
    whose API nobody answers; tenant alpha with 2 claims on vm-small, each given its machine, one of them gone."""
    apply(kubevirt())
    apply(FAR_METAL3)
    ProviderSecret.objects.create(name="far-site", contents=json.dumps({"kubeconfig": KUBECONFIG.format(
        port=closed_port())}))
    apply(POOL.format(quantity=2), tenant="alpha")
    call_command("reconcile", stdout=io.StringIO())
    assert len(claims_fill().made) == 2
    Machine.objects.filter(pk=Machine.objects.order_by("pk").first().pk).update(state=MachineState.GONE)


@pytest.fixture
def admin(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("root-admin", is_staff=True, is_superuser=True))
    return client


def row(page: str, name: str) -> str:
    pk = NodeType.objects.get(name=name).pk
    text = page[page.index(f'id="node-type-{pk}"'):]
    return text[:text.index("</tr>")]


def cell(html: str, column: str) -> str:
    found = re.search(rf'<td class="cap-{column}[^"]*"[^>]*>(.*?)</td>', html, re.S)
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def test_the_node_types_page_counts_an_external_providers_machines_and_says_no_limit_or_why_not_known(site, admin):
    answer = admin.get(reverse("node-types"))
    assert answer.status_code == 200
    page = unescape(answer.content.decode())
    small = row(page, "vm-small")
    assert (cell(small, "total"), cell(small, "available"), cell(small, "provisioned")) == ("3", "2", "1")
    unlimited = row(page, "vm-any")
    assert (cell(unlimited, "total"), cell(unlimited, "available"), cell(unlimited, "provisioned")) == (
        "no limit", "no limit", "0")
    far = row(page, "far-gpu")
    assert "capacity unknown: Metal3 cluster of provider far unreachable" in cell(far, "machines")
    # The hosts' types still count the console's hosts; no external type counts one (their selectors are theirs).
    gpu = row(page, "gpu-server")
    assert cell(gpu, "total") == str(BareMetalHost.objects.filter(labels__role="gpu").count())


def test_the_api_and_status_json_give_null_for_no_limit_and_the_claimed_machines(site, admin):
    types = {t["name"]: t["capacity"] for t in admin.get("/api/v1/nodetypes/?limit=100").json()["results"]}
    assert types["vm-small"]["total"] == 3 and types["vm-small"]["claimed"] == 1 and types["vm-small"]["machines"]
    assert types["vm-small"]["error"] == 0  # the hosts-in-error column, as for every type
    assert types["vm-small"]["available"] == 2 and types["vm-small"]["provider_error"] == ""
    assert types["vm-any"]["total"] is None and types["vm-any"]["available"] is None
    assert types["far-gpu"]["total"] is None and "far" in types["far-gpu"]["provider_error"]
    assert "machines" not in types["gpu-server"]
    assert types["gpu-server"]["total"] == BareMetalHost.objects.filter(labels__role="gpu").count() > 0

    out = io.StringIO()
    call_command("status", "--json", stdout=out)
    status = {t["name"]: t["capacity"] for t in json.loads(out.getvalue())["node_types"]}
    assert status["vm-small"] == types["vm-small"] and status["vm-any"]["total"] is None
    assert status["far-gpu"]["provider_error"] == types["far-gpu"]["provider_error"]

    out = io.StringIO()
    call_command("status", stdout=out)
    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.startswith("  vm-")}
    assert "no limit" in lines["vm-any"] and "0 machine(s) claimed" in lines["vm-any"]
    assert " 3 " in lines["vm-small"] and "1 machine(s) claimed" in lines["vm-small"]


def test_the_boards_card_and_the_host_allocator_never_count_a_host_for_an_external_type(site):
    card = {t["name"] for t in fleet_capacity()["node_types"]}
    assert card == {"gpu-server", "cpu-server"}
    # The pool's claims have machines, none a host; the allocator's own count ignores the external types.
    assert not NodeClaim.objects.filter(host__isnull=False).exists()


def test_a_member_reads_the_same_capacity_through_the_api_but_not_the_staff_page(site, django_user_model):
    from pools.models import Tenant, TenantMembership

    member = django_user_model.objects.create_user("alice")
    TenantMembership.objects.create(tenant=Tenant.objects.get(name="alpha"), user=member)
    client = Client()
    client.force_login(member)
    assert client.get(reverse("node-types")).status_code in (302, 403)
    types = {t["name"]: t["capacity"] for t in client.get("/api/v1/nodetypes/?limit=100").json()["results"]}
    assert types["vm-small"]["claimed"] == 1


def queries(client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured)


def test_the_queries_per_page_do_not_grow_with_the_external_types(site, admin, apply):
    pages = ("node-types", "/api/v1/nodetypes/?limit=100")
    before = [queries(admin, reverse(p) if not p.startswith("/") else p) for p in pages]
    apply(kubevirt(extra=5))
    assert NodeType.objects.filter(provider__name="kv").count() == 7
    after = [queries(admin, reverse(p) if not p.startswith("/") else p) for p in pages]
    assert after == before
