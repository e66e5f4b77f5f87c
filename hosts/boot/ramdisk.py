"""Ramdisk boots: how a server powered into the agent's ramdisk learns its boot's secret, and what a
raced boot voids."""
# The boot path: how a server that the console powers into the agent's ramdisk learns the secret of that boot.
#
# When a flow powers a host on into the ramdisk, it first starts a RamdiskBoot: a fresh random secret, kept as
# a hash (and, encrypted, until it is delivered). The secret then reaches the server only through its boot:
#
# - network boot: the server's iPXE fetches its script, `GET /boot/<mac>.ipxe`, from the agent listener; the
#   script's kernel command line carries `vmetal.boot_secret=...` and `vmetal.console=...`;
# - virtual media (`redfish-virtualmedia://`): the console gives the BMC, in InsertMedia, a one-time URL with
#   an unguessable token, `GET /boot/media/<token>.iso`: a small ISO 9660 image whose `VMETAL.CFG` holds the
#   same line. Nothing is served by MAC for such a host, and no iPXE script either; a PXE host gets no ISO.
#
# Each is served once, and only while the boot is new. Neither is on the console's public listener, and nothing
# a tenant can read names the secret. The agent presents the secret in its lookup (hosts/protocol/api.py); the
# lookup that does opens the boot's one session.
#
# Someone on the provisioning network who knows a host's MAC can fetch its iPXE script before the server does.
# The server's own fetch then reveals it: a boot whose configuration was asked for twice is *raced* and void
# (boot_race): its sessions end at once, and the host's flow boots it again with a new secret (hosts/engine/),
# counting no failure. Since only the server's fetch reveals a race, nothing that a race could steal or forge is
# acted on before the boot has *settled* (boot_unsettled_s): its settle window (boot_settle_s: the NodeType's
# measured p95 from power-on to fetch, with a margin) has passed with one fetch. Virtual media settles on its one
# delivery: its URL went to the BMC only.
from __future__ import annotations

import hashlib
import hmac
import io
import logging
import secrets
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.tasks import task_send_on_commit
from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record_repeated
from pools.matching import label_selector_matches

from hosts import task_names
from hosts.gate.cleaning import node_type_for
from hosts.models import AgentSession, BareMetalHost, EraseCertificate, HostCommand, RamdiskBoot

from .media import BootFiles, bootable_iso

log = logging.getLogger(__name__)
ISO_CONFIG = "/VMETAL.CFG;1"
AGENT_ISO_KERNEL_ARGS = "console=tty0 console=ttyS0,115200n8"  # the serial console last: /dev/console


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


IPXE, VIRTUAL_MEDIA = "ipxe", "virtual-media"


def ramdisk_boot_start(*, host: BareMetalHost, flow_id: str, via: str = IPXE) -> RamdiskBoot:
    """A new ramdisk boot of `host`: earlier boots and their agent sessions end, a new secret waits for
    its one delivery. Called just before the power-on that boots it. A virtual-media boot also gets its
    one-time URL (`boot.media_url`, for the BMC's InsertMedia; only its token's hash is kept)."""
    secret = secrets.token_urlsafe(32)
    token = secrets.token_urlsafe(32) if via == VIRTUAL_MEDIA else ""
    settle_s = boot_settle_s(host) if via == IPXE else 0.0
    with transaction.atomic():
        agent_sessions_end(host_ids=[host.pk])
        # An earlier boot's secret not delivered yet is never delivered now.
        RamdiskBoot.objects.filter(host=host, delivered_at__isnull=True).update(secret="")
        boot = RamdiskBoot.objects.create(host=host, flow_id=flow_id, secret=secret, secret_hash=hash_secret(secret),
                                          via=via, media_token_hash=hash_secret(token) if token else "",
                                          settle_s=settle_s)
    boot.media_url = f"{settings.AGENT_BOOT_URL.rstrip('/')}/boot/media/{token}.iso" if token else ""
    return boot


