"""What the host page says is what is true: the cleaning the gate will apply and where it comes from (one rule,
hosts.gate.cleaning.effective_cleaning, for the gate, the API and the page), the BMC's transport as its address
says, and no old error on a host that was retried."""
import re
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from hosts.gate.cleaning import effective_cleaning, gate_for
from hosts.models import BareMetalHost
from hosts.services import host_transition

pytestmark = pytest.mark.django_db
CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@pytest.fixture
def admin(demo_site) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_user("root-admin", "root@example.invalid", "pw-host-page-3c1a",
                                                is_staff=True, is_superuser=True))
    return client


def dd(client: Client, host: str, dd_id: str) -> str:
    html = unescape(client.get(reverse("host", args=[host])).content.decode())
    found = re.search(rf'<dd id="{dd_id}"[^>]*>(.*?)</dd>', html, re.S)
    assert found, f"no {dd_id} on the page of {host}"
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def test_the_host_page_shows_the_cleaning_the_gate_applies_and_where_it_comes_from(admin):
    host = BareMetalHost.objects.get(name="gpu-01")
    assert host.automated_cleaning_mode == "metadata"  # Metal3's setting, as imported
    assert dd(admin, "gpu-01", "host-cleaning") == "full — from NodeType gpu-server (overrides metadata on the host)"
    # The page, the API and the gate say the same.
    assert gate_for(host)["policy"]["method"] == effective_cleaning(host)["method"] == "full"
    api = admin.get(f"/api/v1/hosts/{host.pk}/").json()["effective_cleaning"]
    assert (api["method"], api["source"]) == ("full", "NodeType gpu-server")


def test_a_host_override_is_shown_as_the_hosts_own(admin):
    BareMetalHost.objects.filter(name="gpu-01").update(cleaning_policy="secure")
    assert dd(admin, "gpu-01", "host-cleaning") == \
        "secure — from the host's own cleaning policy (overrides metadata on the host)"
    assert gate_for(BareMetalHost.objects.get(name="gpu-01"))["policy"]["source"] == "host override"


def test_a_plain_http_bmc_is_not_shown_as_tls_verified(admin):
    assert BareMetalHost.objects.get(name="gpu-01").bmc_address.startswith("redfish+http://")
    assert dd(admin, "gpu-01", "host-bmc-tls") == "plain HTTP (no TLS)"
    BareMetalHost.objects.filter(name="gpu-02").update(bmc_address="redfish://10.0.0.2/redfish/v1/Systems/1")
    assert dd(admin, "gpu-02", "host-bmc-tls") == "TLS verification on"
    BareMetalHost.objects.filter(name="gpu-02").update(bmc_disable_certificate_verification=True)
    assert dd(admin, "gpu-02", "host-bmc-tls") == "TLS verification off"


def test_after_retry_the_old_error_is_gone_from_the_host_and_its_page(admin):
    host = BareMetalHost.objects.get(name="gpu-01")
    host_transition(host=host, to_state="maintenance", actor="test")
    host_transition(host=host, to_state="registering", actor="test")
    host_transition(host=host, to_state="error", actor="test", reason="BMC rejected credentials (401)")
    page = unescape(admin.get(reverse("host", args=["gpu-01"])).content.decode())
    assert "BMC rejected credentials (401)" in page
    url = reverse("host-action", args=["gpu-01", "retry"])
    token = CSRF.search(admin.get(url).content.decode()).group(1)
    admin.post(url, {"csrfmiddlewaretoken": token}, follow=True)
    host.refresh_from_db()
    assert host.state == "registering"
    assert (host.error_type, host.error_message) == ("", "")
    assert host.error_count == 1  # errors in a row are counted until the host serves again
    page = unescape(admin.get(reverse("host", args=["gpu-01"])).content.decode())
    assert 'class="field-error">' not in page.split('id="host-summary"', 1)[1].split("</div>", 1)[0]
    assert admin.get(f"/api/v1/hosts/{host.pk}/").json()["error_message"] == ""
