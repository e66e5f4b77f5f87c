"""The audit trail: a pool changed in the console, through the API (a token) and with `manage.py apply` is found
three times in the export, each with its actor, how it was signed in, through which role, its client address and
before → after; the export as JSON lines, CSV and GET /api/v1/audit/ (admins and auditors only) say the same;
secrets stay redacted; AUDIT_RETENTION_DAYS prunes people's old rows and nothing else."""
pytest_plugins = ["tests.api_conftest"]

import csv  # noqa: E402
import datetime  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import CommandError, call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from events import task_names  # noqa: E402
from events.models import Event  # noqa: E402
from events.tasks import prune_audit  # noqa: E402
from hosts.models import EraseCertificate  # noqa: E402
from pools.models import NodePool, Tenant  # noqa: E402
from tests.api_conftest import ALPHA_POOLS, gate_evidence  # noqa: E402

pytestmark = pytest.mark.django_db


def export(*args) -> str:
    out = io.StringIO()
    call_command("audit", "export", *args, stdout=out)
    return out.getvalue()


def pool_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["object_type"] == "pool" and r["object"] == "alpha/gpu"]


def test_a_pool_changed_in_the_console_the_api_and_apply_is_in_the_export_three_times_with_who_where_and_what(
        world, apply):
    since = timezone.now().isoformat()
    console = Client(REMOTE_ADDR="192.0.2.10")
    console.force_login(world.users["member_a"])
    assert console.post("/tenants/alpha/pools/gpu/quantity/", {"quantity": 2}).status_code == 302
    api = world.client("member_a")
    prefix = world.tokens["member_a"][:8]
    assert api.patch(f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 3}, format="json",
                     REMOTE_ADDR="198.51.100.7").status_code == 200
    apply(ALPHA_POOLS.replace("quantity: 1", "quantity: 4"), tenant="alpha")
    assert NodePool.objects.get(pk=world.pool_a.pk).quantity == 4

    rows = [json.loads(line) for line in export("--since", since, "--format", "jsonl").splitlines()]
    found = [(r["actor"], r["via"], r["role"], r["address"], r["tenant"], r["before"], r["after"])
             for r in pool_rows(rows)]
    assert found[0] == ("user:alice-alpha", "session", "member of alpha", "192.0.2.10", "alpha",
                        {"quantity": 1}, {"quantity": 2})
    assert found[1] == ("user:alice-alpha", f"token {prefix} (read-write)", "member of alpha", "198.51.100.7", "alpha",
                        {"quantity": 2}, {"quantity": 3})
    actor, via, role, address, tenant, before, after = found[2]
    assert actor.startswith("cli:") and (via, address, tenant) == ("manage.py", "", "alpha")
    assert before["quantity"] == 3 and after["quantity"] == 4
    assert len(found) == 3
    assert all(set(r) == {"id", "at", "actor", "via", "role", "address", "kind", "object_type", "object", "tenant",
                          "message", "before", "after", "schema"} and r["schema"] == 1 for r in rows)

    table = list(csv.DictReader(io.StringIO(export("--since", since, "--format", "csv"))))
    assert [(r["actor"], r["address"], json.loads(r["before"]), json.loads(r["after"]))
            for r in pool_rows(table)] == [(f[0], f[3], f[5], f[6]) for f in found]

    by_api = world.client("auditor").get("/api/v1/audit/", {"since": since, "page_size": 500})
    assert by_api.status_code == 200
    assert pool_rows(by_api.json()["results"]) == pool_rows(rows)


def test_only_admins_and_auditors_read_the_audit_trail(world, api):
    assert api("admin", "get", "/api/v1/audit/").status_code == 200
    assert api("auditor", "get", "/api/v1/audit/").status_code == 200
    for role, status in (("member_a", 403), ("member_b", 403), ("anonymous", 401)):
        assert api(role, "get", "/api/v1/audit/").status_code == status


