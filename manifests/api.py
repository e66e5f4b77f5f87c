"""POST /api/v1/apply/: the manifests `manage.py apply` takes, through the same code (manifests.apply):
same validation, same errors (file, document, line), all or nothing, with a dry run.

Admins apply anything. A tenant member applies only vcluster.yaml documents (privateNodes) to a tenant of
theirs: their pools, within the tenant's quota. Auditors apply nothing."""
import logging

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from core import scoping
from core.api import ScopedPermission, StrictSerializer, actor
from core.limits import JSONParser
from manifests.apply import apply_files
from manifests.source import load_documents
from pools.selectors import tenants_visible

log = logging.getLogger(__name__)

MAX_FILES = 50


class YAMLTextParser(BaseParser):
    """A bare YAML body (curl --data-binary @site.yaml -H 'Content-Type: application/yaml'); the tenant and
    dry run then come from the query string."""

    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            return {"__yaml__": raw.decode("utf-8")}
        except UnicodeDecodeError:
            raise exceptions.ParseError("the body is not UTF-8 text") from None


class YAMLTextAliasParser(YAMLTextParser):
    media_type = "text/yaml"


class ManifestFileSerializer(StrictSerializer):
    name = serializers.CharField(max_length=200, default="manifest.yaml")
    text = serializers.CharField(trim_whitespace=False, max_length=5_000_000, help_text="multi-document YAML")


class ApplyRequestSerializer(StrictSerializer):
    files = ManifestFileSerializer(many=True, allow_empty=False, max_length=MAX_FILES)
    tenant = serializers.CharField(max_length=63, required=False, allow_null=True, allow_blank=True, default=None,
                                   help_text="the tenant vcluster.yaml documents apply to (as --tenant)")
    dry_run = serializers.BooleanField(default=False)


class ApplyResultSerializer(serializers.Serializer):
    dry_run = serializers.BooleanField()
    changed = serializers.IntegerField()
    lines = serializers.ListField(child=serializers.CharField())


def _error(title: str, description: str, properties: dict, **extra) -> dict:
    return {"type": "object", "title": title, "description": description, "properties": properties,
            "required": list(properties), **extra}


_DETAIL = {"detail": {"type": "string"}}
# The shapes of a 400, as raw OpenAPI (drf-spectacular takes a dict as the schema itself).
APPLY_ERROR = {"anyOf": [
    _error("ManifestError", "a manifest is invalid: nothing was applied (`detail` is what manage.py apply prints)",
           {"detail": {"type": "string"}, "file": {"type": "string", "nullable": True},
            "document": {"type": "integer", "nullable": True}, "line": {"type": "integer", "nullable": True},
            "message": {"type": "string"}}),
    _error("Detail", "the body could not be read (not JSON or YAML, nested too deeply)", _DETAIL,
           additionalProperties=False),
    {"type": "object", "title": "FieldErrors", "description": "the request's own fields and what is wrong with them",
     "additionalProperties": {"anyOf": [{"type": "array"}, {"type": "object"}]}, "minProperties": 1},
]}
DETAIL = _error("Detail", "what was refused, and why", _DETAIL)


class ApplyView(APIView):
    permission_classes = [ScopedPermission]
    parser_classes = [JSONParser, YAMLTextParser, YAMLTextAliasParser]
    member_actions = frozenset({"apply"})

    @property
    def action(self) -> str | None:
        """POST applies; any other method is no action here (405 for everyone signed in, as on the viewsets)."""
        return "apply" if self.request.method == "POST" else None

    @extend_schema(
        request={"application/json": ApplyRequestSerializer,
                 "application/yaml": {"type": "string", "description": "multi-document YAML"},
                 "text/yaml": {"type": "string", "description": "multi-document YAML"}},
        parameters=[OpenApiParameter("tenant", str, description="with a YAML body: as `tenant` in JSON"),
                    OpenApiParameter("dry_run", bool, description="with a YAML body: as `dry_run` in JSON"),
                    OpenApiParameter("name", str, description="with a YAML body: the file name errors give")],
        responses={
            200: ApplyResultSerializer,
            400: OpenApiResponse(APPLY_ERROR, description="nothing was applied: an invalid manifest (ManifestError, "
                                                          "naming file, document and line), or a bad request"),
            401: OpenApiResponse(DETAIL, description="no or an unknown token"),
            403: OpenApiResponse(DETAIL, description="auditors; members applying other than their own tenant's "
                                                     "vcluster.yaml"),
            413: OpenApiResponse(DETAIL, description="a body over MAX_REQUEST_BODY_MB (10 MiB), refused unread"),
        })
    def post(self, request):
        data = request.data
        if isinstance(data, dict) and "__yaml__" in data:
            params = request.query_params
            data = {"files": [{"name": params.get("name") or "manifest.yaml", "text": data["__yaml__"]}],
                    "tenant": params.get("tenant") or None,
                    "dry_run": params.get("dry_run", "false")}
        body = ApplyRequestSerializer(data=data)
        body.is_valid(raise_exception=True)
        files = [(f["name"], f["text"]) for f in body.validated_data["files"]]
        tenant = body.validated_data["tenant"] or None
        dry_run = body.validated_data["dry_run"]
        if not scoping.is_admin(request.user):
            self._check_member(request.user, files, tenant)
        try:
            result = apply_files(files, actor=actor(request), tenant=tenant, dry_run=dry_run)
        except (TypeError, AttributeError, KeyError, ValueError, OverflowError):
            # A value of a shape the model checks do not expect (e.g. `values: 5`): apply is atomic, so nothing
            # was applied; say so rather than fail with a 500 (and leave the traceback to the log).
            log.warning("apply failed on malformed input", exc_info=True)
            return Response({"detail": "a value in the manifests has a type the console cannot read; nothing was "
                                       "applied", "file": None, "document": None, "line": None,
                             "message": "a value has the wrong type"}, status=400)
        return Response({"dry_run": dry_run, "changed": result.changed, "lines": result.lines})

    def _check_member(self, user, files, tenant):
        """A member: only vcluster.yaml documents, for a tenant they belong to (never a new one)."""
        theirs = tenants_visible(user).filter(name=tenant).first() if tenant else None
        if theirs is None or not scoping.may_change_tenant(user, theirs):
            raise exceptions.PermissionDenied("tenant members apply their own tenant's vcluster.yaml: "
                                              "give tenant, one of yours")
        for name, text in files:
            for doc in load_documents(text, name):  # a YAML error is a 400 with its line, as for admins
                if isinstance(doc.data, dict) and ("apiVersion" in doc.data or "kind" in doc.data):
                    raise exceptions.PermissionDenied(
                        f"{name}: document {doc.index}: tenant members apply only vcluster.yaml (privateNodes); "
                        "other kinds are for admins")

