"""The console's live views: websocket routes for the tenant and pool pages."""
from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/tenants/<int:tenant_id>/", consumers.TenantConsumer.as_asgi()),
    path("ws/pools/<int:pool_id>/", consumers.PoolConsumer.as_asgi()),
]
