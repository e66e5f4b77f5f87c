"""Admin for the Event log (read-only), and the helpers every app's admin shares so that admin
writes are validated, saved and recorded in the Event log with the admin's name."""
import copy
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db import transaction
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from core.actors import actor
from core.errors import InUse
from core.transitions import ConcurrentTransition, IllegalTransition

from .models import Event
from .services import object_delete, object_relations_set, object_update

# The Bootstrap colour names the choices declare (core.choices.ColouredChoices: HostState, ClaimPhase),
# as the admin has no Bootstrap.
BADGE_COLOURS = {"secondary": "#6c757d", "info": "#0b7285", "warning": "#b35c00", "success": "#2b8a3e",
                 "primary": "#1864ab", "danger": "#c92a2a", "dark": "#343a40", "purple": "#7048e8"}


def admin_actor(request) -> str:
    return actor(request)


def badge(text: str, colour: str) -> str:
    return format_html(
        '<span style="background:{};color:#fff;padding:1px 7px;border-radius:9px;white-space:nowrap">{}</span>',
        BADGE_COLOURS.get(colour, BADGE_COLOURS["secondary"]), text)


def event_log_link(text: str = "Event log", **params) -> str:
    """A link to the Event list filtered by `params` (host__id__exact=…, object_type=…, …)."""
    url = reverse("admin:events_event_changelist") + "?" + urlencode(params)
    return format_html('<a href="{}">{}</a>', url, text)


def brief(text: str, length: int = 80) -> str:
    text = str(text or "")
    return text if len(text) <= length else text[: length - 1] + "…"


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records and evidence: looked at, never added, changed or deleted by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class RecordedAdmin(admin.ModelAdmin):
    """Saves and deletes through events.services.object_update / object_delete: the change is
    validated, saved only if something changed, and recorded with the admin's name (secrets masked)."""

    event_object_type = ""  # Event.object_type: "host", "tenant", "nodetype", ...
    event_self_link = ""  # the Event link the object itself fills ("host", "tenant", "claim")

    def event_links(self, obj) -> dict:
        """Further Event links for this object: {"tenant": ..., "host": ...}."""
        return {}

    def event_values(self, request, obj, form, change) -> dict:
        """The model fields the form sets (all of them on add, the changed ones on change)."""
        concrete = {f.name for f in obj._meta.concrete_fields}
        names = form.changed_data if change else list(form.fields)
        return {name: getattr(obj, name) for name in names if name in concrete}

    def save_model(self, request, obj, form, change):
        values = self.event_values(request, obj, form, change)
        # The form has already written its values onto `obj`; object_update must see the stored
        # row to tell (and record) what changed.
        target = type(obj)._default_manager.get(pk=obj.pk) if change else obj
        object_update(target, values, actor=admin_actor(request), object_type=self.event_object_type,
                      self_link=self.event_self_link, **self.event_links(target))
        if change:
            obj.refresh_from_db()

    def save_related(self, request, form, formsets, change):
        # Many-to-many fields (a user's groups, a group's permissions) through object_relations_set, which
        # records what was added and removed, instead of form.save_m2m().
        obj = form.instance
        relations = {f.name: form.cleaned_data[f.name] for f in obj._meta.many_to_many if f.name in form.changed_data}
        object_relations_set(obj, relations, actor=admin_actor(request), object_type=self.event_object_type,
                             **self.event_links(obj))
        for formset in formsets:
            self.save_formset(request, form, formset, change=change)

    def delete_model(self, request, obj):
        tenant = self.event_links(obj).get("tenant")
        if self.event_self_link == "tenant":
            tenant = copy.copy(obj)  # keeps its id once the tenant row is gone: Event links have no constraint
        object_delete(obj, actor=admin_actor(request), object_type=self.event_object_type, tenant=tenant)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)


class ServiceDeleteMixin:
    """Deletes through a service that may refuse (a host in inspection, a node type in use): the confirmation
    page lists each refusal with its reason instead of offering to delete, and a refusal met at the last
    moment (the state changed meanwhile) is shown as an error, with nothing deleted. One at a time or a
    selection: all or nothing."""

    def delete_refusal(self, obj) -> str:
        """Why `obj` may not be deleted now; "" when it may."""
        return ""

    def delete_through_service(self, request, obj) -> None:
        raise NotImplementedError

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        refusals = [f"{obj} cannot be deleted: {reason}" for obj in objs if (reason := self.delete_refusal(obj))]
        return deleted, counts, perms_needed, [*refusals, *protected]

    def delete_model(self, request, obj):
        self.delete_queryset(request, [obj])

    def delete_queryset(self, request, queryset):
        try:
            with transaction.atomic():
                for obj in queryset:
                    self.delete_through_service(request, obj)
        except (IllegalTransition, ConcurrentTransition, InUse) as exc:
            request._delete_refused = str(exc)
            self.message_user(request, f"nothing deleted: {exc}", messages.ERROR)

    def response_delete(self, request, obj_display, obj_id):
        if getattr(request, "_delete_refused", ""):
            return HttpResponseRedirect(request.path)  # the confirmation page again, with the reason
        return super().response_delete(request, obj_display, obj_id)

    def message_user(self, request, message, level=messages.INFO, *args, **kwargs):
        if level == messages.SUCCESS and getattr(request, "_delete_refused", ""):
            return  # delete_selected's "Successfully deleted": nothing was
        super().message_user(request, message, level, *args, **kwargs)


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    """Append-only: nobody adds, changes or deletes events, not even a superuser."""

    list_display = ("created_at", "kind", "object_type", "object_name", "transition", "step", "actor",
                    "message_brief", "duration")
    list_filter = ("kind", "object_type")
    search_fields = ("object_name", "actor", "message")
    date_hierarchy = "created_at"
    list_per_page = 100
    show_full_result_count = False  # the log grows without bound: no second COUNT(*) per page
    fields = ("created_at", "kind", "object_type", "object_name", "host", "claim", "tenant", "from_state",
              "to_state", "step", "message", "duration_s", "actor", "via", "role", "address", "data")

    @admin.display(description="transition")
    def transition(self, event):
        if not event.to_state:
            return ""
        return f"{event.from_state or '∅'} → {event.to_state}"

    @admin.display(description="message")
    def message_brief(self, event):
        return brief(event.message)

    @admin.display(description="duration", ordering="duration_s")
    def duration(self, event):
        return "" if event.duration_s is None else f"{event.duration_s:.1f}s"
