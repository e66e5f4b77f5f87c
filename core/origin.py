"""Where a change comes from, for the Event log's audit columns: the request being served (a middleware keeps it
for the length of the request), its client's address, and how its user is signed in (a browser session or an API
token, named by prefix and scope). Outside a request (a worker, beat, manage.py) there is none."""
from contextvars import ContextVar

from .client_address import client_ip

_request: ContextVar = ContextVar("request", default=None)


class RequestOriginMiddleware:
    """Keeps the request where the Event log can ask for it (after authentication: DRF's token authentication
    comes later, in the view, and writes its user and token back onto this same request)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        mark = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(mark)


def current_request():
    return _request.get()


def request_origin(request) -> dict:
    """{"address", "via", "user"} of a request: via is "session", "token <prefix> (<scope>)", or "" when no one
    is signed in. The token is duck-typed (access.models.ApiToken lies above core)."""
    user = getattr(request, "user", None)
    token = getattr(request, "auth", None)
    if token is not None and hasattr(token, "prefix"):
        via = f"token {token.prefix} ({'read-only' if token.read_only else 'read-write'})"
    elif user is not None and user.is_authenticated:
        via = "session"
    else:
        via = ""
    return {"address": client_ip(request) or None, "via": via, "user": user}