def agent_sessions_end(*, host_ids: list[int]) -> int:
    """The boot is over (power off, boot from disk, the host left its flow): its agent's token stops working,
    and a fetch of its configuration no longer races it."""
    RamdiskBoot.objects.filter(host_id__in=host_ids, ended_at__isnull=True).update(ended_at=timezone.now())
    return AgentSession.objects.filter(host_id__in=host_ids, active=True).update(active=False)


def boot_config_take(*, mac: str, via: str, address: str) -> tuple[BareMetalHost, str, str] | None:
    """The boot path asks for the host's boot configuration by MAC (iPXE): (host, secret, kernel arguments) once
    per boot, or None. A second request for a boot already delivered races it (boot_race)."""
    mac = mac.lower().replace("-", ":")
    host = BareMetalHost.objects.filter(boot_mac=mac).first()
    if host is None:
        return None
    boot = RamdiskBoot.objects.filter(host=host).first()
    if boot is None or (boot.via and boot.via != via):
        return None  # a virtual-media host's configuration goes to its BMC only
    return _take(host, boot, via, address)


def boot_media_take(*, token: str, address: str) -> tuple[BareMetalHost, str, str] | None:
    """The BMC downloads the one-time URL of a virtual-media boot: as boot_config_take, by the URL's token."""
    boot = RamdiskBoot.objects.select_related("host").filter(media_token_hash=hash_secret(token), via=VIRTUAL_MEDIA
                                                             ).exclude(media_token_hash="").first()
    if boot is None:
        return None
    return _take(boot.host, boot, VIRTUAL_MEDIA, address)


def _take(host: BareMetalHost, boot: RamdiskBoot, via: str, address: str) -> tuple[BareMetalHost, str, str] | None:
    """Count the fetch; deliver the secret to the first one of a fresh boot; race a delivered boot on a later one."""
    fresh = timezone.now() - timedelta(seconds=settings.AGENT_LOOKUP_DEADLINE_S + settings.POWER_STEP_DEADLINE_S)
    with transaction.atomic():
        boot = RamdiskBoot.objects.select_for_update().filter(pk=boot.pk).first()
        if boot is None or boot.ended_at is not None:
            if boot is not None and boot.raced_at is not None:  # counted into the race's one event
                security_event(host=host, message=f"boot configuration ({via}) of raced boot {boot.pk} asked for "
                                                  f"again from {address or '?'}", data={"address": address},
                               reason=RACE_REASON, boot=boot.pk)
            return None  # an ended boot is nobody's any more: nothing to give, nothing to race
        boot.fetches += 1
        boot.fetched_from = [*boot.fetched_from, address or "?"][-16:]
        secret = ""
        if boot.delivered_at is None and boot.secret and boot.created_at >= fresh:
            secret, boot.secret = boot.secret, ""
            boot.delivered_at, boot.delivered_via = timezone.now(), via
        boot.save(update_fields=["fetches", "fetched_from", "secret", "delivered_at", "delivered_via"])
        if not secret and boot.delivered_at is not None and boot.raced_at is None:
            boot_race(host=host, boot=boot)
    return (host, secret, kernel_arguments(host, secret)) if secret else None


RACE_REASON = "boot raced"


def boot_race(*, host: BareMetalHost, boot: RamdiskBoot) -> None:
    """The boot's configuration went out twice: someone else has (or had) its secret. Void at once (boot_void):
    every session of the boot ends (403 on its next call), what its agent did is dropped, and the race is recorded
    on the host for the engine, which deals with it on the drive asked for here (hosts.engine.drive: its flow boots
    it again; a warm host is inspected and cleaned anew)."""
    now = timezone.now()
    RamdiskBoot.objects.filter(pk=boot.pk).update(raced_at=now, ended_at=now, secret="")
    boot.raced_at = boot.ended_at = now
    boot_void(host=host, boot=boot)
    BareMetalHost.objects.filter(pk=host.pk).update(raced_boot_id=boot.pk)
    task_send_on_commit(task_names.DRIVE_HOST_FOR_AGENT, host_id=host.pk)


