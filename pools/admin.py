"""Admin for the catalogue, tenants and pools, users and groups: data fixes, each recorded in the Event log."""
# Admin for providers, node types, environments, images, tenants and pools: data fixes, each
# recorded in the Event log; pools are created and changed only through pools.services (pool_create,
# pool_update), as the API and the console change them.
# Also users and groups (staff, superuser, the auditors group) and who belongs to which tenant: the roles
# of core.scoping, so every change to them is recorded too.
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, Q
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html_join

from core.limits import check_node_count
from events.admin import (
    ReadOnlyAdmin,
    RecordedAdmin,
    ServiceDeleteMixin,
    admin_actor,
    event_log_link,
)
from events.choices import EventKind, ObjectType
from events.services import event_record

from .capacity import capacity_shown
from .choices import PoolKind
from .models import (
    FabricPartition,
    NodeEnvironment,
    NodePool,
    NodeProvider,
    NodeType,
    OSImage,
    Tenant,
    TenantMembership,
)
from .services import (
    StaleVersion,
    membership_add,
    membership_remove,
    node_type_delete,
    node_type_use,
    pool_create,
    pool_delete,
    pool_update,
    tenant_check_quota,
    tenant_delete,
    tenant_quota_warning,
    tenant_static_quantities,
)

STAMPS = ("created_at", "updated_at")


@admin.register(NodeProvider)
class NodeProviderAdmin(RecordedAdmin):
    event_object_type = ObjectType.NODEPROVIDER
    list_display = ("name", "kind", "display_name", "node_types", "updated_at")
    list_filter = ("kind",)
    search_fields = ("name", "display_name")
    readonly_fields = STAMPS

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(node_type_count=Count("node_types"))

    @admin.display(description="node types", ordering="node_type_count")
    def node_types(self, provider):
        return provider.node_type_count


class NodeTypeChangeList(ChangeList):
    def get_results(self, request):
        super().get_results(request)
        # Capacity for the whole page in one query (pools.capacity), not one per row.
        node_types = list(self.result_list)
        capacity = capacity_shown(node_types)
        for node_type in node_types:
            node_type.capacity = capacity[node_type.pk]


@admin.register(NodeType)
class NodeTypeAdmin(ServiceDeleteMixin, RecordedAdmin):
    event_object_type = ObjectType.NODETYPE
    list_display = ("name", "provider", "display_name", "zone", "resources_text", "cost_text", "total",
                    "available", "provisioned")
    list_filter = ("provider", "zone", "declared_in_provider")
    search_fields = ("name", "display_name", "zone", "region")
    list_select_related = ("provider",)
    readonly_fields = ("capacity_text", "cost_text", *STAMPS)

    def get_changelist(self, request, **kwargs):
        return NodeTypeChangeList

    # Deleted through pools.services.node_type_delete (ServiceDeleteMixin): not while a claim uses it.
    def delete_refusal(self, obj) -> str:
        return node_type_use(obj)

    def delete_through_service(self, request, obj) -> None:
        node_type_delete(node_type=obj, actor=admin_actor(request))

    @staticmethod
    def _capacity(node_type) -> dict:
        if not hasattr(node_type, "capacity"):  # the change page: one type
            node_type.capacity = capacity_shown([node_type])[node_type.pk]
        return node_type.capacity

    @admin.display(description="total")
    def total(self, node_type):
        return self._capacity(node_type)["total"]

    @admin.display(description="available")
    def available(self, node_type):
        return self._capacity(node_type)["available"]

    @admin.display(description="provisioned")
    def provisioned(self, node_type):
        return self._capacity(node_type)["provisioned"]

    @admin.display(description="capacity")
    def capacity_text(self, node_type):
        if node_type.pk is None:
            return "-"
        c = self._capacity(node_type)
        if c.get("machines"):  # an external provider's type: its kind's capacity, its live machines
            limit = "no limit" if c["total"] is None else f"{c['total']} machine(s)"
            return f"{limit}, {c['claimed']} claimed" + (f" (provider: {c['provider_error']})" if c["provider_error"] else "")
        # Every column of the capacity vocabulary that counts a host (they add up to the total).
        parts = [f"{n} {name.replace('_', ' ')}" for name, n in c.items() if name != "total" and n]
        return f"{c['total']} host(s) match" + (f": {', '.join(parts)}" if parts else "")

    @admin.display(description="resources")
    def resources_text(self, node_type):
        return ", ".join(f"{k} {v}" for k, v in node_type.resources.items())

    @admin.display(description="cost", ordering="cost")
    def cost_text(self, node_type):
        try:
            cost = node_type.effective_cost()
        except ValueError:  # a resource that is not a quantity: clean() says so on save
            return "-"
        return str(cost) if node_type.cost is not None else f"{cost} (default)"


