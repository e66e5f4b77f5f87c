"""The lab's tenant Kubernetes API: kmock's KubernetesEmulator served over HTTP, plus a simulated kubelet.

One `TenantAPIServer` per tenant, each on its own 127.0.0.1 port, in its own thread and asyncio
loop, so synchronous code (Django, Celery, the official `kubernetes` client) can talk to it.

What kmock gives: an in-memory object store with create / merge-patch / delete, 404s and 409s,
list and watch streams, discovery (/api, /api/v1, /apis). What this module adds, because the
console and the official client rely on it and kmock (0.8) does not do it:

- bearer-token authentication: the admin token of the kubeconfig, and bootstrap tokens checked
  against their `bootstrap-token-<id>` Secret the way the API server's bootstrap authenticator
  does (a bootstrap identity may only touch nodes, pods and CSRs: the lab folds the kubelet's TLS
  bootstrap into that token, and its CSR's spec.username names the token as the real API server's does);
- metadata the real API server fills in (uid, creationTimestamp, resourceVersion, namespace),
  Secret `stringData` folded into `data`, and 409 on a patch that carries a stale resourceVersion;
- fieldSelector / labelSelector / timeoutSeconds / resourceVersion on list and watch (kmock
  ignores them), and a watch that cannot lose an event between its snapshot and its stream;
- the `pods/eviction` subresource (policy/v1 Eviction), with graceful termination and a switch
  that answers 429 as a PodDisruptionBudget would;
- pod garbage collection when a node is deleted;
- a scheduler and the Job controller, in small (the scheduler's filters: lab/scheduling.py).

It is served by aiohttp's own runner, not by `kmock.Server`: that one patches aiohttp's resolver
process-wide and must be stopped in LIFO order, which two tenants stopped in any order break.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import datetime
import hmac
import itertools
import logging
import re
import secrets
import shlex
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import parsing, rendering  # Request parsing, Response(status=...) for a handler's own status

from . import scheduling

log = logging.getLogger(__name__)

CORE = "v1"
NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")
SECRETS = kmock.resource("", "v1", "secrets")
NAMESPACES = kmock.resource("", "v1", "namespaces")
JOBS = kmock.resource("batch", "v1", "jobs")
CSRS = kmock.resource("certificates.k8s.io", "v1", "certificatesigningrequests")
RESOURCES = {
    NODES: kmock.ResourceInfo(kind="Node", singular="node", namespaced=False, shortnames={"no"},
                              verbs={"create", "delete", "get", "list", "patch", "watch"}, subresources={"status"}),
    PODS: kmock.ResourceInfo(kind="Pod", singular="pod", namespaced=True, shortnames={"po"},
                             verbs={"create", "delete", "get", "list", "patch", "watch"},
                             subresources={"status", "eviction"}),
    SECRETS: kmock.ResourceInfo(kind="Secret", singular="secret", namespaced=True,
                                verbs={"create", "delete", "get", "list", "patch", "watch"}),
    NAMESPACES: kmock.ResourceInfo(kind="Namespace", singular="namespace", namespaced=False, shortnames={"ns"},
                                   verbs={"create", "delete", "get", "list", "patch", "watch"}),
    JOBS: kmock.ResourceInfo(kind="Job", singular="job", namespaced=True,
                             verbs={"create", "delete", "get", "list", "patch", "watch"}, subresources={"status"}),
    CSRS: kmock.ResourceInfo(kind="CertificateSigningRequest", singular="certificatesigningrequest", namespaced=False,
                             shortnames={"csr"}, verbs={"create", "delete", "get", "list", "patch", "watch"}),
}
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PUBLIC_PATHS = {"/healthz", "/livez", "/readyz", "/version"}  # system:public-info-viewer
BOOTSTRAP_TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
BOOTSTRAPPER_RESOURCES = {"nodes", "pods", "certificatesigningrequests"}  # what a joining kubelet may touch
_CLOSE = object()  # put on every watch bus at shutdown, so open watches end at once
# kmock's URL parser reads /api/v1/namespaces[/NAME] as "inside a namespace" and fails or misroutes
DISCOVERY_SLASH = re.compile(r"^/(api|apis)(/[^/]+){0,2}/$")
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+)(?:/(status|finalize))?)?/?$")


class KubeletJoinError(RuntimeError):
    """The simulated kubelet could not join: the tenant API refused its token, or is down."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure" if code >= 300 else "Success",
            "code": code, "reason": reason, "message": message, "details": details or {}}


