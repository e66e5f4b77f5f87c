"""Whoever fetches a boot's configuration first does not become the host's agent: the server's own fetch reveals
the race, the boot is void (its sessions end, nothing its agent reported counts, no tenant secret ever reaches
it), and the host boots again with a new secret, early and without a failure counted; a network that races
every boot sends the host to repair. Against the lab, a real worker and the live agent listener."""
import json
import threading
import urllib.error
import urllib.request

import pytest

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from conftest import wait_for
from events.choices import EventKind
from events.models import Event
from hosts.choices import HostState
from hosts.models import BareMetalHost, EraseCertificate, RamdiskBoot
from hosts.selectors import host_recent_failures

from .lab_conftest import gpu_pool, lab_report, wait_hosts

pytest_plugins = ["tests.lab_conftest"]
pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TENANT_SECRET_COMMANDS = {"check_endpoint", "write_seed"}


class Adversary:
    """Someone on the provisioning network who knows the host's MAC: asks for its iPXE script again and again so
    as to get it before the server does (`thefts` boots at most; 0: every boot), and then, unless `prefetch_only`,
    answers as its agent: a lookup with the stolen secret, every command answered at once with a forged pass
    (erase and verify for one of the two disks, under a serial that is not the inventory's)."""

    def __init__(self, console_url: str, host: BareMetalHost, *, thefts: int = 1, prefetch_only: bool = False):
        self.url, self.host, self.thefts, self.prefetch_only = console_url, host, thefts, prefetch_only
        self.stolen, self.commands, self.statuses = [], [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)

    def _call(self, method: str, path: str, body: dict | None = None, token: str | None = None):
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, b""
        except OSError:
            return None, b""

    def run(self):
        mac = self.host.boot_mac.replace(":", "-")
        while not self.stop.is_set() and (not self.thefts or len(self.stolen) < self.thefts):
            status, script = self._call("GET", f"/boot/{mac}.ipxe")
            if status == 200:
                secret = next(w for w in script.decode().split() if w.startswith("vmetal.boot_secret="))
                self.stolen.append(secret.split("=", 1)[1])
                if not self.prefetch_only:
                    self.act_as_agent(self.stolen[-1])
            else:
                self.stop.wait(0.02)

    def act_as_agent(self, secret: str):
        status, body = self._call("POST", "/agent/lookup", {"macs": [self.host.boot_mac], "boot_id": "rogue",
                                                           "boot_secret": secret})
        self.statuses.append(("lookup", status))
        if status != 200:
            return
        token = json.loads(body)["token"]
        while not self.stop.is_set():
            status, body = self._call("POST", "/agent/heartbeat", {"host_id": self.host.pk, "status": "idle"}, token)
            self.statuses.append(("heartbeat", status))
            if status != 200:
                return  # the session is over
            command = json.loads(body).get("command")
            if command:
                self.commands.append(command["name"])
                self._call("POST", "/agent/result", {"host_id": self.host.pk, "command_id": command["id"], "ok": True,
                                                     "result": forged(command)}, token)
            self.stop.wait(0.05)


def forged(command: dict) -> dict:
    disk = {"name": "nvme0n1", "ok": True, "serial": "FORGED-SERIAL", "model": "forged", "size_bytes": 1 << 30,
            "requested": "secure", "method": "secure", "method_type": "Purge", "expectation": "changed",
            "canaries_planted": 64, "bytes_written": 0}
    if command["name"] == "erase":
        return {"disks": [disk]}
    if command["name"] == "verify_erase":
        return {"passed": True, "disks": [{
            "name": "nvme0n1", "serial": "FORGED-SERIAL", "expectation": "changed", "mode": "sampled", "passed": True,
            "canaries": {"planted": 64, "checked": 64, "survived": 0, "survivors": []},
            "samples": {"count": 586, "chunk": 65536, "share": 0.01, "dirty": 0, "unchanged": 0}, "findings": []}]}
    return {}


def raced_events(host) -> list[Event]:
    return [e for e in Event.objects.filter(kind=EventKind.SECURITY, host=host).order_by("pk") if "raced" in e.message]


