"""One list convention, the fleet board's, on every list: sortable column headers (one partial, one helper), filters
whose selects read "any", names that link to their page and edit URLs by name; the claims API sorts as the page
does."""
import io
import re

import pytest
from django.core.management import call_command

from claims.models import NodeClaim
from pools.models import NodeEnvironment, NodeProvider, NodeType, OSImage, Tenant
from pools.services import pool_set_quantity

pytest.register_assert_rewrite("tests.console_conftest")
from .console_conftest import pool  # noqa: E402

pytest_plugins = ["tests.console_conftest"]
pytestmark = pytest.mark.django_db


@pytest.fixture
def claims_in_two_pools(users):
    """Tenant two: three cpu claims; tenant one: one gpu claim."""
    Tenant.objects.filter(name="two").update(quota_nodes=None)
    pool_set_quantity(pool=pool("two", "cpu"), quantity=3, actor="test")
    pool_set_quantity(pool=pool("one", "gpu"), quantity=1, actor="test")
    call_command("reconcile", stdout=io.StringIO())
    assert NodeClaim.objects.count() == 4
    return users


def admin(client, users):
    client.force_login(users["admin"])
    return client


def row_names(html: str) -> list[str]:
    return re.findall(r'<tr id="claim-\d+"[^>]*>\s*<td><a href="/claims/([^/]+)/">', html)


def test_the_claims_list_sorts_by_its_headers_and_filters_by_pool_and_node_type(client, claims_in_two_pools):
    admin(client, claims_in_two_pools)
    html = client.get("/claims/").content.decode()
    # The headers link to the list sorted by each column, through the fleet board's partial.
    for key in ("name", "tenant", "pool", "phase", "node_type", "host", "created"):
        assert f'<a class="sort" href="?sort={key}">' in html, key
    names = sorted(NodeClaim.objects.values_list("name", flat=True))
    assert row_names(client.get("/claims/", {"sort": "name"}).content.decode()) == names
    descending = client.get("/claims/", {"sort": "-name", "phase": "live"}).content.decode()
    assert row_names(descending) == names[::-1]
    assert '<a class="sort sorted" href="?sort=name&amp;phase=live">Claim ▼</a>' in descending
    # Pool and NodeType filters, their selects reading "any".
    assert re.search(r'<select name="pool"><option value="">any</option><option >cpu</option><option >gpu</option>',
                     html)
    assert re.search(r'<select name="node_type"><option value="">any</option><option >cpu-server</option>'
                     r'<option >gpu-server</option>', html)
    gpu = client.get("/claims/", {"pool": "gpu"}).content.decode()
    assert row_names(gpu) == list(NodeClaim.objects.filter(pool_name="gpu").values_list("name", flat=True))
    cpu = client.get("/claims/", {"node_type": "cpu-server", "sort": "name"}).content.decode()
    assert row_names(cpu) == sorted(NodeClaim.objects.filter(pool_name="cpu").values_list("name", flat=True))
    assert '<input type="hidden" name="sort" value="name">' in cpu  # filtering again keeps the order


def test_a_member_s_claims_list_offers_only_their_own_pools(client, claims_in_two_pools):
    client.force_login(claims_in_two_pools["bob"])
    html = client.get("/claims/").content.decode()
    assert re.search(r'<select name="pool"><option value="">any</option><option >cpu</option></select>', html)
    assert row_names(client.get("/claims/", {"pool": "gpu"}).content.decode()) == []  # one's gpu claim: not his


def test_the_claims_api_sorts_as_the_page_does(client, claims_in_two_pools):
    admin(client, claims_in_two_pools)
    names = sorted(NodeClaim.objects.values_list("name", flat=True))
    answer = client.get("/api/v1/claims/", {"sort": "-name"})
    assert answer.status_code == 200
    assert [c["name"] for c in answer.json()["results"]] == names[::-1]
    by_pool = client.get("/api/v1/claims/", {"sort": "-pool,name"}).json()["results"]
    assert [(c["pool"], c["name"]) for c in by_pool] == sorted(
        NodeClaim.objects.values_list("pool_name", "name"), key=lambda pair: (pair[0] != "gpu", pair[1]))
    refused = client.get("/api/v1/claims/", {"sort": "bmc_password"})
    assert refused.status_code == 400 and "sort" in refused.json()


