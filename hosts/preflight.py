"""Preflight: the two networks a host needs (its BMC and its boot path), checked before a flow touches it."""
# Preflight: the two networks a host needs, checked before a flow touches it.
#
# (a) BMC network: the BMC answers Redfish with the host's credentials, over TLS that verifies (or the host says,
# visibly, that it accepts an unverified certificate: `disableCertificateVerification`), the system is found, the
# boot MAC is one of its NICs (an IPMI BMC, hosts/bmc/ipmi.py: its RMCP+ session opens with the credentials and
# the chassis answers; IPMI lists no NICs, so no MAC check), and what the BMC can do is recorded (virtual media,
# one-time boot override, BootSourceOverrideMode). Through hosts/bmc/, the one door to BMCs; its outcome is also the host's BMC contact
# (bmc_ok, bmc_checked_at, bmc_error: hosts.services.host_bmc_contact).
# (b) Provisioning network: the host's DHCP/boot entry exists for its MAC (hosts/boot/dhcp.py, when the console has
# one), the agent listener's boot route answers (probed with a MAC no host has: the per-boot script is served once
# and must not be consumed), and the ramdisk the host will boot (AGENT_KERNEL_URL and AGENT_INITRD_URL for network
# boot; the listener's ISO route for virtual media) answers a HEAD.
#
# Runs on demand (the host page's action, `manage.py preflight`), on change (a host's BMC address, credentials,
# TLS setting or boot MAC changed: enqueued on commit) and periodically (the preflight-due beat). The network work runs
# outside any transaction, PREFLIGHT_CONCURRENCY hosts at a time (threads; the rows are written by the caller's
# thread). A red preflight keeps a host from being allocated (hosts/capacity.py).
from __future__ import annotations

import logging
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.db.models.signals import post_save, pre_save
from django.utils import timezone

from core.tasks import task_send
from events.choices import EventKind, ObjectType
from events.services import event_record
from pools.matching import label_selector_q
from pools.models import NodeType

from . import task_names
from .bmc.client import SCHEMES, BMCError, parse_address
from .bmc.factory import bmc_client
from .boot.dhcp import host_entry
from .choices import HostState
from .models import BareMetalHost
from .services import host_bmc_contact

log = logging.getLogger(__name__)

PREFLIGHT_STEP = "preflight"
# The fields whose change makes the last preflight stale: it is run again on commit.
WATCHED = ("bmc_address", "bmc_username", "bmc_password", "bmc_disable_certificate_verification", "boot_mac")
# Hosts the periodic preflight looks at: every host not retired. Its BMC reads are GETs, and the boot path's
# probes touch no host's boot, so a host in a flow is checked as safely as an idle one.
PERIODIC_EXCLUDED = (HostState.RETIRED,)
# A MAC no host can have (locally administered, all zero otherwise): the boot route's probe.
PROBE_MAC = "02-00-00-00-00-00"
PROBE_TOKEN = "preflight-probe-not-a-boot-token"


# --- the checks: network only, plain values in, plain values out ---------------------------------------------

def check_bmc(*, address: str, username: str, password: str, verify_tls: bool, boot_mac: str) -> dict:
    """(a) for one host: {"ok", "reason", "kind" (hosts.bmc.client's error kind), "tls", "system", "quirks"}. Never
    raises for the BMC's sake."""
    try:
        scheme, _, _ = parse_address(address)
    except BMCError as exc:
        return {"ok": False, "reason": str(exc), "kind": exc.kind, "tls": "", "system": "", "quirks": {}}
    transport, virtual_media = SCHEMES[scheme]
    tls = {"http": "none (plain HTTP)", "ipmi": "none (IPMI: RMCP+ session encryption)"}.get(
        transport, "verified" if verify_tls else "not verified")
    result = {"ok": False, "reason": "", "kind": "", "tls": tls, "system": "", "quirks": {}}
    if not password:
        result["reason"], result["kind"] = "no BMC credentials (apply the host's Secret)", "auth"
        return result
    try:
        with bmc_client(address, username, password, verify_tls=verify_tls, boot_mac=boot_mac,
                        timeout=settings.PREFLIGHT_TIMEOUT_S, retries=0) as bmc:
            found = bmc.check(boot_mac)
            result["system"] = found["system_id"]
            result["quirks"] = bmc.quirks()
    except BMCError as exc:
        result["reason"], result["kind"] = str(exc), exc.kind
        return result
    quirks = result["quirks"]
    if virtual_media and not quirks.get("virtual_media"):
        result["reason"] = ("the address asks for virtual media boot but the BMC has no virtual CD/DVD drive: "
                            "use a redfish:// address (network boot)")
    elif not virtual_media and not quirks.get("pxe_boot", True):
        result["reason"] = "the BMC does not offer PXE as a boot override target"
    elif not quirks.get("boot_once", True):
        result["reason"] = "the BMC does not support a one-time boot override"
    else:
        result["ok"] = True
    return result


