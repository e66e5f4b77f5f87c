"""`manage.py backup` and `restore` on PostgreSQL: a backup turns the console's epoch; a restore holds every host and
brings back the erase certificates signed since the backup from the archive, refusing one that does not verify; with
the BMCs away the world reconcile leaves every host held. Bad input changes nothing."""
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from conftest import is_postgres
from hosts.choices import HostState
from hosts.models import BareMetalHost, EraseCertificate, WorldEpoch

from .api_conftest import gate_evidence

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(not is_postgres(), reason="backup and restore are pg_dump and pg_restore")]


@pytest.fixture
def archive(tmp_path, settings):
    settings.CERTIFICATE_ARCHIVE_DIR = str(tmp_path / "archive")
    settings.BMC_CHECK_TIMEOUT_S = 1
    return tmp_path / "archive"


def test_a_restore_holds_every_host_and_brings_back_the_certificates_signed_since_the_backup(demo_site, archive,
                                                                                              tmp_path):
    host = BareMetalHost.objects.order_by("name").first()
    gate_evidence(host, flow_id="before-backup", tenant="one")
    call_command("backup", str(tmp_path / "backup"), stdout=io.StringIO())
    dumped = json.loads((tmp_path / "backup" / "vmetal-backup.json").read_text())["epoch"]
    world = (archive / "epoch").read_text().strip()
    assert world == WorldEpoch.objects.get().epoch != dumped  # the epoch turned after the dump
    with pytest.raises(CommandError, match="exists"):
        call_command("backup", str(tmp_path / "backup"))
    signed_since, _ = gate_evidence(host, flow_id="after-backup", tenant="two")
    assert (archive / f"{signed_since.certificate_id}.json").exists()
    (archive / "0badc0de-0000-4000-8000-000000000000.json").write_text('{"certificate": {}, "signature": {}}')
    states = dict(BareMetalHost.objects.values_list("name", "state"))

    err = io.StringIO()
    call_command("restore", str(tmp_path / "backup"), stdout=io.StringIO(), stderr=err)
    assert set(BareMetalHost.objects.values_list("state", flat=True)) == {HostState.HELD}
    assert dict(BareMetalHost.objects.values_list("name", "held_from")) == states
    assert EraseCertificate.objects.get(flow_id="after-backup").host == host  # its newest certificate, back
    assert EraseCertificate.objects.filter(host=host).order_by("-created_at").first().flow_id == "after-backup"
    assert "refused archived certificate 0badc0de" in err.getvalue()
    assert not EraseCertificate.objects.filter(document__certificate_id__startswith="0badc0de").exists()

    # The demo's BMCs do not answer: the world reconcile decides nothing, every host stays held.
    out = io.StringIO()
    call_command("reconcile-world", stdout=out)
    assert set(BareMetalHost.objects.values_list("state", flat=True)) == {HostState.HELD}
    assert "still held" in out.getvalue() and WorldEpoch.objects.get().epoch == world


def test_a_directory_that_is_not_a_backup_is_refused_and_nothing_changes(demo_site, tmp_path):
    states = sorted(BareMetalHost.objects.values_list("name", "state"))
    (tmp_path / "nothing").mkdir()
    with pytest.raises(CommandError, match="not a pg_dump directory"):
        call_command("restore", str(tmp_path / "nothing"))
    assert sorted(BareMetalHost.objects.values_list("name", "state")) == states
