"""The boot path: how a server that the console powers into the agent's ramdisk learns the secret of that boot.

When a flow powers a host on into the ramdisk, it first starts a RamdiskBoot: a fresh random secret, kept as
a hash (and, encrypted, until it is delivered). The secret then reaches the server only through its boot:

- network boot: the server's iPXE fetches its script, `GET /boot/<mac>.ipxe`, from the agent listener; the
  script's kernel command line carries `vmetal.boot_secret=...` and `vmetal.console=...`;
- virtual media (`redfish-virtualmedia://`): the BMC downloads `GET /boot/<mac>.iso`, a small ISO 9660
  image whose `VMETAL.CFG` holds the same line.

Each is served once, and only while the boot is new: a second fetch gets 404 and is recorded as a security
event (someone else on the provisioning network asked first, or the boot is being replayed). Neither is on
the console's public listener, and nothing a tenant can read names the secret. The agent presents the
secret in its lookup (hosts/agent_api.py); the lookup that does opens the boot's one session."""
from __future__ import annotations

import hashlib
import hmac
import io
import logging
import secrets
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from events.choices import EventKind, ObjectType
from events.models import Event
from events.services import event_record_repeated

from .bootmedia import BootFiles, bootable_iso
from .models import AgentSession, BareMetalHost, RamdiskBoot

log = logging.getLogger(__name__)
ISO_CONFIG = "/VMETAL.CFG;1"
AGENT_ISO_KERNEL_ARGS = "console=tty0 console=ttyS0,115200n8"  # the serial console last: /dev/console


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def ramdisk_boot_start(*, host: BareMetalHost, flow_id: str) -> RamdiskBoot:
    """A new ramdisk boot of `host`: earlier boots and their agent sessions end, a new secret waits for
    its one delivery. Called just before the power-on that boots it."""
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        agent_sessions_end(host_ids=[host.pk])
        # An earlier boot's secret not delivered yet is never delivered now.
        RamdiskBoot.objects.filter(host=host, delivered_at__isnull=True).update(secret="")
        return RamdiskBoot.objects.create(host=host, flow_id=flow_id, secret=secret, secret_hash=hash_secret(secret))


def agent_sessions_end(*, host_ids: list[int]) -> int:
    """The boot is over (power off, boot from disk, the host left its flow): its agent's token stops working."""
    return AgentSession.objects.filter(host_id__in=host_ids, active=True).update(active=False)


def boot_config_take(*, mac: str, via: str, address: str) -> tuple[BareMetalHost, str, str] | None:
    """The boot path asks for the host's boot configuration: (host, secret, kernel arguments) once per boot,
    or None. A second request for a boot already delivered is recorded as a security event."""
    mac = mac.lower().replace("-", ":")
    host = BareMetalHost.objects.filter(boot_mac=mac).first()
    if host is None:
        return None
    boot = RamdiskBoot.objects.filter(host=host).first()
    fresh = timezone.now() - timedelta(seconds=settings.AGENT_LOOKUP_DEADLINE_S + settings.POWER_STEP_DEADLINE_S)
    if boot is None or boot.created_at < fresh:
        return None
    with transaction.atomic():
        taken = RamdiskBoot.objects.filter(pk=boot.pk, delivered_at__isnull=True).exclude(secret="").update(
            delivered_at=timezone.now(), delivered_via=via, secret="")
        if not taken:
            security_event(host=host, message=f"boot configuration ({via}) asked for again from {address or '?'}: "
                                              "it is served once per boot; this boot's agent may be refused",
                           data={"via": via, "address": address, "boot": boot.pk},
                           reason=f"boot configuration ({via}) asked for again")
            return None
    return host, boot.secret, kernel_arguments(host, boot.secret)


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
    import pycdlib

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


def virtual_media_url(host: BareMetalHost) -> str:
    return f"{settings.AGENT_BOOT_URL.rstrip('/')}/boot/{host.boot_mac.replace(':', '-')}.iso"


def lookup_boot(*, host: BareMetalHost, secret: str) -> tuple[RamdiskBoot | None, str]:
    """(the host's newest boot, "") when `secret` is its secret and no lookup has used it yet (claimed here);
    else (None, why it is refused). One read of the boot, one compare-and-swap to claim it."""
    boot = RamdiskBoot.objects.filter(host=host).first()
    if not secret:
        return None, "without a boot secret"
    if boot is None or not hmac.compare_digest(boot.secret_hash, hash_secret(secret)):
        return None, "with a secret that is not this boot's"
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
