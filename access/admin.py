"""API tokens in the Django admin: whose, by prefix and name, their scope, expiry and last use (the key is not stored, so never shown).
Deleting one revokes it through the service, on the record; new ones come from the API or `manage.py token`."""
from django.contrib import admin
from django.db import transaction

from events.admin import admin_actor

from .models import ApiToken
from .services import token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "read_only", "created", "expires_at", "last_used_at")
    list_filter = ("read_only",)
    search_fields = ("prefix", "user__username", "name")
    ordering = ("user__username", "name")
    fields = readonly_fields = ("prefix", "user", "name", "read_only", "tenants", "created", "expires_at",
                                "last_used_at")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        token_revoke(token=obj, actor=admin_actor(request))

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for token in queryset.select_related("user"):
                token_revoke(token=token, actor=admin_actor(request))
