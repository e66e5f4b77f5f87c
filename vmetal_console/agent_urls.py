"""The agent listener's URLs: the agent protocol, the boot path (iPXE scripts, virtual-media images) and the
OS images, and nothing else. Served by `manage.py agent-listener` (vmetal_console/agent_wsgi.py) on an address
of the provisioning network; the public listener (vmetal_console/urls.py) has none of the agent paths."""
from hosts.urls import agent_urlpatterns, image_urlpatterns

urlpatterns = [*agent_urlpatterns, *image_urlpatterns]

# Its own error answers (JSON), not the console's pages.
handler400 = "hosts.listener.bad_request"
handler403 = "hosts.listener.forbidden"
handler404 = "hosts.listener.not_found"
handler500 = "hosts.listener.server_error"
