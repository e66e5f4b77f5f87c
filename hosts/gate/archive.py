"""The erase certificates' archive outside the database: each certificate written once, as its signed file, and read
back after a restore, so that a host's newest certificate outlives a database restored from an older backup."""
# One file per certificate, `<certificate_id>.json`, the exact rendering `verify-certificate` accepts
# (hosts/gate/certificates.py). A file is made by a hard link from a temporary file: it appears whole or not at all,
# and an existing file is never replaced (a link onto an existing name fails). Re-import verifies each file's
# signature against the keys this console accepts: a file that does not verify (forged, changed, signed by
# another console) is refused, recorded as a security event, and never imported.
from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils.dateparse import parse_datetime

from events.choices import EventKind, ObjectType
from events.services import event_record
from hosts.gate import certificates
from hosts.models import BareMetalHost, EraseCertificate

log = logging.getLogger(__name__)

FILE_NAME = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.json$")
DISK_OF = re.compile(r", disk (\S+)$")  # the certificate's media.source: "bare-metal host NAME, disk DISK"
MAX_FILE_BYTES = 1024 * 1024
EPOCH_FILE = "epoch"  # the one file of the archive that is not a certificate: the world's epoch (hosts/restore.py)
ACTOR = "system:certificate-archive"


def archive_dir() -> Path | None:
    return Path(settings.CERTIFICATE_ARCHIVE_DIR) if settings.CERTIFICATE_ARCHIVE_DIR else None


def certificate_archive(cert: EraseCertificate) -> str:
    """Write the certificate's file unless it is there: "written", "present", "conflict" (a different file under its
    name: left as it is, and logged), or "off" (no archive configured)."""
    directory = archive_dir()
    if directory is None:
        return "off"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"{cert.certificate_id}.json"
    text = certificates.render_certificate(cert)
    if path.exists():
        return _present_or_conflict(path, text)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".writing-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path)  # never onto an existing name
        except FileExistsError:
            return _present_or_conflict(path, text)
    finally:
        os.unlink(temporary)
    return "written"


def _present_or_conflict(path: Path, text: str) -> str:
    if path.read_text(errors="replace") == text:
        return "present"
    log.error("certificate archive: %s exists with other content; left as it is", path.name)
    return "conflict"


def certificates_archive_on_commit(certs: list[EraseCertificate]) -> None:
    """Archive the certificates once the transaction that signed them commits (file I/O outside it)."""
    if archive_dir() is None:
        return
    ids = [c.pk for c in certs]

    def write():
        for cert in EraseCertificate.objects.filter(pk__in=ids):
            try:
                certificate_archive(cert)
            except OSError:  # the database keeps it; the next re-import writes what the archive misses
                log.exception("certificate archive: %s not written", cert.certificate_id)

    transaction.on_commit(write)


@dataclass
class Reimport:
    imported: list[str] = field(default_factory=list)  # certificate ids added (or completed) from the archive
    refused: list[tuple[str, str]] = field(default_factory=list)  # (file name, why)
    written: int = 0  # certificates of the database the archive missed, written now
    files: int = 0


def certificates_reimport() -> Reimport:
    """Read the archive back: every file that verifies and whose certificate the database lacks is imported (linked to
    its host by name); a file that does not verify is refused and recorded. Then every certificate of the database
    the archive lacks is written to it. Idempotent."""
    result = Reimport()
    directory = archive_dir()
    if directory is None or not directory.is_dir():
        return result
    known = set(EraseCertificate.objects.values_list("document__certificate_id", flat=True))
    keys = certificates.verify_keys()
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or path.name == EPOCH_FILE or not path.is_file():
            continue
        result.files += 1
        if FILE_NAME.match(path.name) and path.name[:-5] in known:
            continue  # the database has it: not read again at every start
        why, body, text = _read(path, keys)
        if why:
            result.refused.append((path.name, why))
            _refused_event(path.name, why)
            continue
        if body["certificate_id"] in known:
            continue
        if _import(body, text):
            result.imported.append(body["certificate_id"])
            known.add(body["certificate_id"])
    for cert in EraseCertificate.objects.exclude(document__certificate_id__in=[
            p.name[:-5] for p in directory.iterdir() if FILE_NAME.match(p.name)]).iterator():
        try:
            if certificate_archive(cert) == "written":
                result.written += 1
        except OSError:
            log.exception("certificate archive: %s not written", cert.certificate_id)
    return result