def _rv(obj: dict) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _as_field(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def field_selector_matches(selector: str, obj: dict) -> bool:
    """`metadata.name=x,spec.nodeName!=y` (also `==`); any dotted path of the object."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        negate = "!=" in term
        path, _, want = term.partition("!=" if negate else ("==" if "==" in term else "="))
        if (_as_field(_lookup(obj, path.strip())) == want.strip()) == negate:
            return False
    return True


_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def label_selector_matches(selector: str, labels: dict) -> bool:
    """`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`, joined by commas."""
    terms, depth, current = [], 0, ""
    for ch in selector:  # commas inside (…) belong to a set term
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    for term in filter(None, (t.strip() for t in terms)):
        if match := _SET_TERM.match(term):
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in") or (op == "in" and key not in labels):
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif "!=" in term:
            key, _, value = term.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, _, value = term.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif term not in labels:
            return False
    return True


def check_bootstrap_token(token: str, secret: dict | None, now: datetime.datetime | None = None) -> str | None:
    """Why `token` is not a valid bootstrap token given its Secret, or None when it is (as kube-apiserver checks)."""
    match = BOOTSTRAP_TOKEN_RE.match(token)
    if not match:
        return "malformed bootstrap token"
    token_id, token_secret = match.groups()
    if secret is None:
        return f"bootstrap token {token_id}: no Secret kube-system/bootstrap-token-{token_id}"
    if secret.get("type") != "bootstrap.kubernetes.io/token":
        return f"bootstrap token {token_id}: Secret has the wrong type {secret.get('type')!r}"
    try:
        data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    except (binascii.Error, UnicodeDecodeError, TypeError):
        return f"bootstrap token {token_id}: Secret data is not base64"
    if data.get("token-id") != token_id or not hmac.compare_digest(data.get("token-secret", ""), token_secret):
        return f"bootstrap token {token_id}: token-id or token-secret does not match"
    if data.get("usage-bootstrap-authentication") != "true":
        return f"bootstrap token {token_id}: not marked usage-bootstrap-authentication"
    if expiration := data.get("expiration"):
        try:
            expires = datetime.datetime.fromisoformat(expiration.replace("Z", "+00:00"))
        except ValueError:
            return f"bootstrap token {token_id}: unreadable expiration {expiration!r}"
        if (now or _now()) >= expires:
            return f"bootstrap token {token_id}: expired at {expiration}"
    return None


class TenantEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server behaviour the console needs (see the module's docstring)."""

    def __init__(self, *, admin_token: str, termination_s: float = 0.2) -> None:
        super().__init__()
        for res, info in RESOURCES.items():
            self.resources[res] = info
        self.admin_token = admin_token
        self.termination_s = termination_s  # how long a lab pod takes to exit after SIGTERM (capped by its grace)
        self.eviction_refusals = 0  # the next N evictions get 429, as a PodDisruptionBudget would answer
        self.evictions: list[tuple[str, int | None]] = []  # each eviction asked for: ("ns/name", gracePeriodSeconds)
        self._rv_counter = itertools.count(1)
        self._last_rv = 0
        self._created_rv: dict[tuple, int] = {}
        self._tasks: set[asyncio.Task] = set()
        self.fallback["post", re.compile(r"/api/v1/namespaces/[^/]+/pods/[^/]+/eviction")] << self._serve_eviction
        self.fallback["get", re.compile(r"/(healthz|livez|readyz)")] << b"ok"
        for ns in INITIAL_NAMESPACES:
            obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}, "spec": {"finalizers": ["kubernetes"]},
                   "status": {"phase": "Active"}}
            self._stamp_new(obj, None)
            self.objects[NAMESPACES, None, ns] = obj

    def adopt(self, previous: TenantEmulator) -> None:
        """Take over the objects of a stopped server's emulator (same resourceVersions, uids, Jobs and pods), so a
        restart is an outage, not a new cluster. Watches and pending terminations of the old loop are not carried:
        clients watch again, as after any API server restart."""
        self._objects = previous._objects
        self._rv_counter, self._last_rv = previous._rv_counter, previous._last_rv
        self._created_rv = previous._created_rv
        self.evictions, self.eviction_refusals = previous.evictions, previous.eviction_refusals

    # -- metadata the API server owns

    def _next_rv(self) -> str:
        self._last_rv = next(self._rv_counter)
        return str(self._last_rv)

    def _stamp_new(self, obj: dict, namespace: str | None) -> None:
        meta = obj.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _rfc3339(_now())
        meta["resourceVersion"] = self._next_rv()
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(key, None)

    @staticmethod
    def _fold_string_data(obj: dict) -> None:
        if isinstance(obj.get("stringData"), dict):
            data = obj.setdefault("data", {}) or {}
            data.update({k: base64.b64encode(str(v).encode()).decode() for k, v in obj.pop("stringData").items()})
            obj["data"] = data

    def _stored(self, key: tuple) -> dict | None:
        obj = self._objects[key] if key in self._objects else None
        return None if obj is None or obj.deleted else obj.raw

    # -- authentication and authorisation

    def _identity(self, request: kmock.Request) -> tuple[str | None, str | None]:
        """(identity, why not): 'admin', 'system:bootstrap:<id>', or None with the reason."""
        header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None, "no bearer token"
        if hmac.compare_digest(token.encode(), self.admin_token.encode()):
            return "admin", None
        if match := BOOTSTRAP_TOKEN_RE.match(token):
            secret = self._stored((SECRETS, "kube-system", f"bootstrap-token-{match.group(1)}"))
            why = check_bootstrap_token(token, secret)
            return (None, why) if why else (f"system:bootstrap:{match.group(1)}", None)
        return None, "unknown token"

    def _deny(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        if request.url.path in PUBLIC_PATHS:
            return None
        who, why = self._identity(request)
        if who is None:
            return aiohttp.web.json_response(_status(401, "Unauthorized", f"Unauthorized: {why}"), status=401)
        plural = request.resource.plural if request.resource is not None else None
        if who != "admin" and plural is not None and plural not in BOOTSTRAPPER_RESOURCES:
            message = f'{who} cannot {request.method.value.lower()} resource "{plural}"'
            return aiohttp.web.json_response(_status(403, "Forbidden", message), status=403)
        return None

    # -- request handling

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's entry point, with namespaces routable and its request log kept short."""
        if DISCOVERY_SLASH.match(raw_request.path):  # the official client asks /apis/ and /apis/batch/v1/
            raw_request = raw_request.clone(rel_url=raw_request.rel_url.with_path(raw_request.path.rstrip("/")))
        await raw_request.read()
        raw_response = None
        try:
            request = await self._parse(raw_request)
            self._housekeeping()
            self._requests.append(request)  # kmock finds a request's reactions through this log
            try:
                return await self._handle(request)
            except rendering.StreamingError as exc:  # the stream had started: report inside it
                raw_response = exc.args[0]
                raise exc.__cause__ from None
        except Exception as exc:
            if not isinstance(exc, kmock.KubernetesError):
                log.warning("tenant API: %s %s failed: %r", raw_request.method, raw_request.path, exc)
            if raw_response is None or not raw_response.prepared:
                return await self._render_error(exc)
            await self._stream_error(exc, raw_response)
            await raw_response.write_eof()
            return raw_response

    @classmethod
    async def _parse(cls, raw: aiohttp.web.BaseRequest) -> kmock.Request:
        request = await cls._parse_path(raw)
        # kmock takes only watch=true; the API server (Go's ParseBool) and the Python client's "True" too
        if (request.resource is not None and request.method == kmock.method.GET
                and request.params.get("watch", "").lower() in ("1", "t", "true")):
            request = attrs.evolve(request, action=kmock.action.WATCH)
        return request

    @staticmethod
    async def _parse_path(raw: aiohttp.web.BaseRequest) -> kmock.Request:
        if not (match := NAMESPACE_PATH.match(raw.path)):
            return await rendering.Request._parse(raw)
        name, subresource = match.groups()
        body = await raw.read()
        try:
            data = await raw.json()
        except ValueError:
            data = None
        path = parsing.ParsedPath("", "v1", "namespaces", None, name, subresource)
        return rendering.Request(
            raw_request=raw, url=raw.url, method=raw.method, params=dict(raw.query), headers=dict(raw.headers),
            cookies=dict(raw.cookies), body=body, text=body.decode(errors="replace"), data=data,
            action=parsing.guess_k8s(path, kmock.method(raw.method), dict(raw.query)),
            resource=NAMESPACES, namespace=None, name=name, subresource=subresource)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if (denied := self._deny(request)) is not None:
            return denied
        key = None
        if request.resource is not None and isinstance(request.data, dict | list):
            if request.action == kmock.action.CREATE and isinstance(request.data, dict):
                if request.resource == CSRS:  # the API server writes who asked, whatever the body says
                    request.data.setdefault("spec", {})["username"] = self._identity(request)[0]
                self._fold_string_data(request.data)
                self._stamp_new(request.data, request.namespace)
                meta = request.data["metadata"]
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789")
                                                                  for _ in range(5))
                if not meta.get("name"):
                    return aiohttp.web.json_response(_status(422, "Invalid", "metadata.name: Required value"), status=422)
                key = (request.resource, request.namespace, meta["name"])
                if self._stored(key) is None:  # else kmock answers 409
                    self._created_rv[key] = self._last_rv
            elif request.action == kmock.action.UPDATE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                current = self._stored(key)
                if isinstance(request.data, dict):
                    wanted = (request.data.get("metadata") or {}).get("resourceVersion")
                    if current is not None and wanted and str(wanted) != str(_rv(current)):
                        message = (f'Operation cannot be fulfilled on {request.resource.plural} "{request.name}": the object '
                                   "has been modified; please apply your changes to the latest version and try again")
                        return aiohttp.web.json_response(_status(409, "Conflict", message), status=409)
                    self._fold_string_data(request.data)
                    request.data.setdefault("metadata", {})["resourceVersion"] = self._next_rv()
                else:  # a JSON patch
                    request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": self._next_rv()})
            elif request.action == kmock.action.DELETE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                if self._stored(key) is not None:  # the DELETED event carries a new resourceVersion
                    self._objects[key].patch({"metadata": {"resourceVersion": self._next_rv()}})
        deleted_job = None
        if request.action == kmock.action.DELETE and request.resource == JOBS and request.name is not None:
            deleted_job = self._stored((JOBS, request.namespace, request.name))
        response = await super()._handle(request)
        if key is not None and key in self._objects and len(self._objects[key].history) > 3:
            del self._objects[key].history[:-2]  # keep memory flat in a long-running lab
        if (request.action == kmock.action.DELETE and request.resource == NODES and request.name
                and response.status < 300):
            await self._collect_pods_of(request.name)
        if deleted_job is not None and response.status < 300:
            policy = (request.data or {}).get("propagationPolicy") if isinstance(request.data, dict) else None
            if (policy or request.params.get("propagationPolicy")) != "Orphan":
                await self._collect_pods_of_job(deleted_job["metadata"].get("uid"))
        if (request.resource in (PODS, NODES, JOBS) and response.status < 300
                and request.action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)):
            await self.settle()  # before the answer: a client that lists next sees the scheduler's verdict
        return response

    async def _serve_version(self, request: kmock.Request) -> dict:
        """kmock's APIResourceList, with the core group named "v1" and the subresources told apart."""
        payload = await super()._serve_version(request)
        if request.resource is not None and request.resource.group == "":
            payload["groupVersion"] = "v1"
        for entry in payload["resources"]:
            if entry["name"] == "pods/eviction":
                entry.update(kind="Eviction", group="policy", version="v1", verbs=["create"], shortNames=[])
            elif entry["name"].endswith("/status"):
                entry.update(verbs=["get", "patch"], shortNames=[])
        return payload

    def _housekeeping(self) -> None:
        """kmock logs every request, and scans that log to route each one (every reaction looks for the request
        in the whole log): a long log costs every request, and a lab server runs for hours. With 50 servers
        joining at once, a 256-request log made kmock a quarter of all the CPU the bench used (py-spy,
        bench/fleet.py)."""
        if len(self._requests) > 64:
            del self._requests[:-16]
            for payload in self._payloads:
                payload._requests.clear()

    async def _serve_list(self, request: kmock.Request) -> dict:
        payload = await super()._serve_list(request)
        info = self.resources[request.resource]
        group = request.resource.group
        return {"apiVersion": f"{group}/{request.resource.version}" if group else CORE, "kind": f"{info.kind}List",
                "metadata": {"resourceVersion": str(self._last_rv)},
                "items": [obj for obj in payload["items"] if self._selected(request, obj)]}

    @staticmethod
    def _selected(request: kmock.Request, obj: dict) -> bool:
        fields, labels = request.params.get("fieldSelector"), request.params.get("labelSelector")
        return ((not fields or field_selector_matches(fields, obj))
                and (not labels or label_selector_matches(labels, obj.get("metadata", {}).get("labels") or {})))

    @staticmethod
    def _in_scope(request: kmock.Request, namespace: str | None, name: str | None) -> bool:
        return ((request.namespace is None or namespace == request.namespace)
                and (request.name is None or name == request.name))

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        yield b""  # send the headers now: a watch may wait long for its first event
        loop = asyncio.get_running_loop()
        timeout = request.params.get("timeoutSeconds")
        deadline = loop.time() + float(timeout) if timeout else None
        try:
            since = int(request.params.get("resourceVersion") or 0)
        except ValueError:
            since = 0
        bus = self._buses[request.resource]
        marker = await bus.mark()  # mark before the snapshot: nothing falls between the two
        try:
            async with self._lock:
                snapshot = [(key, obj.raw) for key, obj in self._objects.items()
                            if key[0] == request.resource and not obj.deleted and self._in_scope(request, *key[1:])]
            sent: dict[tuple, int] = {}
            for key, raw in snapshot:
                sent[key[1:]] = _rv(raw)
                if since and _rv(raw) <= since:
                    continue  # watching from a resourceVersion: only what changed after it
                if self._selected(request, raw):
                    kind = "ADDED" if not since or self._created_rv.get(key, 0) > since else "MODIFIED"
                    yield {"type": kind, "object": raw}
            stream = bus.stream(since=marker)
            try:
                while True:
                    remaining = None if deadline is None else deadline - loop.time()
                    if remaining is not None and remaining <= 0:
                        return
                    try:
                        event = await asyncio.wait_for(anext(stream), remaining)
                    except (TimeoutError, StopAsyncIteration):
                        return
                    if event is _CLOSE:
                        return
                    meta = event["object"].get("metadata", {})
                    if not self._in_scope(request, meta.get("namespace"), meta.get("name")):
                        continue
                    if sent.get((meta.get("namespace"), meta.get("name")), -1) >= _rv(event["object"]):
                        continue  # already in the snapshot
                    if self._selected(request, event["object"]):
                        yield event
            finally:
                await stream.aclose()
        finally:
            await bus.unmark(marker)

    async def close_watches(self) -> None:
        for bus in list(self._buses.values()):
            await bus.put(_CLOSE)
        for task in list(self._tasks):
            task.cancel()

    # -- policy/v1 Eviction, graceful termination, pod GC

    async def _serve_eviction(self, request: kmock.Request) -> rendering.Response:
        key = (PODS, request.namespace, request.name)
        pod = self._stored(key)
        if pod is None:
            return rendering.Response(status=404, payload=_status(
                404, "NotFound", f'pods "{request.name}" not found', {"name": request.name, "kind": "pods"}))
        options = (request.data or {}).get("deleteOptions") or {}
        self.evictions.append((f"{request.namespace}/{request.name}", options.get("gracePeriodSeconds")))
        if self.eviction_refusals > 0:
            self.eviction_refusals -= 1
            return rendering.Response(status=429, payload=_status(
                429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                {"causes": [{"reason": "DisruptionBudget",
                             "message": "The disruption budget lab-pdb needs 1 healthy pods and has 1 currently"}]}))
        await self._terminate(key, options.get("gracePeriodSeconds"))
        await self.settle()  # a Job replaces an evicted pod at once, as the Job controller does
        return rendering.Response(status=201, payload=_status(201, "", ""))

    async def _terminate(self, key: tuple, grace: int | None = None) -> None:
        """Graceful deletion of a pod, as the kubelet does it: deletionTimestamp now, gone after its grace period
        (capped by termination_s in the lab); grace None: the pod's own terminationGracePeriodSeconds."""
        pod = self._stored(key)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return
        if grace is None:
            grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if grace <= 0:
            await self._delete_now(key)
            return
        async with self._lock:
            self._objects[key].patch({"metadata": {
                "deletionTimestamp": _rfc3339(_now() + datetime.timedelta(seconds=grace)),
                "deletionGracePeriodSeconds": grace, "resourceVersion": self._next_rv()}})
            await self._buses[PODS].put({"type": "MODIFIED", "object": self._objects[key].raw})
        self._spawn(self._terminate_later(key, pod["metadata"].get("uid"), min(grace, self.termination_s)))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _terminate_later(self, key: tuple, uid: str | None, delay: float) -> None:
        await asyncio.sleep(delay)
        current = self._stored(key)
        if current is not None and current["metadata"].get("uid") == uid:  # not a new pod of the same name
            await self._delete_now(key)
            await self.settle()  # what it held is free: a Pending pod may fit now

    async def _delete_now(self, key: tuple) -> None:
        async with self._lock:
            if self._stored(key) is None:
                return
            self._objects[key].patch({"metadata": {"resourceVersion": self._next_rv()}})
            raw = self._objects[key].raw
            self._objects[key].delete()
            del self._objects[key].history[:-2]
            await self._buses[key[0]].put({"type": "DELETED", "object": raw})

    async def _collect_pods_of(self, node_name: str) -> None:
        """The pod GC controller: pods bound to a node that no longer exists are deleted."""
        keys = [key for key, obj in self._objects.items()
                if key[0] == PODS and not obj.deleted and (obj.raw.get("spec") or {}).get("nodeName") == node_name]
        for key in keys:
            await self._delete_now(key)

    async def _collect_pods_of_job(self, uid: str | None) -> None:
        """The garbage collector: a deleted Job's pods terminate (foreground or background propagation)."""
        keys = [key for key, obj in self._objects.items() if key[0] == PODS and not obj.deleted and uid
                and any(ref.get("uid") == uid for ref in (obj.raw.get("metadata") or {}).get("ownerReferences") or [])]
        for key in keys:
            await self._terminate(key)

    # -- the controllers: Jobs keep their pods, the scheduler binds them

    async def settle(self) -> None:
        """One pass of the Job controller and the scheduler, run after every change to a pod, node or Job (the
        real ones react to the same watch events). Their changes go on the watch buses like any other."""
        async with self._lock:
            live = self._live()
            events = self._run_jobs(live[JOBS], live[PODS]) if live[JOBS] else []
            if events:
                live = self._live()
            events += self._schedule(live[PODS], live[NODES])
            for resource, event in events:
                await self._buses[resource].put(event)

    def _live(self) -> dict:
        """{PODS: [(key, pod)], NODES: [...], JOBS: [...]}, in one pass over the store (every request pays it)."""
        live: dict = {PODS: [], NODES: [], JOBS: []}
        for key, obj in self._objects.items():
            if key[0] in live and not obj.deleted:
                live[key[0]].append((key, obj.raw))
        return live

    def _patch(self, key: tuple, changes: dict) -> tuple:
        obj = self._objects[key]
        obj.patch({**changes, "metadata": {**changes.get("metadata", {}), "resourceVersion": self._next_rv()}})
        if len(obj.history) > 3:
            del obj.history[:-2]
        return key[0], {"type": "MODIFIED", "object": obj.raw}

    def _add(self, resource, obj: dict) -> tuple:
        namespace = obj["metadata"].get("namespace")
        self._stamp_new(obj, namespace)
        key = (resource, namespace, obj["metadata"]["name"])
        self._created_rv[key] = self._last_rv
        if key in self._objects:  # a deleted one of that name: kmock keeps its history
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        return resource, {"type": "ADDED", "object": self._objects[key].raw}

    def _run_jobs(self, jobs: list[tuple[tuple, dict]], pods: list[tuple[tuple, dict]]) -> list[tuple]:
        """The Job controller, for lab jobs that run until deleted: each Job keeps spec.parallelism pods that are
        not terminating (a pod evicted or deleted is replaced at once, under a new name, as with
        podReplacementPolicy TerminatingOrFailed); extra ones go, newest first. status.active follows."""
        events = []
        for key, job in sorted(jobs, key=lambda kj: self._created_rv.get(kj[0], 0)):
            meta, spec = job["metadata"], job.get("spec") or {}
            want = max(0, int(spec.get("parallelism", 1) if spec.get("parallelism") is not None else 1))
            mine = [(k, p) for k, p in pods if not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                    and any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])]
            mine.sort(key=lambda kp: self._created_rv.get(kp[0], 0))
            for extra_key, _ in mine[want:]:
                self._objects[extra_key].patch({"metadata": {"resourceVersion": self._next_rv()}})
                raw = self._objects[extra_key].raw
                self._objects[extra_key].delete()
                events.append((PODS, {"type": "DELETED", "object": raw}))
            for _ in range(want - len(mine)):
                events.append(self._add(PODS, self._job_pod(job)))
            status = job.get("status") or {}
            if status.get("active") != want or not status.get("startTime"):
                events.append(self._patch(key, {"status": {"active": want,
                                                           "startTime": status.get("startTime") or _rfc3339(_now())}}))
        return events

    def _job_pod(self, job: dict) -> dict:
        meta = job["metadata"]
        template = (job.get("spec") or {}).get("template") or {}
        template_meta = template.get("metadata") or {}
        name = meta["name"] + "-" + "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        labels = {**(template_meta.get("labels") or {}), "job-name": meta["name"],
                  "batch.kubernetes.io/job-name": meta["name"], "controller-uid": meta["uid"],
                  "batch.kubernetes.io/controller-uid": meta["uid"]}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": meta["namespace"], "generateName": meta["name"] + "-",
                             "labels": labels, "annotations": dict(template_meta.get("annotations") or {}),
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"],
                                                  "uid": meta["uid"], "controller": True,
                                                  "blockOwnerDeletion": True}]},
                "spec": {"restartPolicy": "Never", "schedulerName": "default-scheduler",
                         "terminationGracePeriodSeconds": 30, **copy.deepcopy(template.get("spec") or {})},
                "status": {"phase": "Pending"}}

    def _schedule(self, pods: list[tuple[tuple, dict]], nodes: list[tuple[tuple, dict]]) -> list[tuple]:
        """kube-scheduler, in small: each Pending pod without a node (oldest first) is bound to the first node, by
        name, that passes the filters (lab/scheduling.py: cordon, node name, taints and Ready, node affinity and
        nodeSelector, requests against allocatable less what the node's pods request); otherwise it gets
        PodScheduled=False, reason Unschedulable, and kube-scheduler's message. A pod is written only when its
        verdict changes, so a pass that decides nothing new publishes nothing."""
        pending = [(k, p) for k, p in pods if not (p.get("spec") or {}).get("nodeName")
                   and not p["metadata"].get("deletionTimestamp") and not (p.get("spec") or {}).get("schedulingGates")
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                   and (p.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"]
        if not pending:
            return []
        nodes = sorted(nodes, key=lambda kn: kn[0][2])
        bound: dict[str, list[dict]] = {}
        for _, pod in pods:
            if (pod.get("spec") or {}).get("nodeName") and (pod.get("status") or {}).get("phase") not in (
                    "Succeeded", "Failed"):
                bound.setdefault(pod["spec"]["nodeName"], []).append(pod)
        free = {key[2]: scheduling.node_free(node, bound.get(key[2], [])) for key, node in nodes}
        events = []
        for key, pod in sorted(pending, key=lambda kp: (self._created_rv.get(kp[0], 0), kp[0][1:])):
            reasons: dict[str, int] = {}
            chosen = None
            for node_key, node in nodes:
                why = scheduling.filter_node(pod, node, free[node_key[2]])
                if not why:
                    chosen = node
                    break
                for reason in why:
                    reasons[reason] = reasons.get(reason, 0) + 1
            if chosen is not None:
                scheduling.take(free[chosen["metadata"]["name"]], pod)
                events.append(self._patch(key, _bound(chosen)))
                continue
            message = (f"0/{len(nodes)} nodes are available: "
                       + ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items())) + "."
                       if nodes else "no nodes available to schedule pods")
            scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or []
                              if c.get("type") == "PodScheduled"), {})
            if scheduled.get("reason") != "Unschedulable" or scheduled.get("message") != message:
                condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": message, "lastProbeTime": None, "lastTransitionTime": _rfc3339(_now())}
                events.append(self._patch(key, {"status": {"phase": "Pending", "conditions": [condition]}}))
        return events


