"""The event log's live views: websocket routes for the audit page and the live lists."""
from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/events/", consumers.EventLogPageConsumer.as_asgi()),
    path("ws/lists/<str:topic>/", consumers.ListPageConsumer.as_asgi()),
]