def _read(path: Path, keys) -> tuple[str, dict | None, str]:
    """(why it is refused, or "", the certificate body, the file's text)."""
    if not FILE_NAME.match(path.name):
        return "not a certificate file name (<certificate id>.json)", None, ""
    if path.stat().st_size > MAX_FILE_BYTES:
        return f"larger than {MAX_FILE_BYTES} bytes", None, ""
    text = path.read_text(errors="replace")
    valid, reasons, body = certificates.verify_text(text, keys)
    if not valid:
        return "; ".join(reasons), None, text
    if path.name != f"{body.get('certificate_id')}.json":
        return "its name is not its certificate id", None, text
    if not isinstance(body.get("flow_id"), str) or not DISK_OF.search(str((body.get("media") or {}).get("source"))):
        return "signed, but not an erase certificate of this console's form (no flow or disk)", None, text
    return "", body, text


def _import(body: dict, text: str) -> bool:
    """Add the certificate (or complete the database's older record of the same run and disk). False: the database's
    record of that run and disk is as new or newer."""
    import json

    signature = json.loads(text)["signature"]
    disk = DISK_OF.search(body["media"]["source"]).group(1)
    host_name = (body.get("host") or {}).get("name") or ""
    sanitization = body.get("sanitization") or {}
    media = body.get("media") or {}
    issued = parse_datetime(body.get("issued_at") or "")
    fields = {"host": BareMetalHost.objects.filter(name=host_name).first(), "host_name": host_name,
              "serial": media.get("serial") or "", "model": media.get("model") or "",
              "method": sanitization.get("method") or "", "method_type": sanitization.get("method_type") or "",
              "result": "pass" if body.get("result") == "pass" else "fail",
              "previous_tenant": body.get("previous_tenant") or "", "claim_name": body.get("claim") or "",
              "started_at": parse_datetime(sanitization.get("started_at") or ""),
              "ended_at": parse_datetime(sanitization.get("ended_at") or ""),
              "document": body, "signature": signature["value"], "key_id": signature["key_id"]}
    with transaction.atomic():
        existing = EraseCertificate.objects.select_for_update().filter(flow_id=body["flow_id"], disk=disk).first()
        if existing is not None:
            if issued is None or parse_datetime(existing.document.get("issued_at") or "") >= issued:
                return False
            EraseCertificate.objects.filter(pk=existing.pk).update(**fields, created_at=issued)
        else:
            try:
                with transaction.atomic():
                    cert = EraseCertificate.objects.create(flow_id=body["flow_id"], disk=disk, **fields)
            except IntegrityError:
                return False
            if issued is not None:  # the host's newest certificate is its newest by issue, as before the restore
                EraseCertificate.objects.filter(pk=cert.pk).update(created_at=issued)
        event_record(kind=EventKind.ACTION, object_type=ObjectType.HOST, object_name=host_name or "-",
                     host=fields["host"], actor=ACTOR, step="certificate_reimport",
                     message=f"erase certificate {body['certificate_id']} ({disk}, {fields['result']}) re-imported "
                             "from the archive",
                     data={"certificate_id": body["certificate_id"], "flow_id": body["flow_id"], "disk": disk})
    return True


def _refused_event(name: str, why: str) -> None:
    log.warning("certificate archive: %s refused: %s", name, why)
    event_record(kind=EventKind.SECURITY, object_type=ObjectType.HOST, object_name="-", actor=ACTOR,
                 step="certificate_reimport", message=f"archived certificate {name[:80]} refused: {why}",
                 data={"file": name[:200], "reason": why, "attention": True})
