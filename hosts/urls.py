"""The agent listener's paths: the agent protocol, the boot path and the images; and the erase certificates."""
from django.urls import path

from . import certificate_views
from .boot import images
from .protocol import api as agent_api

# The agent listener's paths (vmetal_console/agent_urls.py): the agent protocol, the boot path and the images.
# Never on the public listener.
agent_urlpatterns = [
    path("agent/lookup", agent_api.lookup, name="agent-lookup"),
    path("agent/heartbeat", agent_api.heartbeat, name="agent-heartbeat"),
    path("agent/result", agent_api.result, name="agent-result"),
    path("boot/<str:mac>.ipxe", agent_api.boot_script, name="boot-script"),
    # Virtual media: only by the one-time URL the console gave the BMC; never by MAC (that path answers 404).
    path("boot/media/<str:token>.iso", agent_api.boot_media, name="boot-media"),
    path("boot/<str:mac>.iso", agent_api.boot_media_by_mac, name="boot-media-by-mac"),
]

image_urlpatterns = [
    path("images/SHA256SUMS", images.checksums, {"kind": "SHA256SUMS"}),
    path("images/SHA512SUMS", images.checksums, {"kind": "SHA512SUMS"}),
    path("images/MD5SUMS", images.checksums, {"kind": "MD5SUMS"}),
    path("images/<str:filename>", images.image, name="image"),
    path("images/agent/<str:filename>", images.image, {"folder": "agent"}, name="agent-image"),
]

urlpatterns = [
    *image_urlpatterns,
    # erase certificates: the signed file and a printable page; the public keys that verify them (no login)
    path("certificates/signing-keys.pem", certificate_views.signing_keys, name="certificate-signing-keys"),
    path("certificates/<int:pk>.json", certificate_views.certificate_json, name="certificate-json"),
    path("certificates/<int:pk>/", certificate_views.certificate_page, name="certificate"),
]
