from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("vmetal_console.api_urls")),
    path("", include("hosts.urls")),
    path("", include("vmetal_console.console_urls")),
]
