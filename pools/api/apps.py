"""The API's app config: swaps DRF's token admin (which lists whole keys) for one that shows key prefixes."""
from django.apps import AppConfig
from django.contrib import admin


class MaskedTokenAdmin(admin.ModelAdmin):
    """Tokens in the Django admin: who has one and since when, never the key. `Token.__str__` is the key, so
    there are no object pages (change, delete, history: they print it); revoke with DELETE /api/v1/tokens/<prefix>/."""

    list_display = ("prefix", "user", "created")
    list_display_links = None
    search_fields = ("user__username",)
    ordering = ("user__username",)
    actions = None

    @admin.display(description="key")
    def prefix(self, obj) -> str:
        return obj.key[:8] + "…"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return obj is None and super().has_view_permission(request)


class ApiConfig(AppConfig):
    name = "pools.api"
    label = "vmetal_api"
    verbose_name = "REST API"

    def ready(self):
        from rest_framework.authtoken.models import TokenProxy

        if admin.site.is_registered(TokenProxy):
            admin.site.unregister(TokenProxy)
        admin.site.register(TokenProxy, MaskedTokenAdmin)