def _probe(url: str) -> tuple[int | None, str, str]:
    """(HTTP status or None, the body's start, why not reached). HEAD first; GET when HEAD is not allowed."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for method in ("HEAD", "GET"):
        # A GET asks for one byte only: a ramdisk is tens of MiB, and /images/ honours Range.
        request = urllib.request.Request(url, method=method, headers={"Range": "bytes=0-0"} if method == "GET" else {})
        try:
            with opener.open(request, timeout=settings.PREFLIGHT_HTTP_TIMEOUT_S) as response:
                return response.status, response.read(200).decode(errors="replace") if method == "GET" else "", ""
        except urllib.error.HTTPError as exc:
            if exc.code == 405 and method == "HEAD":
                continue
            body = exc.read(200).decode(errors="replace") if method == "GET" else ""
            return exc.code, body, ""
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            return None, "", str(reason)
    return None, "", "no answer"


def _route_probe(url: str) -> str:
    """The boot route answers: our listener's 404 for a MAC it has no boot for. '' when it does, else why not."""
    status, body, error = _probe(url)
    if error:
        return f"boot route {url} not reachable: {error}"
    if status == 404 and (not body or body.startswith(("no ramdisk boot waiting", "no virtual media waiting"))):
        return ""
    if status == 405:  # answered, and it is a route that wants GET: the listener is there
        return ""
    return f"boot route {url} answered {status}, not the agent listener's answer"


def _file_probe(what: str, url: str) -> str:
    status, _, error = _probe(url)
    if error:
        return f"{what} {url} not reachable: {error}"
    if status is None or not 200 <= status < 300:
        return f"{what} {url} answered {status}"
    return ""


class BootPath:
    """(b)'s URLs, each asked once per run: they are the same for every host (the listener, the ramdisk)."""

    def __init__(self):
        self._answers: dict[tuple[str, str], str] = {}
        base = (settings.AGENT_BOOT_CHECK_URL or settings.AGENT_BOOT_URL).rstrip("/")
        self.script_url = f"{base}/boot/{PROBE_MAC}.ipxe"
        self.iso_url = f"{base}/boot/media/{PROBE_TOKEN}.iso"  # a one-time URL no boot has

    def _ask(self, kind: str, url: str) -> str:
        key = (kind, url)
        if key not in self._answers:
            self._answers[key] = _route_probe(url) if kind == "route" else _file_probe(kind, url)
        return self._answers[key]

    def problems(self, *, virtual_media: bool) -> list[str]:
        if virtual_media:  # the BMC downloads the per-boot ISO from the listener
            return [p for p in [self._ask("route", self.iso_url)] if p]
        found = [self._ask("route", self.script_url)]
        if settings.PREFLIGHT_RAMDISK_CHECK:
            found += [self._ask("ramdisk kernel", settings.AGENT_KERNEL_URL),
                      self._ask("ramdisk initrd", settings.AGENT_INITRD_URL)]
        return [p for p in found if p]


def _dhcp_problem(host: BareMetalHost) -> tuple[str, bool]:
    """(why the host has no DHCP/boot entry or '', whether it was checked): the entry hosts/boot/dhcp.py makes."""
    try:
        entry = host_entry(host)
    except Exception as exc:  # a DHCP renderer that fails for this host is a red boot path, not a crash
        log.warning("preflight %s: DHCP entry failed", host.name, exc_info=True)
        return f"DHCP entry for {host.boot_mac} could not be made: {type(exc).__name__}", True
    if not entry:
        return f"no DHCP/boot entry for MAC {host.boot_mac}", True
    return "", True


