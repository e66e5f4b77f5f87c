"""The machines app's URLs under /api/v1/: OpenTofu's state backend and the admin API over its states."""
from django.urls import re_path
from rest_framework.routers import SimpleRouter

from .api.views import TofuStateViewSet
from .tofu.http import state_view

router = SimpleRouter(trailing_slash="/?")
router.register("tofu-states", TofuStateViewSet, basename="tofu-state")

urlpatterns = [
    # No trailing slash: OpenTofu requests the address exactly as configured (machines/tofu/runner.py).
    re_path(r"^tofu/state/(?P<workspace>[A-Za-z0-9._-]{1,253})$", state_view, name="tofu-state-backend"),
    *router.urls,
]
