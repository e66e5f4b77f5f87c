"""The console's side of the agent protocol: lookup, heartbeat, result (JSON over HTTP), and the boot path's
scripts and media."""
# The console's side of the agent protocol: lookup, heartbeat, result (JSON over HTTP).
#
# The agent pulls; the console never connects to a server. These endpoints are served only on the agent listener
# (vmetal_console/agent_urls.py: a separate address on the provisioning network, a separate port in the lab); the
# public listener answers 404 for /agent/*. A lookup needs the secret of the boot (hosts/boot/ramdisk.py); every other
# call carries the per-boot token of the agent's session; a stale (earlier boot), forged or foreign token gets
# 403 and changes nothing.
import hashlib
import ipaddress
import json
import logging
import re
import secrets
import time
from datetime import timedelta
from functools import wraps
from typing import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.http import HttpResponse, HttpResponseNotFound, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from core import limits
from core.client_address import client_ip
from core.tasks import task_send_on_commit

from hosts import task_names
from hosts.boot import ramdisk as boot_path
from hosts.choices import HostState
from hosts.gate import gpu_state
from hosts.lifecycle import AGENT_STATES
from hosts.models import AgentSession, BareMetalHost, CommandStatus, HostCommand, RamdiskBoot
from hosts.services import publish_progress

from .poll import agent_wait, client_gone, held_key

log = logging.getLogger(__name__)
HEARTBEAT_S = 1  # an idle agent asks for work this often: the wait between two commands
# A busy agent reports progress this often. Every heartbeat is a request with three queries: at 200 servers
# writing images at once, progress every second was most of the web server's work (bench/fleet.py).
PROGRESS_S = 2
# A heartbeat records the session's last_seen_at at most this often (and at least 4 times per AGENT_SILENCE_S,
# which is tens of seconds in production): one write fewer per heartbeat is a third of the endpoint's queries.
LAST_SEEN_EVERY_S = 5


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Refused(Exception):
    def __init__(self, status: int, message: str):
        self.status, self.message = status, message


def _body(request) -> dict:
    try:
        body = limits.json_loads(request.body or b"{}")
    except limits.TooDeep as exc:
        raise Refused(400, f"body is {exc}") from None
    except ValueError:
        raise Refused(400, "body is not JSON") from None
    if not isinstance(body, dict):
        raise Refused(400, "body must be a JSON object")
    nul = limits.nul_path(body)
    if nul:
        raise Refused(400, f"{nul}: contains a NUL character (\\u0000)")
    return body


def _session(request, body: dict) -> AgentSession:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer ") or len(header) > 200:
        raise Refused(403, "missing or malformed token")
    # The hash is unique: no .first(), whose ORDER BY costs more to compile than the query costs to run.
    session = next(iter(AgentSession.objects.select_related("host").only(*SESSION_FIELDS)
                        .filter(token_hash=hash_token(header[7:])).order_by()), None)
    if session is None or not session.active or not _in_ramdisk(session.host):
        raise Refused(403, "token is not valid for this boot")
    if body.get("host_id") != session.host_id:
        raise Refused(403, "token belongs to another host")
    return session


# What a call reads of its session and host: not the host's inventories, firmware, preflight and BMC credentials
# (two decryptions), which were most of the heartbeat's one query.
SESSION_FIELDS = ("id", "host", "active", "last_seen_at", "host__state", "host__warm_since", "host__flow")


def _in_ramdisk(host: BareMetalHost) -> bool:
    """A host whose flow runs the agent, or a warm one (hosts/flows/warm.py): available, its agent idle in the ramdisk."""
    return host.state in AGENT_STATES or (host.state == HostState.AVAILABLE and host.warm_since is not None)


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


# --- Rate limits -----------------------------------------------------------------------------------
# A fixed window per key in the cache (shared by every web process when it is Redis). Lookup is counted per
# client address: many lab agents share 127.0.0.1, so its limit is generous. Heartbeat and result are
# counted per token (a hash of it: tokens never go into cache keys), since an agent heartbeats once a second,
# and also per client address under a separate, higher limit ("call_per_address"): a flood of random forged
# tokens is a new key per call and would never reach the per-token limit.
# Over a limit: 429 with Retry-After, and the call changes nothing; the agent backs off and retries.

