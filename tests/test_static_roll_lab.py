"""A static pool follows a new OS image, end to end in the lab (PostgreSQL, a real Celery worker with beat, the
lab's servers and tenant API): apply says the pool is configured, the beat's roll replaces its three nodes one at
a time (its budget), the first with a new node on the free server, and the pool never serves fewer than two."""
import pytest

from autonodes.choices import DecisionReason
from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.models import Event
from lab.site import IMAGE_NAME
from pools.models import OSImage

from .lab_conftest import GPU_POOL, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = pytest.mark.django_db(transaction=True)

NEW_IMAGE = "lab-image-b"


@pytest.fixture
def worker_settings() -> dict:
    return {"WITH_BEAT": "1", "AUTONODES_ROLL_EVERY_S": "1"}


def pool(image: str) -> str:
    return GPU_POOL.format(image=image, quantity=3).replace(
        "          quantity: 3\n", "          quantity: 3\n          disruption:\n            budgets:\n"
                                   "              - nodes: \"1\"\n")


def test_a_pool_of_3_follows_a_new_image_one_node_at_a_time_never_below_2(lab_factory, celery_worker_process, apply):
    lab_factory(hosts=4, gpu_hosts=4, tenants=["one"])
    wait_hosts("available", 4)
    apply(pool(IMAGE_NAME), tenant="one")
    try:
        wait_for(lambda: NodeClaim.objects.filter(pool_name="gpu", phase=ClaimPhase.AVAILABLE).count() == 3,
                 timeout=180)
    except AssertionError:
        raise AssertionError(f"the pool did not fill\n{lab_report()}") from None
    old = set(NodeClaim.objects.filter(pool_name="gpu").values_list("name", flat=True))
    image = OSImage.objects.get(name=IMAGE_NAME)  # the same bytes under a new name: a new image to the pool
    OSImage.objects.create(name=NEW_IMAGE, url=image.url, checksum=image.checksum, checksum_type=image.checksum_type,
                           format=image.format)

    assert "nodepool/one/gpu configured" in " ".join(apply(pool(NEW_IMAGE), tenant="one"))

    seen = []

    def rolled() -> bool:
        serving = list(NodeClaim.objects.filter(pool_name="gpu", phase=ClaimPhase.AVAILABLE))
        seen.append(len(serving))
        return len(serving) == 3 and all(c.properties["vcluster.com/os-image"] == NEW_IMAGE for c in serving)

    try:
        wait_for(rolled, timeout=420)
    except AssertionError:
        raise AssertionError(f"the pool was not rolled (serving seen: {seen})\n{lab_report()}") from None
    assert min(seen) >= 2, seen  # quantity − 1 at worst, at every observed step
    assert not NodeClaim.objects.filter(name__in=old, phase=ClaimPhase.AVAILABLE).exists()  # each one replaced
    steps = [e.message for e in Event.objects.filter(kind="decision", data__reason=DecisionReason.DRIFTED)
             .order_by("pk")]
    assert steps[0].startswith("replacing ") and "new claim" in steps[0], steps  # the free server first
    assert sum(s.startswith(("replacing ", "re-imaging ")) for s in steps) == 3, steps
