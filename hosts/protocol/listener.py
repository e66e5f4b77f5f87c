"""The agent listener: its WSGI handler on settings.AGENT_URLCONF, its own error answers, and the server
that faces the provisioning network."""
# The agent listener: its WSGI handler (every request resolves against settings.AGENT_URLCONF: the agent protocol,
# the boot path and the OS images, never the public console's URLs), its own error answers, and the server that
# faces the provisioning network (waitress, with bounds: `serve`).
from urllib.parse import urlsplit

from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.http import JsonResponse

from core.outage import outage_now, unavailable


class AgentListener(WSGIHandler):
    def get_response(self, request):
        request.urlconf = settings.AGENT_URLCONF
        return super().get_response(request)


# Error answers of the agent listener (vmetal_console/agent_urls.py): JSON as the agent protocol's own, never the
# console's templates (they link to pages this listener does not have).
def bad_request(request, exception=None):
    return JsonResponse({"error": "bad request"}, status=400)


def forbidden(request, exception=None):
    return JsonResponse({"error": "forbidden"}, status=403)


def not_found(request, exception=None):
    return JsonResponse({"error": "not found"}, status=404)


def server_error(request):
    if outage_now():  # the database or Redis restarting: the agents back off and try again
        return unavailable(request, json=True)
    return JsonResponse({"error": "server error"}, status=500)


def listener_hosts() -> list[str]:
    """The names the servers and the console use for this listener (AGENT_LISTEN, AGENT_BOOT_URL,
    AGENT_BOOT_CHECK_URL): accepted as Host besides ALLOWED_HOSTS, which name the public console."""
    names = {settings.AGENT_LISTEN.rpartition(":")[0]}
    for url in (settings.AGENT_BOOT_URL, settings.AGENT_BOOT_CHECK_URL):
        if url:
            names.add(urlsplit(url).hostname or "")
    names = {f"[{n}]" if ":" in n and not n.startswith("[") else n for n in names if n}
    return sorted(names)


def bind_mismatch(bind: str, *, boot_url_set: bool) -> str:
    """Why the listener must not start on `bind`, or ''. The servers reach it at AGENT_BOOT_URL, which every
    process of the console uses (the workers name it in virtual-media URLs and preflight); unset, it is made from
    AGENT_LISTEN, so a listener moved by --bind alone would leave every boot pointed at the old address."""
    boot = urlsplit(settings.AGENT_BOOT_URL)
    host, _, port = bind.rpartition(":")
    if not boot_url_set and bind != settings.AGENT_LISTEN:
        return (f"--bind {bind} is not AGENT_LISTEN ({settings.AGENT_LISTEN}), from which the servers' boot URL "
                f"({settings.AGENT_BOOT_URL}) is made for every process of the console: set AGENT_LISTEN={bind} for "
                f"all of them (or AGENT_BOOT_URL to where the servers reach this listener) instead of --bind alone")
    # A port of its own in AGENT_BOOT_URL on the bind's very address is this listener's old port (no port: a proxy
    # on 80 may well forward to it).
    if boot.hostname == host.strip("[]") and boot.port is not None and boot.port != int(port):
        return (f"AGENT_BOOT_URL ({settings.AGENT_BOOT_URL}) names this listener's address on port {boot.port}, "
                f"but it would listen on {port}: the servers' boots would go to the old port")
    return ""


def application() -> AgentListener:
    """The listener's WSGI application, in a process that serves nothing else (manage.py agent-listener,
    vmetal_console/agent_wsgi.py): its own names join ALLOWED_HOSTS there, and its URLs are the process's root
    URLconf, so an error raised before a request's URL is resolved (a Host header not allowed) still gets the
    listener's own answer."""
    settings.ROOT_URLCONF = settings.AGENT_URLCONF
    extra = [n for n in listener_hosts() if n not in settings.ALLOWED_HOSTS]
    if extra and "*" not in settings.ALLOWED_HOSTS:
        settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, *extra]
    return AgentListener()


def serve(*, host: str, port: int) -> None:
    """Serve the listener with waitress until the process ends. Requests are read whole by one event loop before
    a thread runs them, so a half-sent request holds a connection, never a thread; connections are bounded
    (AGENT_LISTENER_CONNECTIONS; past it new ones wait in the kernel's backlog), and one silent for
    AGENT_LISTENER_IDLE_S is closed, except while its request runs (a warm host's held ask). The threads
    (AGENT_LISTENER_THREADS) bound the requests running at once, held asks included."""
    import waitress  # the listener's server, loaded by the process that serves only

    server = waitress.create_server(
        application(), host=host, port=port,
        threads=settings.AGENT_LISTENER_THREADS,
        connection_limit=settings.AGENT_LISTENER_CONNECTIONS,
        backlog=settings.AGENT_LISTENER_BACKLOG,
        channel_timeout=settings.AGENT_LISTENER_IDLE_S,
        cleanup_interval=max(1, min(30, settings.AGENT_LISTENER_IDLE_S // 2)),
        max_request_header_size=64 * 1024,
        max_request_body_size=settings.MAX_REQUEST_BODY,
        asyncore_use_poll=True,  # select() cannot watch more than 1024 connections
        clear_untrusted_proxy_headers=True,
        ident="vmetal-agent-listener",
    )
    server.run()