DEFAULT_RATE_LIMITS = {"lookup": (600, 60), "call": (300, 60), "call_per_address": (6000, 60)}
SCOPE_LIMITS = {"lookup": ("lookup",), "call": ("call", "call_per_address")}


def _rate_key(request, name: str) -> str:
    if name == "call":
        return hash_token(request.headers.get("Authorization", "")[:200])
    return client_ip(request)


def _retry_after(name: str, key: str) -> int:
    """0 when the call may go on; otherwise the seconds until the window ends."""
    limits = {**DEFAULT_RATE_LIMITS, **getattr(settings, "AGENT_RATE_LIMITS", {})}
    limit, window = limits[name]
    now = time.time()
    start = int(now // window * window)
    cache_key = f"agent-rate:{name}:{key}:{start}"
    try:
        count = cache.incr(cache_key)  # the window's key is there but for its first call: no add each time
    except ValueError:
        count = 1 if cache.add(cache_key, 1, timeout=window + 5) else cache.incr(cache_key)
    return 0 if count <= limit else max(1, int(start + window - now + 0.999))


def rate_limited(scope: str):
    def decorate(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            try:
                # Every limit of the scope counts this call, so a flood stays over all of them.
                retry = max(_retry_after(name, _rate_key(request, name)) for name in SCOPE_LIMITS[scope])
            except Exception:  # the cache is down: serve the agent rather than fail it
                log.warning("agent rate limit not checked: cache unavailable", exc_info=True)
                retry = 0
            if retry:
                log.warning("agent %s calls over the rate limit from %s", scope, request.META.get("REMOTE_ADDR"))
                response = JsonResponse({"error": "too many requests; retry later"}, status=429)
                response["Retry-After"] = str(retry)
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


# --- Endpoints -------------------------------------------------------------------------------------

@rate_limited("lookup")
@_endpoint
def lookup(request, body):
    """MACs and the boot's secret → the host and this boot's session token. Without the secret that the
    console handed to this boot through its boot path (hosts/boot/ramdisk.py) nothing is given, and a second lookup
    for a boot never replaces its session: both are refused and recorded as security events."""
    macs = body.get("macs")
    if not isinstance(macs, list) or not all(isinstance(m, str) for m in macs) or not macs:
        raise Refused(400, "macs must be a list of MAC addresses")
    macs = [m.lower() for m in macs][:64]
    secret = body.get("boot_secret")
    secret = secret if isinstance(secret, str) and len(secret) <= 200 else ""
    host = BareMetalHost.objects.filter(boot_mac__in=macs, state__in=AGENT_STATES).first()
    if host is None:
        raise Refused(403, REFUSED)
    address = client_ip(request)
    boot, why = boot_path.lookup_boot(host=host, secret=secret)
    if boot is None:
        _refusal_event(host, why, address, secret)
        raise Refused(403, REFUSED)
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        AgentSession.objects.create(host=host, boot_id=str(body.get("boot_id", ""))[:64], token_hash=hash_token(token),
                                    ramdisk_boot=boot, address=_address(address))
        task_send_on_commit(task_names.DRIVE_HOST_FOR_AGENT, host_id=host.pk)
    return {"host_id": host.pk, "host": host.name, "token": token, "heartbeat_s": HEARTBEAT_S, "progress_s": PROGRESS_S}


REFUSED = "lookup refused: no host is booting the agent with these MAC addresses and this boot secret"


def _refusal_event(host: BareMetalHost, why: str, address: str, secret: str) -> None:
    """A security event per host, boot, reason and window (hosts.boot.ramdisk.security_event counts the repeats). It needs
    a person's attention unless it is the host's own agent lingering: a secret that the console gave one of this
    host's boots, from the address of one of this host's agent sessions (its session ended, e.g. by a repair or a
    retest, before its server's power-off landed, and it looked up again)."""
    known = _address(address)
    routine = bool(secret and known and AgentSession.objects.filter(host=host, address=known).exists()
                   and RamdiskBoot.objects.filter(host=host, secret_hash=boot_path.hash_secret(secret)).exists())
    boot_path.security_event(host=host, message=f"agent lookup refused: {why} (from {address or '?'})",
                             data={"address": address}, reason=f"agent lookup refused: {why}", attention=not routine)


def _address(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


@rate_limited("call")
@_endpoint
def heartbeat(request, body):
    session = _session(request, body)
    now = timezone.now()
    if (now - session.last_seen_at).total_seconds() >= _last_seen_every_s():
        AgentSession.objects.filter(pk=session.pk).update(last_seen_at=now)
    command_id = _command_pk(body.get("command_id"))
    if command_id is not None and isinstance(body.get("progress"), (int, float)):
        HostCommand.objects.filter(pk=command_id, host_id=session.host_id, status=CommandStatus.SENT).update(
            progress=max(0.0, min(100.0, float(body["progress"]))), message=str(body.get("message", ""))[:500])
        publish_progress(session.host_id)
    if body.get("status") == "busy":
        return {"command": None, **_flow_poll_offer()}  # its next idle ask, after its result, may be held
    host = session.host
    gone = None
    if host.state not in AGENT_STATES:  # warm, idle (hosts/flows/warm.py): nothing to do until it is allocated
        gone = client_gone(request.environ)
        host = _warm_poll(session, body, gone)
        if host.state not in AGENT_STATES:
            return {"command": None, "heartbeat_s": HEARTBEAT_S, "wait_s": settings.WARM_POLL_S}
    command = _open_command(session.host_id, host)
    if command is None and gone is None and flow_poll_s():  # not held already (a warm host's that found its claim)
        gone = client_gone(request.environ)
        host = _flow_poll(session, body, host, gone)
        command = _open_command(session.host_id, host) if host is not None else None
    if command is None:
        return {"command": None, "heartbeat_s": HEARTBEAT_S, **_flow_poll_offer()}
    if gone is not None and gone():
        # The held ask's client went away meanwhile: nobody reads this answer, so the command stays queued for the
        # agent's next ask instead of being marked sent into a closed connection.
        log.info("host %s: held ask closed by its client before command %s went out", session.host_id, command.pk)
        return {"command": None, "heartbeat_s": HEARTBEAT_S}
    HostCommand.objects.filter(pk=command.pk).update(status=CommandStatus.SENT, sent_at=now, session=session)
    args = dict(command.args)
    if command.secret_args:
        args.update(json.loads(command.secret_args))
    return {"command": {"id": command.public_id, "name": command.name, "args": args}, "heartbeat_s": HEARTBEAT_S,
            **_flow_poll_offer()}


def _open_command(host_id: int, host: BareMetalHost) -> HostCommand | None:
    """The command of the host's current flow run that its agent is to run (queued, or sent and not answered)."""
    flow_id = (host.flow or {}).get("id")
    return HostCommand.objects.filter(host_id=host_id, flow_id=flow_id,
                                      status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).first()


def _flow_poll_offer() -> dict:
    """What an answer to the agent of a host in a flow says of its next idle ask: it may offer to be held
    (`wait_s`, which the agent keeps from every answer until the next one)."""
    hold = flow_poll_s()
    return {"wait_s": hold} if hold else {}


def flow_poll_s() -> float:
    """How long an idle agent's ask is held while a flow drives its host (0: not held): FLOW_POLL_S, and a
    quarter of AGENT_SILENCE_S at most (a held ask's end counts as hearing from the agent: _held_ask)."""
    return max(0.0, min(settings.FLOW_POLL_S, settings.AGENT_SILENCE_S / 4))


def _warm_poll(session: AgentSession, body: dict, gone: Callable[[], bool] | None = None) -> BareMetalHost:
    """A warm host's idle agent that offers a long poll (`wait_s`, which our last answer asked for) is held
    until its host has work or WARM_POLL_S pass (hosts/protocol/poll.py). Its liveness is its asks: the warm sweep
    allows WARM_POLL_S between two (hosts/flows/warm.py). Woken, the session counts as heard from now (the command
    goes back on this very answer). Returns the host as it is after the wait; a session ended meanwhile (the
    host powered off) is refused, as its next ask would be. A second ask of the same session while one is held
    is answered at once. `gone`: the ask's connection closed (agent_poll.client_gone); the hold then ends at
    once and frees its place for the agent's next ask."""
    host_id = session.host_id

    def idle() -> bool:
        return BareMetalHost.objects.filter(pk=host_id, state=HostState.AVAILABLE, warm_since__isnull=False).exists()

    host = _held_ask(session, body, settings.WARM_POLL_S, idle, gone)
    return session.host if host is None else host


def _flow_poll(session: AgentSession, body: dict, host: BareMetalHost,
               gone: Callable[[], bool] | None) -> BareMetalHost | None:
    """The idle agent of a host that a flow drives (provisioning, cleaning, inspecting), with no command to run
    now, that offers a long poll: its ask is held until a command of the flow run is queued (agent_command wakes
    it), the host leaves the state or flow run it was in when the ask came, or `hold_s` pass, as a warm host's
    (_held_ask). Without it the agent would ask every HEARTBEAT_S between its lookup and its first command and
    between two commands. Returns the host as it is after the hold (None: the ask was not held); a host no agent
    may work for any more is refused, as its agent's next ask would be (_session)."""
    flow_id, state = (host.flow or {}).get("id"), host.state

    def idle() -> bool:
        now = BareMetalHost.objects.filter(pk=host.pk).values_list("state", "flow__id").first()
        return now == (state, flow_id) and not HostCommand.objects.filter(
            host_id=host.pk, flow_id=flow_id, status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).exists()

    after = _held_ask(session, body, flow_poll_s(), idle, gone)
    if after is not None and not _in_ramdisk(after):
        raise Refused(403, "token is not valid for this boot")
    return after


def _held_ask(session: AgentSession, body: dict, longest_s: float, idle: Callable[[], bool],
              gone: Callable[[], bool] | None) -> BareMetalHost | None:
    """Hold an idle agent's ask (hosts/protocol/poll.py) while `idle()`, up to the `wait_s` it offers (which our last
    answer asked for) and `longest_s`. One held ask per session: an agent (or whoever holds its token) cannot tie
    up the listener's threads; a second ask while one is held is answered at once. Returns the host as it is after
    the hold (its state, warmth and flow record), None when the ask was not held; a session ended meanwhile is
    refused, as its next ask would be. Woken, or held to its end with its client there, the session counts as
    heard from now."""
    wait = body.get("wait_s")
    if not isinstance(wait, (int, float)) or isinstance(wait, bool) or wait <= 0:
        return None
    host_id = session.host_id
    hold = min(float(wait), longest_s)
    held = held_key(session.pk)
    try:
        first = cache.add(held, 1, timeout=int(hold) + 30)
    except Exception:  # no cache: hold it all the same
        log.warning("agent long poll not counted: cache unavailable", exc_info=True)
        first = True
    if not first:
        return None
    try:
        woken = agent_wait(host_id, hold, idle, gone)
    finally:
        try:
            cache.delete(held)
        except Exception:
            log.warning("agent long poll not uncounted: cache unavailable", exc_info=True)
    if not AgentSession.objects.filter(pk=session.pk, active=True).exists():
        raise Refused(403, "token is not valid for this boot")
    now = timezone.now()
    if woken:
        AgentSession.objects.filter(pk=session.pk).update(last_seen_at=now)
    elif gone is None or not gone():
        # Held to its end, its connection still open: heard from now, as an ask that came now would be (a held ask
        # adds nothing to how long an agent may seem silent).
        AgentSession.objects.filter(pk=session.pk, last_seen_at__lt=now - timedelta(seconds=_last_seen_every_s())) \
            .update(last_seen_at=now)
    return BareMetalHost.objects.only(*HOST_AFTER_HOLD).get(pk=host_id)


def _last_seen_every_s() -> float:
    return min(LAST_SEEN_EVERY_S, settings.AGENT_SILENCE_S / 4)


HOST_AFTER_HOLD = ("id", "state", "warm_since", "flow")  # what a call reads of its host (SESSION_FIELDS)


@rate_limited("call")
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
    check = REPORT_SHAPES.get(command.name)
    problems = check(body.get("result")) if check is not None else []
    if problems:
        # A report the console cannot read is no report: the command fails with the reason, its content is kept
        # nowhere, and the step that asked for it fails (to repair, for the release gate's).
        reason = f"{command.name} report refused: malformed ({'; '.join(problems[:3])})"
        log.warning("host %s: %s", session.host_id, reason)
        with transaction.atomic():
            HostCommand.objects.filter(pk=command.pk, status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).update(
                status=CommandStatus.FAILED, result={}, progress=None, error=reason[:2000], finished_at=timezone.now())
            task_send_on_commit(task_names.DRIVE_HOST_FOR_AGENT, host_id=session.host_id)
        raise Refused(400, reason)
    result = body.get("result") if isinstance(body.get("result"), dict) else {}
    with transaction.atomic():
        HostCommand.objects.filter(pk=command.pk, status__in=[CommandStatus.QUEUED, CommandStatus.SENT]).update(
            status=CommandStatus.DONE if ok else CommandStatus.FAILED, result=result, progress=100.0 if ok else None,
            error="" if ok else str(body.get("error") or "agent reported a failure")[:2000],
            finished_at=timezone.now())
        task_send_on_commit(task_names.DRIVE_HOST_FOR_AGENT, host_id=session.host_id)
    return {}


# The reports whose shape the console checks before it keeps them (a malformed one is refused): the command's
# name → a function returning what is wrong ([] when nothing).
REPORT_SHAPES: dict[str, Callable[[object], list[str]]] = {"gpu_state": gpu_state.report_problems}


# --- The boot path (hosts/boot/ramdisk.py): what the server's firmware or BMC fetches, once per boot -----------------

MAC_IN_PATH = re.compile(r"^[0-9a-fA-F]{2}([-:][0-9a-fA-F]{2}){5}$")


@rate_limited("lookup")
@require_GET
def boot_script(request, mac: str):
    """`GET /boot/<mac>.ipxe`: the iPXE script of the host's ramdisk boot (chained by the DHCP/TFTP stage
    with `${net0/mac:hexhyp}`). 404 when the console started no ramdisk boot of it, or served it already."""
    taken = MAC_IN_PATH.match(mac) and boot_path.boot_config_take(mac=mac, via="ipxe",
                                                                     address=client_ip(request))
    if not taken:
        return HttpResponseNotFound("no ramdisk boot waiting for this MAC address\n", content_type="text/plain")
    host, _, arguments = taken
    return HttpResponse(boot_path.ipxe_script(host, arguments), content_type="text/plain")


TOKEN_IN_PATH = re.compile(r"^[A-Za-z0-9_-]{20,100}$")


@rate_limited("lookup")
@require_GET
def boot_media(request, token: str):
    """`GET /boot/media/<token>.iso`: the virtual-media image of a host's ramdisk boot, fetched by its BMC from the
    one-time URL the console gave it in InsertMedia (hosts/boot/ramdisk.py). 404 for any other token, and after its use."""
    taken = TOKEN_IN_PATH.match(token) and boot_path.boot_media_take(token=token, address=client_ip(request))
    if not taken:
        return HttpResponseNotFound("no virtual media waiting at this address\n", content_type="text/plain")
    response = HttpResponse(boot_path.boot_iso(taken[2]), content_type="application/x-iso9660-image")
    response["Content-Disposition"] = 'attachment; filename="vmetal-boot.iso"'
    return response


@require_GET
def boot_media_by_mac(request, mac: str):
    """`GET /boot/<mac>.iso`: never served. Whoever knows a MAC is not the host's BMC; the BMC has its own URL."""
    return HttpResponseNotFound("virtual media is served only at the one-time URL given to the host's BMC\n",
                                content_type="text/plain")


def _command_pk(value) -> int | None:
    if isinstance(value, str) and value.startswith("c-") and value[2:].isdigit():
        return int(value[2:])
    return None
