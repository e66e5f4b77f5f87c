"""The web console's pages (issue: the console). Live views: the apps' routing.py, under /ws/."""
from django.contrib.auth import views as auth_views
from django.urls import path

from claims import views as claims
from events import views as events
from hosts import views as hosts
from pools import views as pools

urlpatterns = [
    path("", events.home, name="home"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # hosts
    path("hosts/", hosts.fleet, name="fleet"),
    path("repair/", hosts.repair, name="repair"),
    path("hosts/<str:name>/", hosts.host_detail, name="host"),
    path("hosts/<str:name>/actions/<slug:action>/", hosts.host_action, name="host-action"),
    path("health-runs/<int:pk>/", hosts.health_run_detail, name="health-run"),
    # claims
    path("claims/", claims.claim_list, name="claims"),
    path("timing/", claims.timing, name="timing"),
    path("claims/<str:name>/", claims.claim_detail, name="claim"),
    # tenants and the catalogue
    path("tenants/", pools.tenant_list, name="tenants"),
    path("tenants/<str:name>/", pools.tenant_page, name="tenant"),
    path("tenants/<str:name>/pools/<str:pool>/quantity/", pools.pool_quantity, name="pool-quantity"),
    path("tenants/<str:name>/join/", pools.join_command, name="tenant-join"),
    path("providers/", pools.provider_list, name="providers"),
    path("node-types/", pools.node_type_list, name="node-types"),
    path("environments/", pools.environment_list, name="environments"),
    path("images/", pools.image_list, name="images"),
    path("catalogue/<slug:kind>/new/", pools.catalogue_edit, name="catalogue-create"),
    path("catalogue/<slug:kind>/<str:key>/edit/", pools.catalogue_edit, name="catalogue-edit"),
    path("apply/", pools.apply_page, name="apply"),
    # the Event log
    path("events/", events.event_log, name="events"),
]