@admin.register(NodeEnvironment)
class NodeEnvironmentAdmin(RecordedAdmin):
    event_object_type = ObjectType.NODEENVIRONMENT
    list_display = ("name", "namespace", "provider", "tenant", "network_text", "updated_at")
    list_filter = ("provider", "namespace")
    search_fields = ("name", "namespace", "display_name", "tenant__name")
    list_select_related = ("provider", "tenant")
    readonly_fields = STAMPS

    def event_links(self, env):
        return {"tenant": env.tenant}

    @admin.display(description="network")
    def network_text(self, env):
        return env.properties.get(NodeEnvironment.CIDR, "")


@admin.register(OSImage)
class OSImageAdmin(RecordedAdmin):
    event_object_type = ObjectType.OSIMAGE
    list_display = ("name", "display_name", "format", "checksum_type", "size_bytes", "url", "updated_at")
    list_filter = ("format", "checksum_type")
    search_fields = ("name", "display_name", "url", "checksum")
    readonly_fields = STAMPS


class TenantForm(forms.ModelForm):
    new_kubeconfig = forms.CharField(
        required=False, strip=False, label="New kubeconfig",
        widget=forms.Textarea(attrs={"rows": 6, "autocomplete": "off", "spellcheck": "false"}),
        help_text="Paste a kubeconfig to replace the stored one; leave empty to keep it. "
                  "The stored kubeconfig is never shown.")

    class Meta:
        model = Tenant
        exclude = ("kubeconfig",)


class TenantMembershipInline(admin.TabularInline):
    """Who belongs to which tenant and in which role (tenant admin or viewer), on the tenant's page and on the
    user's: rows are added or deleted (through pools.services), never edited; a new role is a new row."""

    model = TenantMembership
    extra = 0
    readonly_fields = ("created_at",)

    def has_change_permission(self, request, obj=None):
        return False


class MembershipsRecorded:
    """Saves the TenantMembershipInline through membership_add / membership_remove (recorded)."""

    def save_formset(self, request, form, formset, change):
        if formset.model is not TenantMembership:
            return super().save_formset(request, form, formset, change)
        formset.save(commit=False)  # sorts the rows into new_objects and deleted_objects; the services write
        actor = admin_actor(request)
        for membership in formset.deleted_objects:
            membership_remove(tenant=membership.tenant, user=membership.user, actor=actor)
        for membership in formset.new_objects:
            membership_add(tenant=membership.tenant, user=membership.user, actor=actor, role=membership.role)


