"""The pod watchers' leases (autonodes/leases.py): a tenant's watch held by one process until its lease lapses, the
writes of a process that lost it going nowhere, and the live processes counted per shard."""
from datetime import timedelta

import pytest
from django.utils import timezone

from autonodes.choices import WatchState
from autonodes.leases import (
    held_watch,
    lease_release,
    lease_take,
    leases_renew,
    watcher_alive,
    watcher_gone,
)
from autonodes.models import TenantWatch
from pools.models import Tenant

pytestmark = pytest.mark.django_db


def lapse(tenant: Tenant) -> None:
    TenantWatch.objects.filter(tenant=tenant).update(held_until=timezone.now() - timedelta(seconds=1))


def test_a_held_watch_is_taken_by_another_only_once_its_lease_lapsed():
    tenant = Tenant.objects.create(name="acme")
    assert lease_take(holder="a", tenant_id=tenant.pk, lease_s=30)
    assert not lease_take(holder="b", tenant_id=tenant.pk, lease_s=30)
    assert leases_renew(holder="a", tenant_ids=[tenant.pk], lease_s=30) == {tenant.pk}
    assert leases_renew(holder="b", tenant_ids=[tenant.pk], lease_s=30) == set()

    lapse(tenant)  # a stopped renewing (killed, cut off)
    assert lease_take(holder="b", tenant_id=tenant.pk, lease_s=30)
    assert leases_renew(holder="a", tenant_ids=[tenant.pk], lease_s=30) == set()  # a learns it at its next poll
    assert held_watch(holder="a", tenant_id=tenant.pk).update(state=WatchState.BACKING_OFF) == 0  # writes nothing
    lease_release(holder="a", tenant_id=tenant.pk)  # nor gives away what is b's
    assert TenantWatch.objects.get(tenant=tenant).holder == "b"

    lease_release(holder="b", tenant_id=tenant.pk)
    watch = TenantWatch.objects.get(tenant=tenant)
    assert (watch.holder, watch.held_until, watch.state) == ("", None, WatchState.STOPPED)
    assert lease_take(holder="a", tenant_id=tenant.pk, lease_s=30)  # free again at once


def test_a_lapsed_lease_nobody_took_is_still_its_holders():
    tenant = Tenant.objects.create(name="acme")
    assert lease_take(holder="a", tenant_id=tenant.pk, lease_s=30)
    lapse(tenant)
    assert leases_renew(holder="a", tenant_ids=[tenant.pk], lease_s=30) == {tenant.pk}
    assert TenantWatch.objects.get(tenant=tenant).held_until > timezone.now()


def test_the_live_watcher_processes_are_counted_per_shard_and_a_clean_stop_leaves_at_once():
    assert watcher_alive(name="a", shard="0/1", lease_s=30) == 1
    assert watcher_alive(name="b", shard="0/1", lease_s=30) == 2
    assert watcher_alive(name="c", shard="1/2", lease_s=30) == 1
    watcher_gone(name="b")
    assert watcher_alive(name="a", shard="0/1", lease_s=30) == 1