def _bound(node: dict) -> dict:
    """What binding and the kubelet starting the pod change: its node, PodScheduled, Running and Ready."""
    now = _rfc3339(_now())
    address = next((a.get("address") for a in (node.get("status") or {}).get("addresses") or []
                    if a.get("type") == "InternalIP"), None)
    return {"spec": {"nodeName": node["metadata"]["name"]},
            "status": {"phase": "Running", "startTime": now, "hostIP": address, "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}


class TenantAPIServer:
    """One tenant's Kubernetes API on 127.0.0.1, in a thread with its own event loop.

    with TenantAPIServer("acme") as api:      # or api.start() ... api.stop()
        api.endpoint                          # "127.0.0.1:PORT"
        api.kubeconfig()                      # YAML for the official client (admin token)
    """

    emulator_class: type[TenantEmulator] = TenantEmulator  # a subclass serves more kinds (lab/kubevirt.py)

    def __init__(self, name: str, *, host: str = "127.0.0.1", port: int = 0, termination_s: float = 0.2) -> None:
        self.name = name
        self.host = host
        self.port = port  # 0: a free port, known after start()
        self.termination_s = termination_s
        self.token = secrets.token_urlsafe(32)  # the admin bearer token of kubeconfig()
        self.emulator: TenantEmulator | None = None  # read it from tests only through call()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._kept: TenantEmulator | None = None  # the store a restart takes over (start(keep_objects=True))

    def __repr__(self) -> str:
        return f"<TenantAPIServer {self.name} {self.url if self.running else 'stopped'}>"

    def __enter__(self) -> TenantAPIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def start(self, timeout: float = 10, *, keep_objects: bool = False) -> TenantAPIServer:
        """Serve (again, after stop(): on the same port). keep_objects: with the objects the last run stored, as a
        real API server comes back from an outage with its etcd; otherwise with an empty store."""
        if self.running:
            return self
        self._kept = self.emulator if keep_objects else None
        self._started.clear()
        self._error = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name=f"tenant-api-{self.name}",
                                        daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError(f"tenant API {self.name} did not start within {timeout}s")
        if self._error is not None:
            self._thread.join(timeout)
            raise RuntimeError(f"tenant API {self.name} failed to start: {self._error}") from self._error
        return self

    def stop(self, timeout: float = 10) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"tenant API {self.name} did not stop within {timeout}s")
        self._thread = None

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        runner = None
        try:
            self.emulator = self.emulator_class(admin_token=self.token, termination_s=self.termination_s)
            if self._kept is not None:
                self.emulator.adopt(self._kept)
                self._kept = None
            async with self.emulator:
                runner = aiohttp.web.ServerRunner(aiohttp.web.Server(self.emulator, access_log=None),
                                                  shutdown_timeout=1.0)
                await runner.setup()
                site = aiohttp.web.TCPSite(runner, self.host, self.port)
                await site.start()
                self.port = runner.addresses[0][1]
                log.info("tenant API %s listening on %s", self.name, self.url)
                self._started.set()
                await self._stopping.wait()
                await self.emulator.close_watches()
                await runner.cleanup()
                runner = None
        except BaseException as exc:  # reported to start() in the caller's thread
            self._error = exc
            if runner is not None:
                await runner.cleanup()
        finally:
            self._started.set()

    def call(self, fn, timeout: float = 10) -> Any:
        """Run fn(emulator) inside the server's loop (for tests and lab tools that look at the store)."""
        async def run():
            return fn(self.emulator)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def objects(self, plural: str, namespace: str | None = None, group: str = "", version: str = "v1") -> list[dict]:
        """Live objects of a resource (core/v1 unless told), read straight from the store (no HTTP, no auth)."""
        res = kmock.resource(group, version, plural)
        return self.call(lambda emu: [obj.raw for (r, ns, _), obj in emu.objects.items()
                                      if r == res and not obj.deleted and (namespace is None or ns == namespace)])

    def refuse_evictions(self, count: int) -> None:
        """The next `count` evictions are refused with 429, as a PodDisruptionBudget would."""
        self.call(lambda emu: setattr(emu, "eviction_refusals", count))

    def evictions(self) -> list[tuple[str, int | None]]:
        """Every eviction asked for so far, refused or not: ("namespace/name", its gracePeriodSeconds)."""
        return self.call(lambda emu: list(emu.evictions))

    def kubeconfig(self) -> str:
        user = f"{self.name}-admin"
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": self.name, "cluster": {"server": self.url}}],
            "users": [{"name": user, "user": {"token": self.token}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": user}}],
            "current-context": self.name,
        }, sort_keys=False)

    def kubelet_join(self, bootstrap_token: str, node_name: str, labels: dict | None = None,
                     ready: bool = True, **kwargs: Any) -> dict:
        return kubelet_join(self.endpoint, bootstrap_token, node_name, labels, ready=ready, **kwargs)

    def kubelet_start(self, node_name: str) -> dict:
        """A registered node's kubelet posts Ready again (after a reboot: it has its client certificate by then, so
        no bootstrap token is needed)."""
        return _set_ready(self.endpoint, self.token, node_name, "True", "KubeletReady", "kubelet is posting ready status")

    def kubelet_stop(self, node_name: str) -> dict:
        """The kubelet stops posting status: the node lifecycle controller marks it NotReady (Ready=Unknown)."""
        return _set_ready(self.endpoint, self.token, node_name, "Unknown", "NodeStatusUnknown",
                          "Kubelet stopped posting node status.")


# -- the simulated kubelet, talking HTTP to the tenant API like the real one


def _api_client(endpoint: str, token: str):
    from kubernetes import client

    config = client.Configuration()
    config.host = endpoint if "://" in endpoint else f"http://{endpoint}"
    config.api_key = {"BearerToken": f"Bearer {token}"}  # the client's key name since v36
    config.retries = 1
    api = client.ApiClient(config)
    api.user_agent = "kubelet/v1.33.0 (lab)"
    return api


def _close(api) -> None:
    api.close()
    api.rest_client.pool_manager.clear()


def _kubelet_call(what: str, fn, *args, tolerate: tuple[int, ...] = (), **kwargs):
    """fn(...), None for a tolerated status, KubeletJoinError for anything else that goes wrong."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status in tolerate:
            return None
        if exc.status == 401:
            raise KubeletJoinError(f"tenant API refused the bootstrap token ({_message(exc)})") from None
        raise KubeletJoinError(f"{what}: tenant API answered {exc.status}: {_message(exc)}") from None
    except HTTPError as exc:
        raise KubeletJoinError(f"{what}: tenant API unreachable: {exc}") from None


def _message(exc) -> str:
    import json

    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _ready_condition(status: str, reason: str, message: str) -> dict:
    now = _rfc3339(_now())
    return {"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now}


def _set_ready(endpoint: str, token: str, node_name: str, status: str, reason: str, message: str) -> dict:
    from kubernetes import client

    api = _api_client(endpoint, token)
    try:
        v1 = client.CoreV1Api(api)
        body = {"status": {"conditions": [_ready_condition(status, reason, message)]}}
        node = _kubelet_call(f"node {node_name}", v1.patch_node_status, node_name, body,
                             _content_type="application/merge-patch+json", _request_timeout=10)
        return api.sanitize_for_serialization(node)
    finally:
        _close(api)


def kubelet_join(endpoint: str, bootstrap_token: str, node_name: str, labels: dict | None = None,
                 ready: bool = True, *, capacity: dict | None = None, address: str | None = None,
                 sample_pods: bool = True, timeout: float = 10) -> dict:
    """What a booting server's kubelet does in the lab: register the Node with the bootstrap token.

    The tenant API authenticates the token against its `bootstrap-token-<id>` Secret (exists,
    matches, not expired, usage-bootstrap-authentication) and refuses it with 401 otherwise:
    that is raised here as KubeletJoinError. Then the Node is created (or, on a re-join, its
    labels merged), its status set Ready (or NotReady) with `capacity` as its capacity and
    allocatable (the lab site passes the server's hardware: CPUs, memory, GPUs as nvidia.com/gpu,
    110 pods), and pods bound to it: a DaemonSet's (drain leaves it) and, with `sample_pods`, a
    ReplicaSet's and a bare one (drain evicts those; a dynamic pool's node starts without them, as
    an empty node that only the tenant's scheduler fills). Returns the Node as a dict.
    """
    from kubernetes import client

    if not BOOTSTRAP_TOKEN_RE.match(bootstrap_token or ""):
        raise KubeletJoinError("malformed bootstrap token: want <6 chars [a-z0-9]>.<16 chars [a-z0-9]>")
    node_labels = {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                   **(labels or {})}
    api = _api_client(endpoint, bootstrap_token)
    try:
        # The kubelet's TLS bootstrap: a CSR for its client certificate, made with the bootstrap token (the API
        # server records the token's identity in it: how a console tells a join token was used).
        csr = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"generateName": "node-csr-"},
               "spec": {"request": base64.b64encode(f"lab csr of {node_name}".encode()).decode(),
                        "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                        "usages": ["digital signature", "client auth"]}}
        _kubelet_call(f"node {node_name} csr", client.CertificatesV1Api(api).create_certificate_signing_request, csr,
                      _request_timeout=timeout)
        v1 = client.CoreV1Api(api)
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name, "labels": node_labels},
                "spec": {}}
        if _kubelet_call(f"node {node_name}", v1.create_node, body, tolerate=(409,), _request_timeout=timeout) is None:
            # registered before (a reboot): the kubelet updates its labels
            _kubelet_call(f"node {node_name}", v1.patch_node, node_name, {"metadata": {"labels": node_labels}},
                          _content_type="application/merge-patch+json", _request_timeout=timeout)
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **(capacity or {})}
        status = {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": address or "10.0.0.10"},
                          {"type": "Hostname", "address": node_name}],
            "nodeInfo": {"kubeletVersion": "v1.33.0", "kubeProxyVersion": "v1.33.0", "osImage": "Ubuntu 24.04 LTS",
                         "operatingSystem": "linux", "architecture": "amd64", "containerRuntimeVersion": "containerd://2.0.0",
                         "kernelVersion": "6.8.0", "machineID": "", "systemUUID": "", "bootID": str(uuid.uuid4())},
            "conditions": [_ready_condition("True", "KubeletReady", "kubelet is posting ready status") if ready else
                           _ready_condition("False", "KubeletNotReady", "container runtime network not ready")],
        }
        node = _kubelet_call(f"node {node_name}", v1.patch_node_status, node_name, {"status": status},
                             _content_type="application/merge-patch+json", _request_timeout=timeout)
        for pod in _lab_pods(node_name)[:None if sample_pods else 1]:  # 409: already there from an earlier boot
            _kubelet_call(f"pod {pod['metadata']['name']}", v1.create_namespaced_pod, pod["metadata"]["namespace"],
                          pod, tolerate=(409,), _request_timeout=timeout)
        return api.sanitize_for_serialization(node)
    finally:
        _close(api)


def _lab_pods(node_name: str) -> list[dict]:
    def pod(namespace, name, owner_kind=None, owner_name=None, image="registry.k8s.io/pause:3.10"):
        meta = {"name": name, "namespace": namespace, "labels": {"app": owner_name or name}}
        if owner_kind:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner_name,
                                        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{owner_kind}/{owner_name}")),
                                        "controller": True}]
        now = _rfc3339(_now())
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                "spec": {"nodeName": node_name, "terminationGracePeriodSeconds": 30,
                         "containers": [{"name": "main", "image": image}]},
                "status": {"phase": "Running", "startTime": now, "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}

    return [pod("kube-system", f"kube-proxy-{node_name}", "DaemonSet", "kube-proxy",
                "registry.k8s.io/kube-proxy:v1.33.0"),
            pod("default", f"trainer-{node_name}", "ReplicaSet", "trainer-6d5f7c9b8"),
            pod("default", f"notebook-{node_name}")]


def parse_join_command(command: str) -> tuple[str, str]:
    """(endpoint "host:port", token) from a vCluster or kubeadm join command, as a booting server reads it."""
    if match := re.search(r"https?://([^/\s\"']+)/node/join\?token=([a-z0-9]{6}\.[a-z0-9]{16})", command):
        return match.group(1), match.group(2)
    words = shlex.split(command)
    if "kubeadm" in words and "join" in words and "--token" in words:
        return words[words.index("join") + 1], words[words.index("--token") + 1]
    raise ValueError("not a vCluster or kubeadm join command")