@admin.register(Tenant)
class TenantAdmin(MembershipsRecorded, RecordedAdmin):
    form = TenantForm
    inlines = (TenantMembershipInline,)
    event_object_type = ObjectType.TENANT
    event_self_link = "tenant"
    exclude = ("kubeconfig",)
    # claims.admin adds the tenant's live claims to this list
    list_display = ("name", "namespace", "display_name", "api_endpoint", "join_mode", "quota_nodes", "pool_count",
                    "private_nodes_enabled", "has_kubeconfig")
    list_filter = ("join_mode", "private_nodes_enabled", "namespace")
    search_fields = ("name", "display_name", "namespace", "api_endpoint")
    readonly_fields = ("kubeconfig_status", "pools_text", "event_log", *STAMPS)
    fieldsets = (
        (None, {"fields": ("name", "namespace", "display_name", "api_endpoint", "join_mode", "quota_nodes",
                           "private_nodes_enabled", "provider_properties")}),
        ("Kubeconfig", {"fields": ("kubeconfig_status", "new_kubeconfig")}),
        ("Related", {"fields": ("pools_text", "event_log", *STAMPS)}),
    )

    def get_queryset(self, request):
        return (super().get_queryset(request).defer("kubeconfig")
                .annotate(pool_total=Count("pools", distinct=True),
                          kubeconfig_empty=ExpressionWrapper(Q(kubeconfig=""), output_field=BooleanField())))

    def get_deleted_objects(self, objs, request):
        # Its claims do not block the deletion, nor need a permission of their own (claims are never
        # deleted by hand): the service releases them and removes them with the tenant, last.
        deleted, counts, _perms_needed, _protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), []

    def delete_model(self, request, obj):
        """Through the service: pools go, claims release, the tenant goes once they are all Released."""
        if not tenant_delete(tenant=obj, actor=admin_actor(request)):
            messages.warning(request, f"tenant {obj.name} is being deleted: it goes once its claims are released")

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # A quota below what the pools ask for is saved (nothing is released), and the admin is told.
        if change and "quota_nodes" in form.changed_data:
            warning = tenant_quota_warning(tenant=obj, quota=obj.quota_nodes)
            if warning:
                messages.warning(request, warning)

    def event_values(self, request, obj, form, change):
        values = super().event_values(request, obj, form, change)
        if form.cleaned_data.get("new_kubeconfig"):
            values["kubeconfig"] = form.cleaned_data["new_kubeconfig"]
        return values

    @admin.display(description="pools", ordering="pool_total")
    def pool_count(self, tenant):
        return tenant.pool_total

    @admin.display(description="kubeconfig", boolean=True)
    def has_kubeconfig(self, tenant):
        return not tenant.kubeconfig_empty

    @admin.display(description="stored kubeconfig")
    def kubeconfig_status(self, tenant):
        return "set (not shown)" if tenant.pk and tenant.kubeconfig else "empty"

    @admin.display(description="pools")
    def pools_text(self, tenant):
        if tenant.pk is None:
            return "-"
        pools = tenant.pools.order_by("name")
        return format_html_join(", ", '<a href="{}">{}</a> ({})', (
            (reverse("admin:pools_nodepool_change", args=[p.pk]), p.name,
             p.quantity if p.kind == PoolKind.STATIC else p.kind) for p in pools)) or "-"

    @admin.display(description="events")
    def event_log(self, tenant):
        return event_log_link(tenant__id__exact=tenant.pk) if tenant.pk else "-"


admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class RecordedUserAdmin(MembershipsRecorded, RecordedAdmin, UserAdmin):
    """Django's user admin, each change recorded with the admin's name: staff and superuser flags (platform
    admin), groups (operators, auditors), tenants and the role in each, and that the password changed (never the hash: events.services.is_secret)."""

    event_object_type = ObjectType.USER
    inlines = (TenantMembershipInline,)
    # Facts, not settings (and the form's date and time inputs drop the microseconds: each save would
    # "change" date_joined).
    readonly_fields = ("last_login", "date_joined")

    def user_change_password(self, request, id, form_url=""):
        request._changing_password = True  # log_change, called once the new password is saved, records it
        with transaction.atomic():
            return super().user_change_password(request, id, form_url)

    def log_change(self, request, obj, message):
        if getattr(request, "_changing_password", False):
            event_record(kind=EventKind.CHANGE, object_type=ObjectType.USER, object_name=str(obj),
                         actor=admin_actor(request), message="password changed" if obj.has_usable_password()
                         else "password-based authentication disabled")
        return super().log_change(request, obj, message)

    def delete_model(self, request, obj):
        for membership in obj.tenant_memberships.select_related("tenant"):  # each in its tenant's log
            membership_remove(tenant=membership.tenant, user=obj, actor=admin_actor(request))
        super().delete_model(request, obj)


@admin.register(Group)
class RecordedGroupAdmin(RecordedAdmin, GroupAdmin):
    event_object_type = ObjectType.GROUP


