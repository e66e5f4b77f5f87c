"""How much of a request the console reads, and how much work one number may ask for: the body's size, refused
before a byte of it is read; the nesting of JSON bodies (YAML's limits are manifests.source's: it reads every
manifest and YAML form field); and every count of nodes that a tenant or an admin sets (a pool's quantity, its
limits and group size, a NodeType's warm hosts), at most POOL_MAX_NODES.

Django applies DATA_UPLOAD_MAX_MEMORY_SIZE only where it reads `request.body` or a form itself; DRF's parsers
read the request's stream directly, so without the middleware below a JSON body is read whole, whatever its
size. Under ASGI Django first copies the body into a temporary file: `BodyLimit` wraps the ASGI application so
that a body announced too large is refused before that, and a chunked one (no Content-Length) is stopped as
soon as it passes the limit."""
import json

from django.conf import settings
from django.core.exceptions import ValidationError
from django.http import JsonResponse
from rest_framework import exceptions, parsers

MAX_JSON_DEPTH = 100  # as manifests.source.MAX_DEPTH for YAML


def too_large_message(size: int | None) -> str:
    limit = settings.MAX_REQUEST_BODY
    said = f" ({size} bytes)" if size is not None else ""
    return f"the request body is too large{said}: at most {limit} bytes (MAX_REQUEST_BODY_MB)"


def content_length(value) -> int | None:
    try:
        return int(value) if value not in (None, "", b"") else None
    except (TypeError, ValueError):
        return None  # as Django: not a number is no length


class RequestBodyLimitMiddleware:
    """413 for a request whose Content-Length passes MAX_REQUEST_BODY, before any view, parser or form
    reads the body; 400 for a NUL character in the Django admin's query (its changelist filters would hand it
    to PostgreSQL, which refuses it with a server error; the API and the pages name the field themselves)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        size = content_length(request.META.get("CONTENT_LENGTH"))
        if size is not None and size > settings.MAX_REQUEST_BODY:
            return JsonResponse({"detail": too_large_message(size)}, status=413)
        if request.path.startswith("/admin/"):
            bad = [k for k, values in request.GET.lists() if "\x00" in k or any("\x00" in v for v in values)]
            if bad:
                return JsonResponse({bad[0].replace("\x00", "?"): ["a NUL character is not allowed"]}, status=400)
        return self.get_response(request)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI: the same limit before Django's handler spools the body: at once for a Content-Length over it, and,
    for a chunked body, as soon as what was received passes it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = settings.MAX_REQUEST_BODY
        size = content_length(dict(scope.get("headers") or ()).get(b"content-length"))
        if size is not None and size > limit:
            return await self._refuse(send, size)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send, None)  # Django reads the whole body before it answers: nothing was sent

    async def _refuse(self, send, size):
        body = json.dumps({"detail": too_large_message(size)}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class TooDeep(ValueError):
    pass


def check_depth(value, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise TooDeep when lists and objects nest deeper than `limit` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                raise TooDeep(f"nested deeper than {limit} levels")
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))


def nul_path(value) -> str | None:
    """Where a NUL character is in decoded JSON (a key or a string), as `a.b[2]`; None when nowhere. PostgreSQL
    stores no NUL in text or jsonb."""
    stack = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return path or "the body"
        if isinstance(item, dict):
            for key, child in item.items():
                if "\x00" in key:
                    return f"a key in {path or 'the body'}"
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def json_loads(raw: bytes | str):
    """json.loads within MAX_JSON_DEPTH: deeper is TooDeep (a ValueError), never a RecursionError."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise TooDeep(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    check_depth(value)
    return value


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with a body nested deeper than MAX_JSON_DEPTH a 400 rather than a RecursionError
    (a 500) here or in whatever walks the data later."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
        try:
            check_depth(data)
        except TooDeep as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        return data


def node_count_error(value, what: str = "") -> str:
    """Why `value` nodes are too many ("" when they are not): every count that makes the console work per node
    (claims to create, hosts to keep warm) stays within POOL_MAX_NODES, so no one number can fill a worker's
    memory or hold a lock for long. The API, forms, the admin and `apply` all ask here."""
    limit = settings.POOL_MAX_NODES
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= limit:
        return ""
    shown = int(value) if isinstance(value, float) and value.is_integer() else value
    return f"{what + ': ' if what else ''}at most {limit} nodes (POOL_MAX_NODES), not {shown}"


def check_node_count(value, what: str = "") -> None:
    """ValidationError (node_count_error's message) when `value` nodes pass POOL_MAX_NODES."""
    message = node_count_error(value, what)
    if message:
        raise ValidationError(message)