# --- running it and recording the outcome ---------------------------------------------------------------------

def hosts_preflight(*, hosts: list[BareMetalHost], actor: str, concurrency: int | None = None) -> list[dict]:
    """Preflight these hosts: the checks, PREFLIGHT_CONCURRENCY at a time, then each host's row and, when its
    verdict changed, an Event. Returns one summary per host: {"host", "ok", "reason", "bmc", "boot"}."""
    if not hosts:
        return []
    boot_path = BootPath()
    # In this thread: the DHCP entry may read the database, and the boot path's answers are shared.
    boot = {}
    for host in hosts:
        try:
            virtual_media = SCHEMES[parse_address(host.bmc_address)[0]][1]
        except BMCError:
            virtual_media = False
        dhcp, dhcp_checked = _dhcp_problem(host)
        problems = ([dhcp] if dhcp else []) + boot_path.problems(virtual_media=virtual_media)
        boot[host.pk] = {"ok": not problems, "reason": "; ".join(problems), "dhcp_checked": dhcp_checked,
                         "via": "virtual media" if virtual_media else "network boot (iPXE)"}

    def bmc_of(host: BareMetalHost) -> dict:
        return check_bmc(address=host.bmc_address, username=host.bmc_username, password=host.bmc_password,
                         verify_tls=not host.bmc_disable_certificate_verification, boot_mac=host.boot_mac)

    workers = max(1, min(concurrency or settings.PREFLIGHT_CONCURRENCY, len(hosts)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="preflight") as pool:
        bmc = list(pool.map(bmc_of, hosts))
    return [host_preflight_record(host=host, bmc=b, boot=boot[host.pk], actor=actor) for host, b in zip(hosts, bmc)]


def host_preflight_record(*, host: BareMetalHost, bmc: dict, boot: dict, actor: str) -> dict:
    """Write one host's preflight (and its BMC contact). An Event when the verdict is new or changed."""
    now = timezone.now()
    current = BareMetalHost.objects.filter(pk=host.pk).values(*WATCHED).first()
    if current is None or any(current[f] != getattr(host, f) for f in WATCHED):
        # Deleted, or its BMC or MAC changed while it was checked: this answer is about what it was, and the
        # change has asked for another preflight (on commit). Nothing is written.
        return {"host": host.name, "ok": None, "reason": "changed while checked: not recorded", "bmc": bmc,
                "boot": boot}
    reasons = []
    if not bmc["ok"]:
        reasons.append(f"BMC: {bmc['reason']}")
    if not boot["ok"]:
        reasons.append(f"boot path: {boot['reason']}")
    ok = not reasons
    reason = "; ".join(reasons)[:500]
    detail = {"bmc": bmc, "boot": boot, "unverified_tls": bmc.get("tls") == "not verified"}
    # Whether the BMC answered at all: a system without the boot MAC, or a missing one, is an answering BMC.
    answered = bmc["ok"] or bool(bmc.get("system")) or bmc.get("kind") in ("mismatch", "not_found")
    host.bmc_checked_at = None  # a preflight always refreshes the BMC contact's time
    host_bmc_contact(host=host, ok=answered, error="" if answered else bmc["reason"], actor=actor)
    values = {"preflight_ok": ok, "preflight_reason": reason, "preflight": detail, "preflight_checked_at": now}
    with transaction.atomic():
        # Compare-and-swap on the verdict: of two runs seeing the same change, one writes the Event; a red that
        # turns red for another reason is news too.
        flipped = BareMetalHost.objects.filter(pk=host.pk).exclude(preflight_ok=ok).update(**values) == 1
        if not flipped:
            BareMetalHost.objects.filter(pk=host.pk).update(**values)
        if flipped or (not ok and reason != host.preflight_reason):
            unverified = ": TLS certificate not verified (disableCertificateVerification)" if detail["unverified_tls"] else ""
            event_record(kind=EventKind.STEP, object_type=ObjectType.HOST, object_name=host.name, host_id=host.pk,
                         step=PREFLIGHT_STEP, actor=actor,
                         message=f"preflight green{unverified}" if ok else f"preflight red: {reason}",
                         data={"ok": ok, "bmc_ok": bmc["ok"], "boot_ok": boot["ok"]})
    host.preflight_ok, host.preflight_reason, host.preflight, host.preflight_checked_at = ok, reason, detail, now
    if not ok:
        log.info("preflight %s red: %s", host.name, reason)
    return {"host": host.name, "ok": ok, "reason": reason, "bmc": bmc, "boot": boot}


def hosts_preflight_due(*, limit: int | None = None, actor: str = "system:preflight") -> list[dict]:
    """The periodic preflight: hosts whose last one is older than PREFLIGHT_EVERY_S (never checked first)."""
    cutoff = timezone.now() - timedelta(seconds=settings.PREFLIGHT_EVERY_S)
    hosts = list(BareMetalHost.objects.exclude(state__in=PERIODIC_EXCLUDED)
                 .filter(Q(preflight_checked_at__isnull=True) | Q(preflight_checked_at__lt=cutoff))
                 .order_by(F("preflight_checked_at").asc(nulls_first=True), "pk")[:limit or settings.PREFLIGHT_BATCH])
    return hosts_preflight(hosts=hosts, actor=actor)


def preflight_request(*, host_ids: list[int], actor: str) -> None:
    """Ask a worker to preflight these hosts once the current transaction commits."""
    if host_ids:
        ids = sorted(set(host_ids))
        transaction.on_commit(lambda: task_send(task_names.PREFLIGHT_HOSTS, host_ids=ids, actor=actor))


# --- on change: a host's BMC address, credentials, TLS setting or boot MAC -------------------------------------
# Receivers on the model, so apply, the API and the admin (every writer that saves the row) trigger it alike. A
# host being created is left to its registration (which checks the BMC) and the periodic run.

def _remember_watched(sender, instance: BareMetalHost, update_fields=None, raw=False, **kwargs) -> None:
    instance._preflight_before = None
    if raw or instance.pk is None or (update_fields is not None and not set(update_fields) & set(WATCHED)):
        return
    instance._preflight_before = (BareMetalHost.objects.filter(pk=instance.pk).values(*WATCHED).first())


def _preflight_if_changed(sender, instance: BareMetalHost, created=False, raw=False, **kwargs) -> None:
    before = getattr(instance, "_preflight_before", None)
    instance._preflight_before = None
    if raw or created or not before:
        return
    if any(before[f] != getattr(instance, f) for f in WATCHED):
        preflight_request(host_ids=[instance.pk], actor="system:preflight (BMC or MAC changed)")


def connect_receivers() -> None:
    pre_save.connect(_remember_watched, sender=BareMetalHost, dispatch_uid="preflight-before")
    post_save.connect(_preflight_if_changed, sender=BareMetalHost, dispatch_uid="preflight-after")


# --- what the pages and the command show -----------------------------------------------------------------------

def environment_hosts_q(environment) -> Q:
    """The hosts a NodeEnvironment's claims may get: those of its provider's NodeTypes (every NodeType's when
    it names no provider)."""
    types = NodeType.objects.all()
    if environment.provider_id:
        types = types.filter(provider_id=environment.provider_id)
    match = Q(pk__in=[])
    for node_type in types:
        match |= label_selector_q(node_type.host_selector)
    return match


def preflight_summary(hosts) -> dict:
    """{"green", "red", "unchecked", "unverified_tls", "checked_at" (the oldest check), "red_hosts": [(name,
    reason, checked_at)]} over a queryset of hosts, in two queries."""
    rows = list(hosts.order_by("name").values_list("name", "preflight_ok", "preflight_reason",
                                                   "preflight_checked_at", "preflight__unverified_tls"))
    checked = [r[3] for r in rows if r[3] is not None]
    return {
        "total": len(rows),
        "green": sum(1 for r in rows if r[1] is True),
        "red": sum(1 for r in rows if r[1] is False),
        "unchecked": sum(1 for r in rows if r[1] is None),
        "unverified_tls": sum(1 for r in rows if r[4] is True),
        "checked_at": min(checked) if checked else None,
        "red_hosts": [(r[0], r[2], r[3]) for r in rows if r[1] is False],
    }
