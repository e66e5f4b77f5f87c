"""The agent listener's URLs: the agent protocol, the boot path (iPXE scripts, virtual-media images) and the
OS images, and nothing else. Served by `manage.py agent-listener` (vmetal_console/agent_wsgi.py) on an address
of the provisioning network; the public listener (vmetal_console/urls.py) has none of the agent paths."""
from hosts.urls import agent_urlpatterns, image_urlpatterns

urlpatterns = [*agent_urlpatterns, *image_urlpatterns]

# Its own error answers (JSON), not the console's pages.
handler400 = "hosts.protocol.listener.bad_request"
handler403 = "hosts.protocol.listener.forbidden"
handler404 = "hosts.protocol.listener.not_found"
handler500 = "hosts.protocol.listener.server_error"
