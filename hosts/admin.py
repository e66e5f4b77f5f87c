"""Admin for bare-metal hosts: data fixes recorded in the Event log, BMC credentials write-only,
and maintenance/retry actions that go through hosts.services (the only writer of a host's state)."""
from django import forms
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from events.admin import (
    ReadOnlyAdmin,
    RecordedAdmin,
    ServiceDeleteMixin,
    admin_actor,
    badge,
    brief,
    event_log_link,
)
from events.choices import ObjectType
from pools.matching import label_selector_q

from .lifecycle import ConcurrentTransition, IllegalTransition
from .models import (
    BareMetalHost,
    EraseCertificate,
    HealthCheckRun,
    RepairAttempt,
    RepairCase,
)
from .services import (
    host_create,
    host_delete,
    host_removal_refusal,
    host_retest,
    host_retry,
    host_return_to_service,
    host_set_maintenance,
)

SECRETS = ("bmc_username", "bmc_password")


class BareMetalHostForm(forms.ModelForm):
    new_bmc_username = forms.CharField(
        required=False, label="New BMC username", widget=forms.TextInput(attrs={"autocomplete": "off"}),
        help_text="Leave empty to keep the stored username (never shown).")
    new_bmc_password = forms.CharField(
        required=False, strip=False, label="New BMC password",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Leave empty to keep the stored password (never shown).")

    class Meta:
        model = BareMetalHost
        exclude = SECRETS


class LabelFilter(admin.SimpleListFilter):
    title = "label"
    parameter_name = "label"

    def lookups(self, request, model_admin):
        pairs = set()
        for labels in BareMetalHost.objects.values_list("labels", flat=True):
            pairs.update(f"{k}={v}" for k, v in (labels or {}).items())
        return [(pair, pair) for pair in sorted(pairs)]

    def queryset(self, request, queryset):
        key, sep, value = (self.value() or "").partition("=")
        if not sep:
            return queryset
        return queryset.filter(label_selector_q({"matchLabels": {key: value}}))


@admin.register(BareMetalHost)
class BareMetalHostAdmin(ServiceDeleteMixin, RecordedAdmin):
    form = BareMetalHostForm
    event_object_type = ObjectType.HOST
    event_self_link = "host"
    exclude = SECRETS
    list_display = ("name", "state_badge", "power_state", "online", "labels_text", "claim_text", "error_text",
                    "deadline_at")
    list_filter = ("state", "power_state", "online", LabelFilter, "automated_cleaning_mode")
    search_fields = ("name", "bmc_address", "boot_mac", "claim__name", "claim__tenant__name", "error_message")
    list_select_related = ("claim", "claim__tenant")
    actions = ("maintenance_on", "maintenance_off", "retry", "retest", "return_to_service")
    readonly_fields = ("state", "state_changed_at", "deadline_at", "power_state", "error_type", "error_message",
                       "error_count", "bmc_credentials", "claim_text", "event_log", "inventory", "disk_record",
                       "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "namespace", "labels", "online", "boot_mac", "root_device_hints",
                           "automated_cleaning_mode", "cleaning_policy", "network_data")}),
        ("BMC", {"fields": ("bmc_address", "bmc_disable_certificate_verification", "bmc_credentials_name",
                            "bmc_credentials", "new_bmc_username", "new_bmc_password")}),
        ("Life cycle (changed only by the services: use the actions)", {
            "fields": ("state", "state_changed_at", "deadline_at", "power_state", "error_type", "error_message",
                       "error_count", "claim_text", "event_log")}),
        # The inventory of record changes only by `manage.py repair HOST accept-disks` (an Event says who and why).
        ("Hardware", {"fields": ("inventory", "disk_record", "created_at", "updated_at")}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*SECRETS)

    # Deleted through hosts.services.host_delete (ServiceDeleteMixin): not in a flow, not serving a claim.
    def delete_refusal(self, obj) -> str:
        return host_removal_refusal(obj)

    def delete_through_service(self, request, obj) -> None:
        host_delete(host=obj, actor=admin_actor(request))

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        # A new host registers through the one path apply and the API take: its first Event, its drive.
        host = host_create(values=self.event_values(request, obj, form, change), actor=admin_actor(request))
        obj.pk = host.pk
        obj.refresh_from_db()

    def event_values(self, request, obj, form, change):
        values = super().event_values(request, obj, form, change)
        for name in SECRETS:
            if form.cleaned_data.get(f"new_{name}"):
                values[name] = form.cleaned_data[f"new_{name}"]
        return values

    @admin.display(description="state", ordering="state")
    def state_badge(self, host):
        return badge(host.state, host.state_colour)

    @admin.display(description="labels")
    def labels_text(self, host):
        return ", ".join(f"{k}={v}" for k, v in sorted(host.labels.items()))

    @admin.display(description="claim")
    def claim_text(self, host):
        claim = getattr(host, "claim", None)
        if claim is None:
            return "-"
        url = reverse("admin:claims_nodeclaim_change", args=[claim.pk])
        return format_html('<a href="{}">{}</a> ({})', url, claim.name, claim.tenant.name)

    @admin.display(description="error", ordering="error_message")
    def error_text(self, host):
        return brief(host.error_message, 60)

    @admin.display(description="BMC credentials")
    def bmc_credentials(self, host):
        if host.pk is None:
            return "-"
        return "; ".join(f"{label} {'set' if getattr(host, name) else 'empty'} (not shown)"
                         for label, name in (("username", "bmc_username"), ("password", "bmc_password")))

    @admin.display(description="events")
    def event_log(self, host):
        return event_log_link(host__id__exact=host.pk) if host.pk else "-"

    # --- Actions: one host at a time through hosts.services, each refusal reported -----------------

    def _act(self, request, queryset, verb: str, change) -> None:
        actor = admin_actor(request)
        done = []
        for host in queryset.order_by("name"):
            try:
                change(host=host, actor=actor)
            except (IllegalTransition, ConcurrentTransition) as exc:
                self.message_user(request, f"{verb}: {exc}", messages.WARNING)
            else:
                done.append(f"{host.name} → {host.state}")
        if done:
            self.message_user(request, f"{verb}: {', '.join(done)}", messages.SUCCESS)

    @admin.action(description="Maintenance on", permissions=["change"])
    def maintenance_on(self, request, queryset):
        self._act(request, queryset, "Maintenance on",
                  lambda host, actor: host_set_maintenance(host=host, on=True, actor=actor))

    @admin.action(description="Maintenance off", permissions=["change"])
    def maintenance_off(self, request, queryset):
        self._act(request, queryset, "Maintenance off",
                  lambda host, actor: host_set_maintenance(host=host, on=False, actor=actor))

    @admin.action(description="Retry (hosts in error)", permissions=["change"])
    def retry(self, request, queryset):
        self._act(request, queryset, "Retry", lambda host, actor: host_retry(host=host, actor=actor))

    @admin.action(description="Retest (hosts in repair): clean and health suite again", permissions=["change"])
    def retest(self, request, queryset):
        self._act(request, queryset, "Retest", lambda host, actor: host_retest(host=host, actor=actor))

    @admin.action(description="Return to service (hosts in repair, after a passing retest)", permissions=["change"])
    def return_to_service(self, request, queryset):
        self._act(request, queryset, "Return to service",
                  lambda host, actor: host_return_to_service(host=host, actor=actor))


