"""The web console's pages: each app's urls, the login and the fleet board. Live views: the apps' routing.py,
under /ws/."""
from django.contrib.auth import views as auth_views
from django.urls import include, path

import core.converters  # noqa: F401 (registers the <name:...> converter)
from events import views as events
from hosts import views as hosts

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # hosts
    path("hosts/", hosts.fleet, name="fleet"),
    path("repair/", hosts.repair, name="repair"),
    path("hosts/<name:name>/", hosts.host_detail, name="host"),
    path("hosts/<name:name>/actions/<slug:action>/", hosts.host_action, name="host-action"),
    path("health-runs/<int:pk>/", hosts.health_run_detail, name="health-run"),
    # claims
    path("", include("claims.urls")),
    # the home page, the fleet board's actions, tenants and their pools, the catalogue, apply
    path("", include("console.urls")),
    # the Event log
    path("events/", events.event_log, name="events"),
]
