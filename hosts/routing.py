"""The websocket routes of the host pages: the fleet's and a host's live updates."""
from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/fleet/", consumers.FleetConsumer.as_asgi()),
    path("ws/hosts/<int:host_id>/", consumers.HostConsumer.as_asgi()),
]