@admin.register(EraseCertificate)
class EraseCertificateAdmin(ReadOnlyAdmin):
    list_display = ("host_name", "disk", "serial", "method", "method_type", "result", "previous_tenant", "created_at")
    list_filter = ("result", "method", "method_type")
    search_fields = ("host_name", "serial", "previous_tenant", "claim_name", "flow_id")


@admin.register(HealthCheckRun)
class HealthCheckRunAdmin(ReadOnlyAdmin):
    list_display = ("host_name", "suite", "verdict", "node_type", "exit_code", "created_at")
    list_filter = ("verdict", "suite")
    search_fields = ("host_name", "flow_id", "node_type")


@admin.register(RepairCase)
class RepairCaseAdmin(ReadOnlyAdmin):
    """The repair ladder's cases (hosts/flows/repair.py): written only by host moves, so read only here."""
    list_display = ("host_name", "node_type", "kind", "detail", "position", "outcome", "opened_at", "closed_at")
    list_filter = ("outcome", "kind", "node_type")
    search_fields = ("host_name", "summary", "failure")


@admin.register(RepairAttempt)
class RepairAttemptAdmin(ReadOnlyAdmin):
    list_display = ("host_name", "kind", "position", "step", "outcome", "started_at", "finished_at", "failed_step")
    list_filter = ("outcome", "step", "kind")
    search_fields = ("host_name", "flow_id", "message")
