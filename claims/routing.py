from django.urls import path

from . import consumers

websocket_urlpatterns = [
    path("ws/claims/", consumers.ClaimListConsumer.as_asgi()),
    path("ws/claims/<int:claim_id>/", consumers.ClaimConsumer.as_asgi()),
]
