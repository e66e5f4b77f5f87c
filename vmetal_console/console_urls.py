"""The web console's pages: each app's urls, signing in (password or single sign-on) and the fleet board. Live views: the apps' routing.py,
under /ws/."""
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import include, path

from access import views as access
import core.converters  # noqa: F401 (registers the <name:...> converter)
from events import views as events
from hosts import views as hosts

urlpatterns = [
    path("login/", access.SignInView.as_view(), name="login"),
    path("login/again/", access.sign_in_again, name="sign-in-again"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # single sign-on: /oidc/authenticate/ sends the browser to the provider, /oidc/callback/ takes its answer
    *([path("oidc/", include("mozilla_django_oidc.urls"))] if settings.OIDC_ENABLED else []),
    # hosts
    path("hosts/", hosts.fleet, name="fleet"),
    path("repair/", hosts.repair, name="repair"),
    path("hosts/<name:name>/", hosts.host_detail, name="host"),
    path("hosts/<name:name>/actions/<slug:action>/", hosts.host_action, name="host-action"),
    path("hosts/<name:name>/firmware-update/", hosts.host_firmware_update, name="host-firmware-update"),
    path("health-runs/<int:pk>/", hosts.health_run_detail, name="health-run"),
    # claims
    path("", include("claims.urls")),
    # the home page, the fleet board's actions, tenants and their pools, the catalogue, apply
    path("", include("console.urls")),
    # the Event log
    path("events/", events.event_log, name="events"),
]
