from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/tenants/<int:tenant_id>/", consumers.TenantConsumer.as_asgi()),
    path("ws/pools/<int:pool_id>/", consumers.PoolConsumer.as_asgi()),
]