def race_text(boot: RamdiskBoot) -> str:
    return (f"boot {boot.pk} raced: its configuration was fetched {boot.fetches} times "
            f"(from {', '.join(dict.fromkeys(boot.fetched_from)) or '?'})")


def boot_void(*, host: BareMetalHost, boot: RamdiskBoot) -> dict:
    """Nothing the raced boot's agent did is used: its sessions end, its commands (since the boot started) are
    dropped with their results unread (the flow queues them again for the next boot), the certificates signed
    since it started are revoked, and one security event names the boot, the addresses and what was voided."""
    sessions = AgentSession.objects.filter(host=host, created_at__gte=boot.created_at)
    ended = sessions.count()
    # Queued since the boot started, or handed to one of its sessions: what the raced agent may have answered.
    commands = HostCommand.objects.filter(Q(created_at__gte=boot.created_at) | Q(session__in=sessions), host=host)
    dropped = [f"{c.step}: {c.name} ({c.status})" for c in commands]
    commands.delete()
    AgentSession.objects.filter(host=host, active=True).update(active=False)
    revoked = certificates_revoke(host=host, boot=boot)
    voided = {"boot": boot.pk, "via": boot.delivered_via or boot.via, "addresses": boot.fetched_from,
              "fetches": boot.fetches, "sessions_ended": ended, "commands_dropped": dropped,
              "certificates_revoked": revoked}
    parts = [f"{ended} agent session(s) ended", f"{len(dropped)} agent command(s) dropped unused"]
    if revoked:
        parts.append(f"{len(revoked)} erase certificate(s) revoked")
    security_event(host=host, message=(f"{race_text(boot)}; someone else on the provisioning network has its "
                                       f"secret. The boot is void: {', '.join(parts)}; the host boots again with "
                                       "a new secret"), data=voided, reason=RACE_REASON, boot=boot.pk)
    return voided


def certificates_revoke(*, host: BareMetalHost, boot: RamdiskBoot) -> list[str]:
    """The host's erase certificates signed since the raced boot started: revoked (verify-certificate says so)."""
    certificates = EraseCertificate.objects.filter(host=host, created_at__gte=boot.created_at, revoked_at__isnull=True)
    revoked = [str(c.certificate_id) for c in certificates]
    if revoked:
        certificates.update(revoked_at=timezone.now(), revoked_reason=f"{race_text(boot)}: signed from a void boot")
    return revoked


def boot_races_in_a_row(host_id: int) -> int:
    """How many of the host's latest ramdisk boots were raced, newest first, up to the first that was not."""
    count = 0
    for raced_at in RamdiskBoot.objects.filter(host_id=host_id).values_list("raced_at", flat=True)[:50]:
        if raced_at is None:
            break
        count += 1
    return count


def boot_unsettled_s(host_id: int) -> float:
    """Seconds until the host's newest ramdisk boot has settled (0: it has, or the host has none): its settle
    window passed with one fetch at most, or its virtual media delivered once. A raced boot never settles."""
    boot = (RamdiskBoot.objects.filter(host_id=host_id)
            .only("created_at", "settle_s", "fetches", "raced_at", "via", "delivered_at").first())
    if boot is None:
        return 0.0
    if boot.raced_at is not None or boot.fetches > 1:
        # Void: until the host's flow has dealt with it (booted again, or sent the host to repair) nothing waits on.
        pending = BareMetalHost.objects.filter(pk=host_id, raced_boot_id=boot.pk).exists()
        return max(1.0, settings.POWER_POLL_S) if pending else 0.0
    if boot.via == VIRTUAL_MEDIA and boot.delivered_at is not None:
        return 0.0
    window = boot.settle_s if boot.settle_s is not None else settings.BOOT_SETTLE_S
    return max(0.0, (boot.created_at + timedelta(seconds=window) - timezone.now()).total_seconds())


