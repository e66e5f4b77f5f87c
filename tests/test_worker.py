"""Pool changes reach a real Celery worker on the real broker: the reconcile follows the change."""
import pytest
from django.core.management import call_command

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from pools.models import NodePool
from pools.services import pool_set_quantity


@pytest.mark.django_db(transaction=True)
def test_a_quantity_change_is_reconciled_by_the_worker_without_a_timer(apply, demo_site, seed_block,
                                                                     celery_worker_process):
    apply(seed_block, tenant="one")  # its on-commit reconcile runs in the worker
    wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.PROVISIONING).count() == 2)
    pool = NodePool.objects.get(name="gpu")
    pool_set_quantity(pool=pool, quantity=3, actor="user:test")
    wait_for(lambda: NodeClaim.objects.filter(pool=pool, phase=ClaimPhase.PROVISIONING).count() == 3)
    assert NodeClaim.objects.filter(pool=pool).values("host").distinct().count() == 3
    call_command("reconcile")  # nothing left to do
    assert NodeClaim.objects.count() == 4
