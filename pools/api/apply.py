"""POST /api/v1/apply/: the manifests `manage.py apply` takes, through the same code (manifests.apply):
same validation, same errors (file, document, line), all or nothing, with a dry run.

Admins apply anything. A tenant member applies only vcluster.yaml documents (privateNodes) to a tenant of
theirs: their pools, within the tenant's quota. Auditors apply nothing."""
import logging

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from manifests.apply import apply_files
from manifests.source import load_documents
from vmetal_console import scoping
from vmetal_console.limits import JSONParser

from .base import ScopedPermission, StrictSerializer, actor

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


class ManifestErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()
    file = serializers.CharField()
    document = serializers.IntegerField(allow_null=True)
    line = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()


class ApplyView(APIView):
    permission_classes = [ScopedPermission]
    parser_classes = [JSONParser, YAMLTextParser, YAMLTextAliasParser]
    member_actions = frozenset({"apply"})

    @property
    def action(self) -> str | None:
        """POST applies; any other method is no action here (405 for everyone signed in, as on the viewsets)."""
        return "apply" if self.request.method == "POST" else None

    @extend_schema(request=ApplyRequestSerializer, responses={
        200: ApplyResultSerializer,
        400: OpenApiResponse(ManifestErrorSerializer, description="invalid manifest (nothing applied), or a bad request"),
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
        theirs = scoping.tenants(user).filter(name=tenant).first() if tenant else None
        if theirs is None or not scoping.may_change_tenant(user, theirs):
            raise exceptions.PermissionDenied("tenant members apply their own tenant's vcluster.yaml: "
                                              "give tenant, one of yours")
        for name, text in files:
            for doc in load_documents(text, name):  # a YAML error is a 400 with its line, as for admins
                if isinstance(doc.data, dict) and ("apiVersion" in doc.data or "kind" in doc.data):
                    raise exceptions.PermissionDenied(
                        f"{name}: document {doc.index}: tenant members apply only vcluster.yaml (privateNodes); "
                        "other kinds are for admins")

