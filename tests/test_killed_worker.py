"""A worker killed mid-step costs its host one short drive lease, not minutes, and its unacknowledged tasks come
back after the broker's visibility timeout: a real Celery worker on the real broker, killed with SIGKILL while
a step waits on a BMC that never answers."""
import re
import socket
import threading
import time

import pytest
from django.utils import timezone

from conftest import wait_for
from hosts.models import BareMetalHost
from hosts.tasks import drive_host

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_S = 3  # renewed every second
SLOW_HOST = """
apiVersion: v1
kind: Secret
metadata: {{name: slow-01-bmc, namespace: metal3}}
stringData: {{username: admin, password: slow-bmc-password}}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata: {{name: slow-01, namespace: metal3}}
spec:
  bmc: {{address: "redfish+http://127.0.0.1:{port}/redfish/v1/Systems/slow-01", credentialsName: slow-01-bmc}}
  bootMACAddress: "52:54:00:00:09:01"
"""


@pytest.fixture
def worker_settings() -> dict:
    # A short lease; a BMC call that waits a minute for an answer (the step outlives many leases).
    return {"DRIVE_LEASE_S": str(LEASE_S), "BMC_TIMEOUT_S": "60", "BROKER_VISIBILITY_TIMEOUT_S": "4"}


class SilentBMC:
    """A BMC that accepts connections and never answers; .connections holds them."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.connections.append(self.server.accept()[0])
            except OSError:
                return

    def close(self):
        """Refuse new connections and drop the held ones: a step waiting on this BMC fails at once."""
        try:
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone leaves it listening)
        except OSError:
            pass
        self.server.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent_bmc():
    bmc = SilentBMC()
    yield bmc
    bmc.close()


@pytest.fixture
def stuck_host(apply, silent_bmc, celery_worker_process):
    """slow-01, registering: the worker drives it and waits in bmc_check for a BMC that never answers."""
    apply(SLOW_HOST.format(port=silent_bmc.port))  # the drive is enqueued on commit
    host = BareMetalHost.objects.get(name="slow-01")
    assert host.state == "registering"
    wait_for(lambda: silent_bmc.connections and BareMetalHost.objects.get(pk=host.pk).drive_lease_until, timeout=30)
    yield BareMetalHost.objects.get(pk=host.pk)
    silent_bmc.close()  # the step fails fast now, and the worker can stop


def test_a_slow_step_keeps_renewing_its_short_lease_and_no_second_worker_takes_the_host(stuck_host, silent_bmc):
    drive_host.delay(host_id=stuck_host.pk)  # another drive asks meanwhile (a heartbeat, the re-drive)
    time.sleep(3 * LEASE_S)
    host = BareMetalHost.objects.get(pk=stuck_host.pk)
    assert host.driven_at == stuck_host.driven_at, "a second drive took the host"
    assert host.drive_lease_until > stuck_host.drive_lease_until  # renewed ...
    assert (host.drive_lease_until - timezone.now()).total_seconds() <= LEASE_S  # ... a short lease at a time
    assert len(silent_bmc.connections) == 1  # one driver at the BMC


def test_a_host_held_by_a_killed_worker_is_driven_again_once_its_short_lease_runs_out(
        stuck_host, silent_bmc, celery_worker_process):
    celery_worker_process.kill()  # SIGKILL mid-step: the lease stays on the row
    killed_at = timezone.now()
    assert BareMetalHost.objects.get(pk=stuck_host.pk).drive_lease_until > killed_at
    celery_worker_process.start()
    drive_host.delay(host_id=stuck_host.pk)  # the next event that drives it
    wait_for(lambda: BareMetalHost.objects.get(pk=stuck_host.pk).driven_at > killed_at, timeout=LEASE_S + 10)
    assert (timezone.now() - killed_at).total_seconds() < LEASE_S + 10
    wait_for(lambda: len(silent_bmc.connections) >= 2, timeout=10)  # the step runs again, from the new worker


def test_a_task_of_a_killed_worker_is_delivered_again_after_the_visibility_timeout(
        stuck_host, celery_worker_process, settings):
    if not settings.CELERY_BROKER_URL.startswith("redis://"):
        pytest.skip("the visibility timeout is Redis's (RabbitMQ requeues when the connection drops)")
    log = celery_worker_process.log
    task_id = re.search(r"Task hosts\.tasks\.drive_host\[([0-9a-f-]+)\] received", log.read_text())[1]
    celery_worker_process.kill()  # the drive_host task it was running stays unacknowledged in Redis
    killed = time.monotonic()
    celery_worker_process.start()
    wait_for(lambda: log.read_text().count(f"drive_host[{task_id}] received") == 2, timeout=20)
    assert time.monotonic() - killed < 4 + 10  # the visibility timeout (4 s here) and a sweep, not an hour
