"""The console's own pages: home, the fleet board's bulk actions, tenants and their pools, the catalogue and
YAML apply."""
from django.urls import path

import core.converters  # noqa: F401 (registers the <name:...> converter)

from . import fleet_actions, host_pages, provider_pages, tokens, views

urlpatterns = [
    path("", views.home, name="home"),
    path("fleet/bulk/", fleet_actions.fleet_bulk, name="fleet-bulk"),
    path("fleet/export.csv", fleet_actions.fleet_export, name="fleet-export"),
    path("hosts/<name:name>/edit/", host_pages.host_edit, name="host-edit"),
    path("tenants/", views.tenant_list, name="tenants"),
    path("tenants/<name:name>/", views.tenant_page, name="tenant"),
    path("tenants/<name:name>/pools/<name:pool>/", views.pool_page, name="pool"),
    path("tenants/<name:name>/pools/<name:pool>/quantity/", views.pool_quantity, name="pool-quantity"),
    path("tenants/<name:name>/join/", views.join_command, name="tenant-join"),
    path("tenants/<name:name>/join-tokens/", views.join_tokens, name="tenant-join-tokens"),
    path("tenants/<name:name>/join-tokens/<int:pk>/revoke/", views.join_token_revoke, name="tenant-join-token-revoke"),
    path("tenants/<name:name>/api-check/", views.tenant_api_check, name="tenant-api-check"),
    path("providers/", views.provider_list, name="providers"),
    path("providers/<name:name>/", provider_pages.provider_detail, name="provider"),
    path("providers/<name:name>/workspaces/<name:workspace>/release-lock/", provider_pages.provider_release_lock,
         name="provider-release-lock"),
    path("node-types/", views.node_type_list, name="node-types"),
    path("environments/", views.environment_list, name="environments"),
    path("images/", views.image_list, name="images"),
    path("catalogue/<slug:kind>/new/", views.catalogue_edit, name="catalogue-create"),
    path("catalogue/<slug:kind>/<name:key>/edit/", views.catalogue_edit, name="catalogue-edit"),
    path("catalogue/<slug:kind>/<name:namespace>/<name:key>/edit/", views.catalogue_edit,
         name="catalogue-edit-namespaced"),  # NodeEnvironments: a name is unique in its namespace
    path("apply/", views.apply_page, name="apply"),
    path("tokens/", tokens.token_list, name="tokens"),
    path("tokens/<slug:prefix>/revoke/", tokens.token_revoke_view, name="token-revoke"),
]
