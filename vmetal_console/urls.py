"""The public listener's URLs: the admin, the API, the hosts' pages and the console's pages."""
from django.contrib import admin
from django.urls import include, path

from vmetal_console.metrics import MetricsView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("vmetal_console.api_urls")),
    path("metrics", MetricsView.as_view(), name="metrics"),  # Prometheus (vmetal_console/metrics.py)
    path("", include("hosts.urls")),
    path("", include("vmetal_console.console_urls")),
]

# The console's refusals are its own pages, with the navigation of the user's role (core.views).
handler403 = "core.views.permission_denied"
handler404 = "core.views.page_not_found"