@pytest.fixture
def open_listener(settings):
    # The adversary asks many times a second from the lab's own address (127.0.0.1): the per-address rate limit
    # would refuse the lab's servers too, which is another attack than this one.
    settings.AGENT_RATE_LIMITS = {"lookup": (100000, 60), "call_per_address": (100000, 60)}


def test_an_adversary_that_races_the_boot_and_answers_as_the_agent_never_becomes_the_hosts_agent(
        lab_factory, celery_worker_process, apply, open_listener):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    try:
        # The provision's boot, stolen: the stolen session must get no command with the tenant's secret.
        with Adversary(site.console_url, host) as provision_thief:
            apply(gpu_pool(1), tenant="one")
            claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=150)
        assert provision_thief.stolen, "the adversary got the provision's iPXE script first"
        assert not TENANT_SECRET_COMMANDS & set(provision_thief.commands), provision_thief.commands
        assert ("heartbeat", 403) in provision_thief.statuses or ("lookup", 403) in provision_thief.statuses
        assert len(raced_events(host)) == 1
        # The release's boot, stolen: forged erase and verify passes for one of two disks must sign nothing.
        with Adversary(site.console_url, host) as release_thief:
            apply(gpu_pool(0), tenant="one")
            wait_for(lambda: NodeClaim.objects.filter(pk=claim.pk, phase=ClaimPhase.RELEASED).exists()
                     or not NodeClaim.objects.filter(pk=claim.pk).exists(), timeout=150)
            wait_hosts("available", 1, timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    assert release_thief.stolen, "the adversary got the release's iPXE script first"
    events = raced_events(host)
    assert len(events) == 2, [e.message for e in events]  # one per raced boot, each naming it and the addresses
    assert events[1].data["boot"] != events[0].data["boot"] and "127.0.0.1" in events[1].data["addresses"]
    assert "the host boots again with a new secret" in events[1].message
    assert not EraseCertificate.objects.filter(serial="FORGED-SERIAL").exists()
    assert not EraseCertificate.objects.filter(revoked_at__isnull=False).exists()  # nothing was signed from it
    # the real agent erased every disk of the host after the race: a passing certificate for each
    release_flow = EraseCertificate.objects.filter(host=host).order_by("-created_at").first().flow_id
    serials = sorted(EraseCertificate.objects.filter(flow_id=release_flow, result="pass")
                     .values_list("serial", flat=True))
    assert serials == sorted(d["serial"] for d in site.hosts[host.name].profile()["disks"])
    assert BareMetalHost.objects.get().state == HostState.AVAILABLE
    assert not host_recent_failures(host=host)  # a race is no failure of the host


def test_a_prefetch_only_adversary_gets_the_host_booted_again_early_and_no_failure_counted(
        lab_factory, celery_worker_process, apply, open_listener, settings):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    try:
        with Adversary(site.console_url, host, prefetch_only=True) as thief:
            apply(gpu_pool(1), tenant="one")
            claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    assert len(thief.stolen) == 1 and len(raced_events(host)) == 1
    raced = RamdiskBoot.objects.get(raced_at__isnull=False)
    after = RamdiskBoot.objects.filter(host=host, created_at__gt=raced.created_at).order_by("created_at").first()
    # booted again as soon as the server's own fetch showed the race, not after the lookup deadline
    assert (after.created_at - raced.created_at).total_seconds() < settings.AGENT_LOOKUP_DEADLINE_S / 2
    retry = Event.objects.filter(host=host, kind=EventKind.STEP, message__contains="raced").first()
    assert retry is not None and retry.message.startswith("retrying: boot"), lab_report()
    assert not host_recent_failures(host=host)
    claim.refresh_from_db()
    assert claim.failed_hosts == [] and claim.attempts == 1  # nor of the claim: the same host, one attempt
    assert not Event.objects.filter(host=host, kind=EventKind.TRANSITION, to_state=HostState.ERROR).exists()


def test_a_host_whose_every_boot_is_raced_goes_to_repair_because_the_network_is_not_trusted(
        lab_factory, celery_worker_process, apply, open_listener, settings):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    try:
        with Adversary(site.console_url, host, thefts=0, prefetch_only=True):
            apply(gpu_pool(1), tenant="one")
            wait_hosts("repair", 1, timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    moved = Event.objects.filter(host=host, kind=EventKind.TRANSITION, to_state=HostState.REPAIR).last()
    races = settings.BOOT_RACES_BEFORE_REPAIR
    assert moved.message == f"boot raced {races} times: the provisioning network is not trusted"
    assert len(raced_events(host)) == races
    assert not host_recent_failures(host=host)


def test_a_boot_that_nothing_fetched_is_booted_again_early_with_the_reason_and_no_failure_counted(
        lab_factory, celery_worker_process, apply, settings):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"])
    wait_hosts("available", 1)
    host = BareMetalHost.objects.get()
    site.set_fault(host.name, "no-tftp")  # the server's network boot never reaches the agent listener
    try:
        apply(gpu_pool(1), tenant="one")
        lost = wait_for(lambda: Event.objects.filter(host=host, kind=EventKind.STEP,
                                                     message__startswith="retrying: the boot is lost").first(),
                        timeout=60)
        site.set_fault(host.name, "")
        claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=150)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    assert "the server did not fetch its iPXE script within" in lost.message
    first = RamdiskBoot.objects.filter(host=host, fetches=0).order_by("created_at").first()
    second = RamdiskBoot.objects.filter(host=host, created_at__gt=first.created_at).order_by("created_at").first()
    assert (second.created_at - first.created_at).total_seconds() < settings.AGENT_LOOKUP_DEADLINE_S / 2
    assert not host_recent_failures(host=host)
    claim.refresh_from_db()
    assert claim.failed_hosts == [] and claim.attempts == 1


def test_a_warm_hosts_boot_raced_during_its_provision_revokes_its_gate_and_the_host_is_cleaned_again(
        lab_factory, celery_worker_process, apply, open_listener):
    site = lab_factory(hosts=1, gpu_hosts=1, tenants=["one"], warm=1)
    wait_for(lambda: BareMetalHost.objects.filter(state=HostState.AVAILABLE, warm_since__isnull=False).exists(),
             timeout=120)
    host = BareMetalHost.objects.get()
    gate = set(EraseCertificate.objects.filter(host=host).values_list("pk", flat=True))
    mac = host.boot_mac.replace(":", "-")
    statuses = []

    def fetch_once_provisioning():  # someone asks for the warm boot's configuration while the host is allocated
        from django.db import connection

        try:
            wait_for(lambda: BareMetalHost.objects.filter(pk=host.pk, state=HostState.PROVISIONING).exists(),
                     timeout=60, interval=0.02)
        finally:
            connection.close()  # this thread's own
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    f"{site.console_url}/boot/{mac}.ipxe", timeout=5) as resp:
                statuses.append(resp.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)

    thief = threading.Thread(target=fetch_once_provisioning, daemon=True)
    thief.start()
    try:
        apply(gpu_pool(1), tenant="one")
        thief.join(70)
        claim = wait_for(lambda: NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE).first(), timeout=180)
    except AssertionError:
        raise AssertionError(lab_report()) from None
    assert statuses == [404]  # nothing given, and the boot is void
    assert len(raced_events(host)) == 1
    revoked = set(EraseCertificate.objects.filter(revoked_at__isnull=False).values_list("pk", flat=True))
    assert revoked and revoked <= gate  # the gate that boot passed no longer stands
    cleaned = Event.objects.filter(host=host, kind=EventKind.TRANSITION, from_state=HostState.PROVISIONING,
                                   to_state=HostState.DEPROVISIONING).first()
    assert cleaned is not None and "raced after its release gate" in cleaned.message
    assert EraseCertificate.objects.filter(host=host, result="pass", revoked_at__isnull=True,
                                           created_at__gt=cleaned.created_at).exists()  # erased again
    claim.refresh_from_db()
    assert claim.failed_hosts == [] and not host_recent_failures(host=host)
