"""The web console's pages. Live views: the apps' routing.py, under /ws/."""
from django.contrib.auth import views as auth_views
from django.urls import path, register_converter
from django.urls.converters import StringConverter

from claims import views as claims
from events import views as events
from hosts import views as hosts
from console import fleet_actions
from console import views as pools


class NameConverter(StringConverter):
    """An object's name in a path: `str` without NUL, which no name has and PostgreSQL refuses in a query (a 404,
    not a 500)."""

    regex = "[^/\x00]+"


register_converter(NameConverter, "name")

urlpatterns = [
    path("", pools.home, name="home"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # hosts
    path("hosts/", hosts.fleet, name="fleet"),
    path("fleet/bulk/", fleet_actions.fleet_bulk, name="fleet-bulk"),
    path("fleet/export.csv", fleet_actions.fleet_export, name="fleet-export"),
    path("repair/", hosts.repair, name="repair"),
    path("hosts/<name:name>/", hosts.host_detail, name="host"),
    path("hosts/<name:name>/actions/<slug:action>/", hosts.host_action, name="host-action"),
    path("health-runs/<int:pk>/", hosts.health_run_detail, name="health-run"),
    # claims
    path("claims/", claims.claim_list, name="claims"),
    path("timing/", claims.timing, name="timing"),
    path("claims/<name:name>/", claims.claim_detail, name="claim"),
    # tenants and the catalogue
    path("tenants/", pools.tenant_list, name="tenants"),
    path("tenants/<name:name>/", pools.tenant_page, name="tenant"),
    path("tenants/<name:name>/pools/<name:pool>/", pools.pool_page, name="pool"),
    path("tenants/<name:name>/pools/<name:pool>/quantity/", pools.pool_quantity, name="pool-quantity"),
    path("tenants/<name:name>/join/", pools.join_command, name="tenant-join"),
    path("tenants/<name:name>/api-check/", pools.tenant_api_check, name="tenant-api-check"),
    path("providers/", pools.provider_list, name="providers"),
    path("node-types/", pools.node_type_list, name="node-types"),
    path("environments/", pools.environment_list, name="environments"),
    path("images/", pools.image_list, name="images"),
    path("catalogue/<slug:kind>/new/", pools.catalogue_edit, name="catalogue-create"),
    path("catalogue/<slug:kind>/<name:key>/edit/", pools.catalogue_edit, name="catalogue-edit"),
    path("apply/", pools.apply_page, name="apply"),
    # the Event log
    path("events/", events.event_log, name="events"),
]
