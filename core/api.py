"""What every API view shares: who may do what (asked of core.scoping, never decided here),
pagination, strict serializers that run Model.clean(), and one mapping from domain errors to HTTP answers."""
import copy
import logging
import re
from collections.abc import Mapping

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import EMPTY_VALUES
from django.db import IntegrityError
from django.db.models import ProtectedError
from django.http import QueryDict
from drf_spectacular.contrib.django_filters import DjangoFilterExtension
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core import scoping
from core.actors import actor  # noqa: F401 (the API's views take it from here)
from core.errors import InUse, LocatedError, StaleVersion
from core.transitions import ConcurrentTransition, IllegalTransition

log = logging.getLogger(__name__)




class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request):
        """`page_size`, a whole number 1 or more as the schema says (at most max_page_size are given); anything else
        is a 400, not silently the default."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        return min(whole_number(self.page_size_query_param, raw), self.max_page_size)

    def get_page_number(self, request, paginator):
        """`page`, a whole number 1 or more, as `page_size` (DRF would read an empty one as the first page, and
        "last" as the last; the schema says neither); past the last page is a 404."""
        raw = request.query_params.get(self.page_query_param)
        return 1 if raw is None else whole_number(self.page_query_param, raw)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update(minimum=1)
            elif parameter["name"] == self.page_query_param:
                parameter["schema"].update(minimum=1)
        return parameters


def whole_number(name: str, raw: str) -> int:
    """A query parameter that the schema calls an integer of 1 or more: digits only, or a 400 naming it. One of
    more than 18 digits reads as 10**18, past any page and any page size."""
    digits = raw.lstrip("0") if re.fullmatch(r"[0-9]+", raw) else ""
    if not digits:
        raise exceptions.ValidationError({name: ["a whole number, 1 or more"]})
    return int(digits) if len(digits) <= 18 else 10**18


# --- permissions ----------------------------------------------------------------------------------

class ScopedPermission(BasePermission):
    """Reads: every role (the view's queryset, from scoping, narrows what each sees); anonymous callers nothing.
    Writes: admins; operators only the actions a view lists in `operator_actions` (host actions); tenant admins
    only those in `member_actions`, and only on objects of the tenants they administer; tenant viewers and
    auditors never."""

    message = "you may not change this"

    def has_permission(self, request, view) -> bool:
        role = scoping.role(request.user)
        if role == scoping.NOBODY:
            return False
        if request.method in SAFE_METHODS or role == scoping.ADMIN:
            return True
        action = getattr(view, "action", "")
        if action is None:
            return True  # no such action: DRF answers 405, the same for everyone signed in
        if role == scoping.AUDITOR:
            self.message = "auditors read only"
            return False
        if role == scoping.OPERATOR:
            self.message = "operators act on hosts; they change no catalogue, tenant, pool or credential"
            return action in getattr(view, "operator_actions", ())
        if action not in getattr(view, "member_actions", ()):
            return False
        if not scoping.may_change_some_tenant(request.user):
            self.message = "tenant viewers read only (you administer no tenant)"
            return False
        return True

    def has_object_permission(self, request, view, obj) -> bool:
        role = scoping.role(request.user)
        if request.method in SAFE_METHODS or role == scoping.ADMIN:
            return True
        if role == scoping.OPERATOR:
            return getattr(view, "action", None) in getattr(view, "operator_actions", ())
        tenant = view.tenant_of(obj)
        return tenant is not None and scoping.may_change_tenant(request.user, tenant)


# --- serializers ----------------------------------------------------------------------------------

class NoNulJSONField(serializers.JSONField):
    """A JSON field whose strings carry no NUL character (PostgreSQL's jsonb cannot store one)."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if _has_nul(value):
            raise serializers.ValidationError("Null characters are not allowed.")
        return value


def _has_nul(value) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def reject_unknown_fields(serializer, data) -> None:
    """Unknown fields, and a NUL character in any field's value (a form's or JSON's): every field, a related
    one looked up by name included, is refused with 400 before PostgreSQL, which stores no NUL, sees it."""
    if isinstance(data, Mapping):
        unknown = sorted(set(data) - set(serializer.fields))
        if unknown:
            raise serializers.ValidationError({name: ["unknown field"] for name in unknown})
        values = data.lists() if hasattr(data, "lists") else data.items()
        nul = sorted(name for name, value in values if _has_nul(value))
        if nul:
            raise serializers.ValidationError({name: ["Null characters are not allowed."] for name in nul})


class StrictSerializer(serializers.Serializer):
    """A request body whose unknown fields are an error, not silently dropped."""

    def to_internal_value(self, data):
        reject_unknown_fields(self, data)
        return super().to_internal_value(data)


class StrictModelSerializer(serializers.ModelSerializer):
    """Unknown fields are an error, not silently dropped (read-only fields are ignored, as DRF does, so
    that what a GET returned can be sent back). Before anything is written, the model's own rules run:
    the instance as it would be is checked with full_clean(), the same Model.clean() that `apply` and the
    admin use, and its errors come back as 400 with field errors."""

    def build_standard_field(self, field_name, model_field):
        field_class, kwargs = super().build_standard_field(field_name, model_field)
        if field_class is serializers.JSONField:
            field_class = NoNulJSONField
        return field_class, kwargs

    def to_internal_value(self, data):
        reject_unknown_fields(self, data)
        return super().to_internal_value(data)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        model_attrs = {k: v for k, v in attrs.items() if k in self.model_field_names()}
        candidate = copy.copy(self.instance) if self.instance is not None else self.Meta.model()
        for name, value in model_attrs.items():
            setattr(candidate, name, value)
        try:
            candidate.full_clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(field_errors(exc)) from None
        except (TypeError, AttributeError, KeyError, ValueError, OverflowError):
            # clean() met a value of a shape it does not expect: refuse it rather than fail (and log where).
            log.warning("%s.clean() failed on malformed input", self.Meta.model.__name__, exc_info=True)
            raise serializers.ValidationError({"non_field_errors": ["a value has the wrong shape"]}) from None
        return attrs

    def model_field_names(self) -> set[str]:
        return {f.name for f in self.Meta.model._meta.get_fields() if getattr(f, "concrete", False)}


def field_errors(exc: DjangoValidationError) -> dict:
    if hasattr(exc, "error_dict"):
        return {("non_field_errors" if k == "__all__" else k): v for k, v in exc.message_dict.items()}
    return {"non_field_errors": exc.messages}


# --- views ----------------------------------------------------------------------------------------

class ScopedViewMixin:
    """A view whose queryset comes from core.scoping and whose objects belong to a tenant."""

    permission_classes = [ScopedPermission]
    member_actions: frozenset = frozenset()
    operator_actions: frozenset = frozenset()
    lookup_value_regex = r"[0-9]+"

    def tenant_of(self, obj):
        return getattr(obj, "tenant", None)


# --- errors ---------------------------------------------------------------------------------------

class PreconditionFailed(exceptions.APIException):
    status_code = status.HTTP_412_PRECONDITION_FAILED
    default_detail = "the object changed meanwhile"
    default_code = "stale_version"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "conflict with the object's current state"
    default_code = "conflict"


def exception_handler(exc, context):
    """Domain errors as HTTP: model validation → 400 with field errors, a stale version → 412, a state
    change that is not allowed now or an object still in use → 409, a manifest error → 400 naming the
    file, document and line. Nothing else is added: messages name objects, never secrets."""
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(field_errors(exc))
    elif isinstance(exc, StaleVersion):
        exc = PreconditionFailed(str(exc))
    elif isinstance(exc, (IllegalTransition, ConcurrentTransition, InUse)):
        exc = Conflict(str(exc))
    elif isinstance(exc, ProtectedError):
        exc = Conflict(_protected_message(exc))
    elif isinstance(exc, IntegrityError):
        exc = Conflict("conflicts with an existing object (changed meanwhile?)")
    elif isinstance(exc, LocatedError):
        return Response({"detail": str(exc), "file": exc.file, "document": exc.document, "line": exc.line,
                         "message": exc.message, "errors": exc.errors}, status=status.HTTP_400_BAD_REQUEST)
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, PreconditionFailed):
        response.data["code"] = exc.default_code
    return response


def _protected_message(exc: ProtectedError) -> str:
    counts = {}
    for obj in exc.protected_objects:
        name = obj._meta.verbose_name_plural
        counts[name] = counts.get(name, 0) + 1
    uses = ", ".join(f"{name}: {n}" for name, n in sorted(counts.items()))
    return f"still in use by other objects ({uses}); remove those first"


# --- the schema (drf-spectacular post-processing hooks, SPECTACULAR_SETTINGS) ----------------------------

DETAIL_SCHEMA = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
# A 400 says what was wrong: {field: [messages]} (nested for nested fields), {"detail": ...}, or a list of messages.
INVALID_SCHEMA = {"anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "string"}}]}
ERROR_RESPONSES = {
    "400": ("the request is invalid: what and why, per field", INVALID_SCHEMA),
    "401": ("no or an unknown token", DETAIL_SCHEMA),
    "403": ("not allowed to this caller (the detail says why)", DETAIL_SCHEMA),
    "404": ("no such object, or not one this caller may see; or no such page", DETAIL_SCHEMA),
    "409": ("not allowed in the object's current state, or in use (the detail says why)", DETAIL_SCHEMA),
    "413": ("a body over MAX_REQUEST_BODY_MB, refused unread", DETAIL_SCHEMA),
}


def schema_error_responses(result, generator, request, public):
    """Every operation documents the errors that every view can answer (ScopedPermission, the filters and
    pagination, exception_handler, the body limit) where it does not say more itself: 400 where it takes
    parameters or a body, 401, 403, 404; 409 and 413 for writes."""
    for path in result.get("paths", {}).values():
        for method, operation in path.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            codes = ["401", "403", "404"]
            if operation.get("parameters") or operation.get("requestBody"):
                codes.append("400")
            if method in ("post", "put", "patch", "delete"):
                codes += ["409"] + (["413"] if operation.get("requestBody") else [])
            for code in codes:
                description, schema = ERROR_RESPONSES[code]
                operation["responses"].setdefault(
                    code, {"description": description, "content": {"application/json": {"schema": schema}}})
    return result


EMPTY_MEANS_NO_FILTER = "Empty: no filter."


def or_empty(schema: dict) -> dict:
    """A query parameter's schema that also takes an empty value (an array's: empty items)."""
    if schema.get("type") == "array":
        return {**schema, "items": or_empty(schema["items"])}
    if schema.get("type") == "string" and "enum" in schema:
        return schema if "" in schema["enum"] else {**schema, "enum": [*schema["enum"], ""]}
    if (schema.get("type") == "string" and not {"enum", "format"} & set(schema)
            and re.search(schema.get("pattern", ""), "")):
        return schema  # "" is one of its texts already
    return {"anyOf": [schema, {"type": "string", "maxLength": 0}]}


def empty_means_no_filter(name: str, filter_field) -> bool:
    """Whether a filter reads `?name=` as no value, which django-filter skips: the list is not filtered. The HTML
    lists' forms, whose FilterSets these are, send their empty fields so."""
    field = filter_field.field
    try:
        value = field.clean(field.widget.value_from_datadict(QueryDict(f"{name}="), {}, name))
    except DjangoValidationError:
        return False
    return value in EMPTY_VALUES


class EmptyFilterExtension(DjangoFilterExtension):
    """django-filter's parameters as drf-spectacular documents them, and where an empty value means no filter
    (an id, a time, a choice, a boolean left blank), the schema says so rather than refuse "" as not an id."""

    priority = 1

    def resolve_filter_field(self, auto_schema, model, filterset_class, field_name, filter_field):
        parameters = super().resolve_filter_field(auto_schema, model, filterset_class, field_name, filter_field)
        if empty_means_no_filter(field_name, filter_field):
            for parameter in parameters:
                schema = or_empty(parameter["schema"])
                if schema != parameter["schema"]:
                    parameter["schema"] = schema
                    parameter["description"] = " ".join(filter(None, [parameter.get("description"),
                                                                      EMPTY_MEANS_NO_FILTER]))
        return parameters


def schema_plain_query_strings(result, generator, request, public):
    """A query parameter's text may not hold NUL (Django's forms refuse it: 400); the schema says so."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            for parameter in (operation.get("parameters") or []) if isinstance(operation, dict) else []:
                schema = parameter.get("schema") or {}
                if (parameter.get("in") == "query" and schema.get("type") == "string"
                        and not {"enum", "format", "pattern"} & set(schema)):
                    schema["pattern"] = "^[^\\u0000]*$"
    return result


def schema_strict_bodies(result, generator, request, public):
    """Request bodies of the strict serializers (StrictSerializer, StrictModelSerializer: an unknown field is a
    400) say so: additionalProperties false."""
    schemas = result.get("components", {}).get("schemas", {})
    for component in getattr(generator.registry, "_components", {}).values():
        serializer = component.object
        cls = serializer if isinstance(serializer, type) else type(serializer)
        schema = schemas.get(component.name)
        if (component.type == "schemas" and schema is not None and component.name.endswith("Request")
                and isinstance(cls, type) and issubclass(cls, (StrictSerializer, StrictModelSerializer))):
            schema["additionalProperties"] = False
    return result


def schema_members_see_less(result, generator, request, public):
    """A serializer whose tenant members get a narrower variant (its MEMBER_VARIANT, which the view's
    get_serializer_class picks for them) documents the fields that only admins get as optional in its responses:
    a member's answer without them is still what the schema says."""
    schemas = result.get("components", {}).get("schemas", {})
    for component in getattr(generator.registry, "_components", {}).values():
        serializer = component.object
        cls = serializer if isinstance(serializer, type) else type(serializer)
        variant = getattr(cls, "MEMBER_VARIANT", None)
        schema = schemas.get(component.name)
        if variant is None or component.type != "schemas" or schema is None or component.name.endswith("Request"):
            continue
        admins_only = set(cls().fields) - set(variant().fields)
        if "required" in schema:
            schema["required"] = [name for name in schema["required"] if name not in admins_only]
            if not schema["required"]:
                del schema["required"]
    return result
