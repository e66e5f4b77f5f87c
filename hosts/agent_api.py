"""The console's side of the agent protocol: lookup, heartbeat, result (JSON over HTTP).

The agent pulls; the console never connects to a server. Every call but lookup carries the per-boot token
of the agent's session; a stale (earlier boot), forged or foreign token gets 403 and changes nothing."""
import hashlib
import json
import logging
import secrets

from django.db import transaction
from django.db.models import Q
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from . import flows
from .choices import HostState
from .models import AgentSession, BareMetalHost, CommandStatus, HostCommand

log = logging.getLogger(__name__)
# States in which a host runs the agent (booted into the ramdisk by one of its flows).
AGENT_STATES = (HostState.INSPECTING, HostState.PROVISIONING, HostState.DEPROVISIONING)
HEARTBEAT_S = 1


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Refused(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def _body(request) -> dict:
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        raise Refused(400, "body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "body must be a JSON object")
    return body


def _session(request, body: dict) -> AgentSession:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer ") or len(header) > 200:
        raise Refused(403, "missing or malformed token")
    session = AgentSession.objects.select_related("host").filter(token_hash=hash_token(header[7:])).first()
    if session is None or not session.active:
        raise Refused(403, "token is not valid for this boot")
    if body.get("host_id") != session.host_id:
        raise Refused(403, "token belongs to another host")
    return session


def _endpoint(view):
    @csrf_exempt
    @require_POST
    def wrapper(request):
        try:
            return JsonResponse(view(request, _body(request)))
        except Refused as exc:
            log.info("agent call refused (%s): %s", exc.status, exc.message)
            return JsonResponse({"error": exc.message}, status=exc.status)

    return wrapper


@_endpoint
def lookup(request, body):
    macs = body.get("macs")
    if not isinstance(macs, list) or not all(isinstance(m, str) for m in macs) or not macs:
        raise Refused(400, "macs must be a list of MAC addresses")
    macs = [m.lower() for m in macs][:64]
    match = Q(boot_mac__in=macs)
    host = BareMetalHost.objects.filter(match, state__in=AGENT_STATES).first()
    if host is None:
        raise Refused(404, "no host is waiting for an agent with these MAC addresses")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        AgentSession.objects.filter(host=host, active=True).update(active=False)
        AgentSession.objects.create(host=host, boot_id=str(body.get("boot_id", ""))[:64], token_hash=hash_token(token))
        flows.request_drive(host.pk)
    return {"host_id": host.pk, "host": host.name, "token": token, "heartbeat_s": HEARTBEAT_S}


@_endpoint
def heartbeat(request, body):
    session = _session(request, body)
    now = timezone.now()
    AgentSession.objects.filter(pk=session.pk).update(last_seen_at=now)
    command_id = _command_pk(body.get("command_id"))
    if command_id is not None and isinstance(body.get("progress"), (int, float)):
        HostCommand.objects.filter(pk=command_id, host_id=session.host_id, status=CommandStatus.SENT).update(
            progress=max(0.0, min(100.0, float(body["progress"]))), message=str(body.get("message", ""))[:500])
        flows.publish_progress(session.host_id)
    if body.get("status") == "busy":
        return {"command": None}
    flow_id = (session.host.flow or {}).get("id")
    command = HostCommand.objects.filter(host_id=session.host_id, flow_id=flow_id,
                                         status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).first()
    if command is None:
        return {"command": None}
    HostCommand.objects.filter(pk=command.pk).update(status=CommandStatus.SENT, sent_at=now, session=session)
    args = dict(command.args)
    if command.secret_args:
        args.update(json.loads(command.secret_args))
    return {"command": {"id": command.public_id, "name": command.name, "args": args}}


@_endpoint
def result(request, body):
    session = _session(request, body)
    command_id = _command_pk(body.get("command_id"))
    command = HostCommand.objects.filter(pk=command_id, host_id=session.host_id).first()
    if command is None:
        raise Refused(404, "no such command for this host")
    if command.status in (CommandStatus.DONE, CommandStatus.FAILED):
        return {}  # a result sent twice: the first one counted
    ok = body.get("ok") is True
    result = body.get("result") if isinstance(body.get("result"), dict) else {}
    with transaction.atomic():
        HostCommand.objects.filter(pk=command.pk, status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).update(
            status=CommandStatus.DONE if ok else CommandStatus.FAILED, result=result, progress=100.0 if ok else None,
            error="" if ok else str(body.get("error") or "agent reported a failure")[:2000],
            finished_at=timezone.now())
        flows.request_drive(session.host_id)
    return {}


def _command_pk(value) -> int | None:
    if isinstance(value, str) and value.startswith("c-") and value[2:].isdigit():
        return int(value[2:])
    return None