def boot_lost(host_id: int) -> str:
    """Why the host's newest ramdisk boot is known lost without a race ("" when it is not): its configuration
    was asked for and refused (a stale boot), or nothing asked for it within twice its settle window of power-on
    (the server never reached the agent listener: it was down, or the boot path is broken)."""
    boot = (RamdiskBoot.objects.filter(host_id=host_id)
            .only("created_at", "settle_s", "fetches", "raced_at", "via", "delivered_at", "looked_up_at").first())
    if boot is None or boot.raced_at is not None or boot.delivered_at is not None:
        return ""
    if boot.fetches:
        return f"its boot configuration was asked for {boot.fetches} time(s) and refused (the boot was stale)"
    window = 2 * max(boot.settle_s or 0.0, settings.BOOT_SETTLE_S if boot.via == VIRTUAL_MEDIA else 0.0)
    if not window:
        window = 2 * settings.BOOT_SETTLE_S
    if timezone.now() - boot.created_at < timedelta(seconds=window):
        return ""
    what = "its BMC did not download the virtual media" if boot.via == VIRTUAL_MEDIA else \
        "the server did not fetch its iPXE script"
    return f"{what} within {window:g}s of power-on (the agent listener down, or the boot path unreachable)"


def boot_settle_s(host: BareMetalHost) -> float:
    """The settle window of a network boot of `host`: its NodeType's p95 from the power-on request to the iPXE
    fetch (the last BOOT_SETTLE_HISTORY boots of the hosts it selects that were fetched once), times 1.5 plus
    BOOT_SETTLE_MARGIN_S, so that a slow POST still shows its fetch inside the window; BOOT_SETTLE_S until
    BOOT_SETTLE_SAMPLES such boots were measured; at most AGENT_LOOKUP_DEADLINE_S. Kept a few minutes per type."""
    node_type = node_type_for(host)
    key = f"boot-settle:{node_type.pk if node_type else f'host-{host.pk}'}"
    try:
        kept = cache.get(key)
    except Exception:
        kept = None
    if kept is not None:
        return kept
    if node_type is not None and node_type.host_selector:
        ids = [pk for pk, labels in BareMetalHost.objects.values_list("pk", "labels")
               if label_selector_matches(node_type.host_selector, labels or {})]
    else:
        ids = [host.pk]
    rows = (RamdiskBoot.objects.filter(host_id__in=ids, via=IPXE, fetches=1, raced_at__isnull=True,
                                       delivered_at__isnull=False)
            .order_by("-created_at").values_list("created_at", "delivered_at")[:settings.BOOT_SETTLE_HISTORY])
    took = sorted((delivered - created).total_seconds() for created, delivered in rows)
    if len(took) < settings.BOOT_SETTLE_SAMPLES:
        window = settings.BOOT_SETTLE_S
    else:
        window = _p95(took) * 1.5 + settings.BOOT_SETTLE_MARGIN_S
    window = round(min(window, settings.AGENT_LOOKUP_DEADLINE_S), 3)
    try:
        cache.set(key, window, timeout=300)
    except Exception:
        pass
    return window


def _p95(ordered: list[float]) -> float:
    rank = (len(ordered) - 1) * 0.95
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def kernel_arguments(host: BareMetalHost, secret: str) -> str:
    return (f"vmetal.console={settings.AGENT_BOOT_URL.rstrip('/')} vmetal.boot_secret={secret} "
            f"vmetal.host={host.name}")


def ipxe_script(host: BareMetalHost, arguments: str) -> str:
    return (f"#!ipxe\n# vMetal Console: ramdisk boot of {host.name}. Served once per boot.\n"
            f"kernel {settings.AGENT_KERNEL_URL} initrd=initrd {_extra_args()}{arguments}\n"
            f"initrd --name initrd {settings.AGENT_INITRD_URL}\n"
            f"boot\n")


def _extra_args() -> str:
    extra = " ".join(settings.AGENT_KERNEL_ARGS.split())
    return f"{extra} " if extra else ""


