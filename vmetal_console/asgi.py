"""ASGI entry point: Django's HTTP views and the console's live views (Channels websockets).

`daphne vmetal_console.asgi:application` serves both; so does `manage.py runserver` once daphne is an
installed app. The vendored front-end files in static/ are served by the same process (a handful of
files, no CDN), so the console needs no separate web server."""
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vmetal_console.settings")
django_asgi_app = get_asgi_application()  # sets Django up before the consumers import models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from access.sessions import IdleSessionsRefused  # noqa: E402
from claims.routing import websocket_urlpatterns as claim_routes  # noqa: E402
from events.routing import websocket_urlpatterns as event_routes  # noqa: E402
from hosts.routing import websocket_urlpatterns as host_routes  # noqa: E402
from console.routing import websocket_urlpatterns as pool_routes  # noqa: E402
from core.limits import BodyLimit  # noqa: E402

websocket_urlpatterns = [*host_routes, *claim_routes, *pool_routes, *event_routes]

application = ProtocolTypeRouter({
    "http": BodyLimit(ASGIStaticFilesHandler(django_asgi_app)),  # a body over MAX_REQUEST_BODY: 413, unread
    # The session cookie names the user (none for an idle session); each consumer asks core.scoping before it
    # joins a group.
    "websocket": AllowedHostsOriginValidator(
        AuthMiddlewareStack(IdleSessionsRefused(URLRouter(websocket_urlpatterns)))),
})
