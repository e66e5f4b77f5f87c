"""The public listener's URLs: the admin, the API, the hosts' pages and the console's pages."""
from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from vmetal_console.metrics import MetricsView

# The admin's own words: the product's name, not Django's.
admin.site.site_header = "vMetal Console administration"
admin.site.site_title = "vMetal Console admin"
admin.site.index_title = "Objects"

urlpatterns = [
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico where a page names none (the admin's, JSON answers): the console's icon.
    path("favicon.ico", RedirectView.as_view(url=static("console/favicon.svg"), permanent=True)),
    path("api/", include("vmetal_console.api_urls")),
    path("metrics", MetricsView.as_view(), name="metrics"),  # Prometheus (vmetal_console/metrics.py)
    path("", include("hosts.urls")),
    path("", include("vmetal_console.console_urls")),
]

# The console's refusals are its own pages, with the navigation of the user's role (core.views).
handler403 = "core.views.permission_denied"
handler404 = "core.views.page_not_found"
handler500 = "core.views.server_error"  # 503 while the database or Redis is away (core/outage.py)
