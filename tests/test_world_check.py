"""How a process notices a restored database (hosts.restore.world_check): it holds every host and asks a worker for
the world reconcile, every time it notices one; after the hold the epochs agree again, so no other process asks, and
a request left out would leave the hosts held."""
import pytest

from claims.task_names import WORLD_RECONCILE
from hosts import restore
from hosts.choices import HostState
from hosts.models import BareMetalHost, WorldEpoch
from vmetal_console.celery import app as celery_app

pytestmark = pytest.mark.django_db


@pytest.fixture
def reconciles(monkeypatch) -> list[dict]:
    """The world reconciles asked for (sent by name); other tasks go out as ever."""
    sent = []
    send_task = celery_app.send_task

    def spy(name, *args, kwargs=None, **options):
        if name == WORLD_RECONCILE:
            return sent.append(kwargs)
        return send_task(name, *args, kwargs=kwargs, **options)

    monkeypatch.setattr(celery_app, "send_task", spy)
    return sent


def test_each_restore_a_process_notices_holds_every_host_and_asks_for_the_world_reconcile(
        demo_site, tmp_path, settings, monkeypatch, reconciles):
    settings.CERTIFICATE_ARCHIVE_DIR = str(tmp_path / "archive")
    restore.epoch_turn()  # a backup: the world's epoch is now one no dump carries
    assert restore.world_check() and reconciles == []
    # Two restores in a row, seconds apart (a drill done twice): each is noticed, each asks for the reconcile.
    for backup in ("first", "second"):
        WorldEpoch.objects.update(epoch=f"dumped-by-the-{backup}-backup")
        monkeypatch.setattr(restore, "_checked_at", 0.0)  # a process that has not looked within CHECKED_FOR_S
        assert restore.world_check() is False
        assert set(BareMetalHost.objects.values_list("state", flat=True)) == {HostState.HELD}
    assert reconciles == [{}, {}]