def test_a_secret_changed_is_recorded_as_set_never_as_its_value(world, api):
    since = timezone.now().isoformat()
    kubeconfig = Tenant.objects.get(pk=world.alpha.pk).kubeconfig
    changed = kubeconfig.replace("kc-alpha-", "kc-alpha-new-")
    assert api("admin", "patch", f"/api/v1/tenants/{world.alpha.pk}/", {"kubeconfig": changed}).status_code == 200
    text = export("--since", since)
    row = next(json.loads(line) for line in text.splitlines() if '"kubeconfig"' in line)
    assert row["before"]["kubeconfig"] == "(set)" and row["after"]["kubeconfig"] == "(set)"
    assert row["role"] == "admin" and row["via"].startswith("token ")
    assert "kc-alpha" not in text


def test_bad_ranges_are_refused_saying_why(world):
    with pytest.raises(CommandError, match="not a date"):
        export("--since", "yesterday")
    with pytest.raises(CommandError, match="--until must come after --since"):
        export("--since", "2026-12-02", "--until", "2026-12-01")


def test_retention_prunes_people_s_old_rows_and_keeps_the_console_s_own_and_every_erase_certificate(
        world, api, settings):
    gate_evidence(world.host_a, flow_id="release-old", tenant="alpha")
    certificates = EraseCertificate.objects.count()
    assert api("member_a", "patch", f"/api/v1/pools/{world.pool_a.pk}/", {"quantity": 2}).status_code == 200
    person = Event.objects.filter(actor="user:alice-alpha", object_type="pool").latest("id")
    own = Event.objects.exclude(actor__startswith="user:").exclude(actor__startswith="cli:").exclude(
        kind="security").latest("id")
    long_ago = timezone.now() - datetime.timedelta(days=40)
    Event.objects.filter(pk__in=[person.pk, own.pk]).update(created_at=long_ago)
    settings.AUDIT_RETENTION_DAYS = 0
    assert prune_audit() == 0 and Event.objects.filter(pk=person.pk).exists()
    settings.AUDIT_RETENTION_DAYS = 30
    assert prune_audit() >= 1
    assert not Event.objects.filter(pk=person.pk).exists() and Event.objects.filter(pk=own.pk).exists()
    assert EraseCertificate.objects.count() == certificates


def test_the_beat_sends_the_prune_by_its_declared_name():
    assert {"task": task_names.PRUNE_AUDIT, "schedule": 86400.0} in settings.CELERY_BEAT_SCHEDULE.values()


def test_an_export_with_secrets_is_a_recorded_secret_read(world, tmp_path):
    since = timezone.now().isoformat()
    call_command("export", "--include-secrets", "-o", str(tmp_path / "site.yaml"))
    call_command("export", "-o", str(tmp_path / "redacted.yaml"))
    reads = [json.loads(line) for line in export("--since", since).splitlines()]
    assert [(r["kind"], r["via"], r["message"]) for r in reads if r["kind"] == "read"] == [
        ("read", "manage.py", "export with the BMC credentials (--include-secrets)")]


def test_an_object_made_is_exported_with_what_it_was_made_with_and_its_secrets_redacted(world, api):
    since = timezone.now().isoformat()
    body = {"name": "gpu-77", "bmc_address": "redfish+http://127.0.0.1:8077/redfish/v1/Systems/gpu-77",
            "boot_mac": "52:54:00:00:77:01", "bmc_username": "bmcuser-77", "bmc_password": "s3cret-77!",
            "labels": {"role": "gpu"}}
    assert api("admin", "post", "/api/v1/hosts/", body).status_code == 201
    text = export("--since", since)
    row = next(json.loads(line) for line in text.splitlines() if '"gpu-77"' in line)
    assert row["before"] == {} and row["message"] == "created"
    assert row["after"]["bmc_address"] == body["bmc_address"] and row["after"]["labels"] == {"role": "gpu"}
    assert row["after"]["bmc_password"] == "(set)" and "s3cret-77" not in text
