"""Pool changes reach a real Celery worker on the real broker: the reconcile follows the change."""
import pytest
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from pools.models import NodePool
from pools.services import pool_set_quantity


@pytest.mark.django_db(transaction=True)
def test_a_quantity_change_is_reconciled_by_the_worker_without_a_timer(apply, demo_site, seed_block,
                                                                     celery_worker_process):
    # The demo hosts' BMCs do not exist here, so what happens after allocation does not matter:
    # count the allocations in the Event log.
    def scheduled(pool_name):
        return Event.objects.filter(object_type="claim", to_state=ClaimPhase.PROVISIONING,
                                    claim__pool_name=pool_name)

    apply(seed_block, tenant="one")  # its on-commit reconcile runs in the worker
    wait_for(lambda: scheduled("gpu").count() == 1 and scheduled("cpu").count() == 1)
    pool = NodePool.objects.get(name="gpu")
    pool_set_quantity(pool=pool, quantity=3, actor="user:test")
    wait_for(lambda: scheduled("gpu").values("claim").distinct().count() == 3)
    assert NodeClaim.objects.filter(pool=pool).count() == 3


def test_beat_runs_the_reconciler_the_sweeper_the_re_drive_the_bmc_and_launch_checks_as_registered_tasks(settings, db):
    from vmetal_console.celery import app

    # db: as it imports the tasks, Celery runs Django's system checks, and the key check reads the key canary.
    app.loader.import_default_modules()
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled == {"claims.tasks.reconcile_pools", "hosts.tasks.sweep_overdue_hosts",
                         "hosts.tasks.drive_stale_hosts", "hosts.tasks.check_bmcs", "hosts.tasks.preflight_due",
                         "autonodes.tasks.check_launches", "claims.tasks.free_leaked_addresses", "events.tasks.prune_audit",
                         "events.tasks.prune_events",
                         "autonodes.tasks.decide_waiting", "autonodes.tasks.disrupt", "hosts.tasks.repair_due",
                         "hosts.tasks.sweep_warm_hosts", "hosts.tasks.idle_checks_start",
                         "machines.tasks.reconcile_machines", "autonodes.tasks.roll", "claims.tasks.end_kept_holds"}
    assert scheduled <= set(app.tasks)
