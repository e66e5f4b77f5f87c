from django.urls import path

from . import agent_api

urlpatterns = [
    path("agent/lookup", agent_api.lookup, name="agent-lookup"),
    path("agent/heartbeat", agent_api.heartbeat, name="agent-heartbeat"),
    path("agent/result", agent_api.result, name="agent-result"),
]