@pytest.mark.parametrize("list_url", ["/node-types/", "/providers/", "/environments/", "/images/", "/tenants/"])
def test_a_catalogue_list_has_one_name_filter_and_selects_reading_any(client, users, list_url):
    admin(client, users)
    html = client.get(list_url).content.decode()
    assert 'name="q"' in html and "Name contains" in html
    assert 'name="name"' not in html  # no "Name" beside "Name contains"
    assert "---------" not in html


def test_catalogue_names_link_to_their_pages_and_edit_urls_use_names(client, users):
    admin(client, users)
    node_types = client.get("/node-types/").content.decode()
    assert '<a class="object-name" href="/catalogue/node-types/gpu-server/edit/"><b>gpu-server</b></a>' in node_types
    assert 'href="/providers/?q=metal3">metal3</a>' in node_types
    providers = client.get("/providers/").content.decode()
    assert '<a class="object-name" href="/providers/metal3/"><b>metal3</b></a>' in providers  # its page
    assert '<a href="/catalogue/providers/metal3/edit/">edit</a>' in providers
    images = client.get("/images/").content.decode()
    assert 'href="/catalogue/images/ubuntu2404-20260926/edit/"' in images
    env = NodeEnvironment.objects.order_by("pk").first()
    environments = client.get("/environments/").content.decode()
    assert f'href="/catalogue/environments/{env.namespace}/{env.name}/edit/"' in environments
    for url in ("/catalogue/node-types/gpu-server/edit/", "/catalogue/providers/metal3/edit/",
                "/catalogue/images/ubuntu2404-20260926/edit/",
                f"/catalogue/environments/{env.namespace}/{env.name}/edit/"):
        assert client.get(url).status_code == 200, url
    assert re.search(r"/catalogue/\w[\w-]*/\d+/edit/", node_types + providers + images + environments) is None


def test_an_old_edit_url_by_id_goes_to_the_one_by_name_and_a_wrong_one_is_a_404(client, users):
    admin(client, users)
    gpu = NodeType.objects.get(name="gpu-server")
    env = NodeEnvironment.objects.order_by("pk").first()
    for old, new in ((f"/catalogue/node-types/{gpu.pk}/edit/", "/catalogue/node-types/gpu-server/edit/"),
                     (f"/catalogue/providers/{NodeProvider.objects.get(name='metal3').pk}/edit/",
                      "/catalogue/providers/metal3/edit/"),
                     (f"/catalogue/images/{OSImage.objects.get().pk}/edit/",
                      "/catalogue/images/ubuntu2404-20260926/edit/"),
                     (f"/catalogue/environments/{env.pk}/edit/",
                      f"/catalogue/environments/{env.namespace}/{env.name}/edit/")):
        answer = client.get(old)
        assert (answer.status_code, answer.headers["Location"]) == (301, new), old
    for missing in ("/catalogue/node-types/99999/edit/", "/catalogue/node-types/no-such-type/edit/",
                    "/catalogue/environments/no-such-env/edit/", "/catalogue/images/x/y/edit/"):
        assert client.get(missing).status_code == 404, missing


def test_an_auditor_s_catalogue_names_link_to_what_they_may_see(client, users):
    client.force_login(users["auditor"])
    node_types = client.get("/node-types/").content.decode()
    assert '<a class="object-name" href="/hosts/?node_type=gpu-server"><b>gpu-server</b></a>' in node_types
    assert 'href="/catalogue/' not in node_types
    assert client.get("/catalogue/node-types/gpu-server/edit/").status_code == 403


def test_a_catalogue_form_s_empty_choices_say_what_they_mean(client, users):
    admin(client, users)
    env = NodeEnvironment.objects.order_by("pk").first()
    for url in ("/catalogue/node-types/new/", "/catalogue/node-types/gpu-server/edit/", "/catalogue/providers/new/",
                "/catalogue/environments/new/", f"/catalogue/environments/{env.namespace}/{env.name}/edit/",
                "/catalogue/images/new/", "/catalogue/tenants/new/"):
        html = client.get(url).content.decode()
        assert "---------" not in html, url
    assert re.search(r'<option value=""( selected)?>shared \(every tenant\)</option>',
                     client.get("/catalogue/environments/new/").content.decode())
    node_type = client.get("/catalogue/node-types/new/").content.decode()
    assert re.search(r'<option value=""( selected)?>none</option>', node_type)