def boot_iso(arguments: str) -> bytes:
    """The virtual-media image of one boot: VMETAL.CFG holds its kernel arguments (volume VMETAL_BOOT). When the
    agent's ramdisk sits in IMAGE_DIR/agent with isolinux beside it (`python -m lab.vmimage ramdisk --out
    IMAGE_DIR`), the image also boots: isolinux, the ramdisk's kernel and initrd (the ramdisk's /init reads
    VMETAL.CFG from the CD); else it holds VMETAL.CFG only, for a BMC that boots the ramdisk some other way."""
    import pycdlib  # a third-party library, loaded by the virtual-media boot only

    data = (arguments + "\n").encode()
    files = BootFiles.in_directory(Path(settings.IMAGE_DIR) / "agent")
    out = io.BytesIO()
    if files.complete():
        # No secret on the kernel command line: the ramdisk reads it from VMETAL.CFG.
        bootable_iso(files, out, kernel_args=AGENT_ISO_KERNEL_ARGS, volume="VMETAL_BOOT", extra={ISO_CONFIG: data})
        return out.getvalue()
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=1, vol_ident="VMETAL_BOOT")
    iso.add_fp(io.BytesIO(data), len(data), ISO_CONFIG)
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def lookup_boot(*, host: BareMetalHost, secret: str) -> tuple[RamdiskBoot | None, str]:
    """(the host's newest boot, "") when `secret` is its secret and no lookup has used it yet (claimed here);
    else (None, why it is refused). One read of the boot, one compare-and-swap to claim it."""
    boot = RamdiskBoot.objects.filter(host=host).first()
    if not secret:
        return None, "without a boot secret"
    if boot is None or not hmac.compare_digest(boot.secret_hash, hash_secret(secret)):
        return None, "with a secret that is not this boot's"
    if boot.raced_at is not None:
        return None, "with the secret of a void boot (its configuration went out twice)"
    claimed = RamdiskBoot.objects.filter(pk=boot.pk, looked_up_at__isnull=True).update(looked_up_at=timezone.now())
    return (boot, "") if claimed else (None, "again for a boot whose agent already has its session")


def security_event(*, host: BareMetalHost | None, message: str, data: dict | None = None, reason: str = "",
                   attention: bool = True, boot: int | None = None) -> Event:
    """Recorded for admins (the event log, kind `security`). Not tied to a tenant: tenant members never see them.

    One row per host, boot, reason (`reason`, else the message) and SECURITY_EVENT_WINDOW_S: repeats within the
    window are counted into that row (events.services.event_record_repeated), so a flood of refusals is one line.
    `attention`: whether a person must look at it; the fleet board's alarm counts only those (a stale lookup of
    the host's own agent after its session ended is routine, a forged one is not). `boot`: the RamdiskBoot it is
    about (data["boot"], else the host's newest)."""
    data = dict(data or {})
    if boot is None and isinstance(data.get("boot"), int):
        boot = data["boot"]
    if boot is None and host is not None:
        boot = RamdiskBoot.objects.filter(host=host).values_list("pk", flat=True).first()
    data.update(attention=attention, reason=reason or message)
    # A routine repeat never hides an alarming one: they are counted apart.
    key = f"{boot or '-'}:{int(attention)}:{hashlib.sha256((reason or message).encode()).hexdigest()[:16]}"
    with transaction.atomic():
        if host is not None:  # concurrent refusals of one host: one first record, the others counted into it
            BareMetalHost.objects.select_for_update().filter(pk=host.pk).values_list("pk", flat=True).first()
        event, new = event_record_repeated(
            key=key, window_s=settings.SECURITY_EVENT_WINDOW_S, kind=EventKind.SECURITY, object_type=ObjectType.HOST,
            object_name=host.name if host else "-", host=host, actor="system:agent-listener", message=message,
            data=data)
    if new:  # the log, like the event log, gets one line per window; the row counts the repeats
        log.warning("security: %s%s", f"{host.name}: " if host else "", message)
    return event