class NodePoolForm(forms.ModelForm):
    # The version this form was rendered from: a save over someone else's change is refused.
    seen_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = NodePool
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["seen_version"].initial = self.instance.version

    def clean_quantity(self):
        # The bound by its name, alone: a field that fails here is not checked against the database's range too.
        quantity = self.cleaned_data.get("quantity")
        check_node_count(quantity)
        return quantity

    def clean(self):
        cleaned = super().clean()
        pool = self.instance
        seen = cleaned.get("seen_version")
        if pool.pk and seen is not None and seen != pool.version:
            raise ValidationError(f"pool {pool} changed meanwhile (version {pool.version}, not {seen}): "
                                  "reload the page and make the change again")
        tenant = cleaned.get("tenant") or (pool.tenant if pool.tenant_id else None)
        kind = cleaned.get("kind") or pool.kind
        quantity = cleaned.get("quantity")
        if tenant and kind == PoolKind.STATIC and quantity is not None and (
                not pool.pk or {"quantity", "kind"} & set(self.changed_data)):
            # The check pool_create / pool_update make again under a lock, here so that it shows on the field.
            others = tenant_static_quantities(tenant=tenant, exclude=pool.pk)
            try:
                tenant_check_quota(tenant=tenant, quantities={**others, pool.name or cleaned.get("name", ""): quantity})
            except ValidationError as exc:
                self.add_error("quantity", exc.message_dict["quantity"])
                cleaned["quantity"] = quantity  # the model's checks see the value asked for ("needs a quantity")
        return cleaned


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    form = NodePoolForm
    list_display = ("name", "tenant", "provider", "kind", "quantity", "version", "updated_at")  # + claims.admin
    list_filter = ("kind", "provider", "tenant")
    search_fields = ("name", "tenant__name", "profile")
    list_select_related = ("tenant", "provider")
    readonly_fields = ("version", "event_log", *STAMPS)

    def get_readonly_fields(self, request, obj=None):
        # A pool's identity is what its tenant's vcluster.yaml declares. Its kind may change, as over the API.
        return (("tenant", "name") if obj else ()) + self.readonly_fields

    @admin.display(description="events")
    def event_log(self, pool):
        return event_log_link(object_type=ObjectType.POOL, object_name=str(pool)) if pool.pk else "-"

    def save_model(self, request, obj, form, change):
        concrete = {f.name for f in NodePool._meta.concrete_fields}
        names = form.changed_data if change else list(form.fields)
        values = {name: getattr(obj, name) for name in names if name in concrete}
        try:
            if change:
                saved = pool_update(pool=obj, values=values, actor=admin_actor(request),
                                    expected_version=form.cleaned_data.get("seen_version"))
            else:
                saved = pool_create(tenant=obj.tenant, values=values, actor=admin_actor(request))
        except (ValidationError, StaleVersion) as exc:
            # Lost a race with another writer after the form's own checks passed: the service's savepoint
            # undid every write; no admin log entry either, and the change page says why.
            request._pool_save_error = "; ".join(getattr(exc, "messages", None) or [str(exc)])
            return
        obj.pk = saved.pk
        obj.refresh_from_db()

    def log_addition(self, request, obj, message):
        if not hasattr(request, "_pool_save_error"):
            return super().log_addition(request, obj, message)

    def log_change(self, request, obj, message):
        if not hasattr(request, "_pool_save_error"):
            return super().log_change(request, obj, message)

    def response_add(self, request, obj, post_url_continue=None):
        return self._save_error_response(request) or super().response_add(request, obj, post_url_continue)

    def response_change(self, request, obj):
        return self._save_error_response(request) or super().response_change(request, obj)

    def _save_error_response(self, request):
        error = getattr(request, "_pool_save_error", None)
        if error is None:
            return None
        self.message_user(request, f"Nothing was saved: {error}", messages.ERROR)
        return HttpResponseRedirect(request.get_full_path())

    def delete_model(self, request, obj):
        pool_delete(pool=obj, actor=admin_actor(request))  # releases its live claims

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for pool in queryset.select_related("tenant"):
                pool_delete(pool=pool, actor=admin_actor(request))


@admin.register(FabricPartition)
class FabricPartitionAdmin(ReadOnlyAdmin):
    """Read-only: a partition is taken by the provision flow (pools.fabric) and freed with its tenant; the switches
    carry it, so nobody edits it by hand here."""

    list_display = ("tenant", "kind", "value_text", "source", "since")
    list_filter = ("kind",)
    search_fields = ("tenant__name",)
