"""The agent listener's WSGI handler: every request resolves against settings.AGENT_URLCONF (the agent
protocol, the boot path and the OS images), never against the public console's URLs."""
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler


class AgentListener(WSGIHandler):
    def get_response(self, request):
        request.urlconf = settings.AGENT_URLCONF
        return super().get_response(request)
