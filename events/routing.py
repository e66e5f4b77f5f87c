"""The Event log's websocket routes: the audit log page and the live lists."""
from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/events/", consumers.EventLogPageConsumer.as_asgi()),
    path("ws/lists/<str:topic>/", consumers.ListPageConsumer.as_asgi()),
]
