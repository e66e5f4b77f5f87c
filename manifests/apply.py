"""`apply`: kubectl-style, multi-document, idempotent and atomic. Accepts vcluster.yaml (or its
privateNodes part) for a tenant, VirtualClusterInstance, NodeProvider, NodeType, NodeEnvironment,
OSImage, Metal3 BareMetalHost and v1 Secret documents."""
import base64
import binascii
import json
import re
from dataclasses import dataclass, field

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction

from claims.choices import ClaimPhase
from claims.models import NodeClaim
from core.errors import InUse
from core.labels import error_location
from core.limits import node_count_error
from core.tasks import task_send_on_commit
from core.transactions import retry_on_deadlock
from events.choices import ObjectType
from events.services import object_update
from hosts.bmc.client import is_ipmi
from hosts.models import BareMetalHost
from hosts.services import host_create
from pools.choices import (
    REPAIR_LADDER_MAX,
    CleaningPolicy,
    FailureKind,
    InspectionMode,
    PoolKind,
    ProviderKind,
    RepairRemedy,
)
from pools.fabric import fabric_partitions_restore, parse_fabric_partitions
from pools.models import (
    CHECKSUM_LENGTHS,
    WARM_MAX_HOSTS,
    WARM_MAX_IDLE_MINUTES,
    OS_IMAGE_PROPERTY,
    NodeEnvironment,
    NodeProvider,
    NodeType,
    OSImage,
    Tenant,
)
from pools.erase_rules import check_disk_rules, check_keep_disks
from pools.matching import label_selector_matches, requirements_match
from pools.selectors import labels_derived, node_types_selecting
from pools.services import (
    PoolSpec,
    node_type_delete,
    tenant_private_nodes_apply,
    tenant_quota_warning,
)
from pools.sku import DERIVED_LABELS
from pools.validators import NETWORK_DATA, parse_duration

from autonodes import task_names as autonodes_tasks
from machines.clusters import CLUSTER_SECRET_NAMESPACE, KUBECONFIG_KEY, secret_data
from machines.kinds.metal3 import CLEANING_MODES
from machines.models import ProviderSecret

from .source import Document, Invalid, ManifestError, Reader, load_documents

LOFT = "management.loft.sh/v1"
METAL3 = "metal3.io/v1alpha1"
ANNOTATION_PREFIX = "vmetal.dev/"
REDACTED = "vmetal.dev/redacted"
STATUS_ANNOTATION = "baremetalhost.metal3.io/status"
# A host's own cleaning method, overriding its NodeType's (metadata, full or secure); absent: the NodeType's.
CLEANING_ANNOTATION = ANNOTATION_PREFIX + "cleaning-policy"
# A tenant's fabric partitions as export writes them (`vlan=100,ib-pkey=0x8001`): recorded again by apply.
FABRIC_ANNOTATION = ANNOTATION_PREFIX + "fabric-partitions"
KINDS = {("v1", "Secret"), (LOFT, "NodeProvider"), (LOFT, "NodeType"), (LOFT, "NodeEnvironment"),
         (LOFT, "OSImage"), (LOFT, "VirtualClusterInstance"), (METAL3, "BareMetalHost")}
# Applied in this order, whatever the order in the files: what is referred to comes first.
ORDER = ["Secret", "NodeProvider", "NodeType", "OSImage", "VirtualClusterInstance", "vcluster.yaml",
         "NodeEnvironment", "BareMetalHost"]
PROVIDER_BLOCKS = {"metal3", "kubeVirt", "terraform", "bcm", "clusterAPI"}
TOFU_CREDENTIALS_LABEL = "terraform.vcluster.com/provider"
# The provider blocks this console serves, with the fields each takes (vCluster Platform's names; docs/providers.md).
BLOCK_FIELDS = {
    "metal3": {"clusterRef", "deploy", "nodeTypes", "deriveLabels"},
    "kubeVirt": {"clusterRef", "namespaceStrategy", "virtualMachineTemplate", "nodeTypes", "maxCapacity"},
    "terraform": {"nodeTemplate", "timeout", "nodeTypes", "maxCapacity"},
}
# Per NodeType in an external block: kept on NodeType.provider_config (bareMetalHosts.selector → host_selector).
TYPE_BLOCK_FIELDS = {
    "metal3": {"automatedCleaningMode"},
    "kubeVirt": {"virtualMachineTemplate", "mergeVirtualMachineTemplate", "maxCapacity"},
    "terraform": {"nodeTemplate", "maxCapacity"},
}
KIND_OF_BLOCK = {"metal3": ProviderKind.METAL3, "kubeVirt": ProviderKind.KUBEVIRT, "terraform": ProviderKind.TERRAFORM}


@dataclass(frozen=True)
class Fields:
    """How the caller's users name apply's choices in messages: the command's options, or a page's fields."""
    tenant: str = "--tenant NAME"
    create_tenant: str = ""  # how to ask for a new tenant; empty: a vcluster.yaml's missing tenant is created


@dataclass
class ApplyResult:
    lines: list[str] = field(default_factory=list)  # "nodepool one/gpu created", kubectl-style
    changed: int = 0
    notes: list[str] = field(default_factory=list)  # what the user must decide before applying
    # The same, one entry an object, for the apply page: what ("nodetype/gpu"), verb, and each changed key as
    # (key, before, after); a Secret's keys come without their values, a warning as its text alone.
    items: list[dict] = field(default_factory=list)

    def add(self, what: str, created: bool, changes: dict | None = None) -> None:
        if created:
            self.lines.append(f"{what} created")
            self.items.append({"what": what, "verb": "created", "changes": []})
            self.changed += 1
        elif changes:
            detail = ", ".join(f"{k}: {_short(o)} → {_short(n)}" for k, (o, n) in changes.items())
            self.lines.append(f"{what} configured ({detail})")
            self.items.append({"what": what, "verb": "configured",
                               "changes": [(k, _short(o), _short(n)) for k, (o, n) in changes.items()]})
            self.changed += 1
        else:
            self.lines.append(f"{what} unchanged")
            self.items.append({"what": what, "verb": "unchanged", "changes": []})

    def warn(self, text: str) -> None:
        self.line(f"Warning: {text}")

    def line(self, text: str) -> None:
        """A line that is no object's create or update (a deletion, a warning): the page shows it as it is."""
        self.lines.append(text)
        self.items.append({"what": "", "verb": "", "changes": [], "text": text})


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


class DryRun(Exception):
    pass


@retry_on_deadlock()
def apply_files(files: list[tuple[str, str]], *, actor: str, tenant: str | None = None,
                dry_run: bool = False, create_tenant: bool = True, fields: Fields = Fields()) -> ApplyResult:
    """Apply [(file name, text), ...] in one transaction. Any error: nothing is applied.

    `create_tenant`: whether a vcluster.yaml may create its tenant when none has that name (the web page asks
    for it explicitly, so that a mistyped name makes nothing; a dry run then says so in `notes`). `fields`:
    how messages name the tenant and that choice."""
    docs = []
    for name, text in files:
        docs += load_documents(text, name)
    if not docs:
        raise ManifestError(files[0][0] if files else "-", None, None, "no documents to apply")
    classified = [(_classify(doc, tenant, fields), doc) for doc in docs]
    classified.sort(key=lambda pair: ORDER.index(pair[0]))
    result = ApplyResult()
    try:
        with transaction.atomic():
            ctx = Context(actor=actor, tenant=tenant, result=result, create_tenant=create_tenant, dry_run=dry_run,
                          fields=fields)
            for kind, doc in classified:
                try:
                    HANDLERS[kind](ctx, doc)
                except Invalid as exc:
                    raise doc.error(exc) from None
            ctx.check_credentials()
            ctx.check_quotas()
            ctx.report_drift_sources()
            if dry_run:
                raise DryRun
    except DryRun:
        result.lines = [line + " (dry run)" for line in result.lines]
    return result


def _classify(doc: Document, tenant: str | None, fields: Fields = Fields()) -> str:
    data = doc.data
    if not isinstance(data, dict):
        raise doc.error(Invalid((), "a manifest must be a mapping"))
    if "apiVersion" in data or "kind" in data:
        key = (data.get("apiVersion"), data.get("kind"))
        if key not in KINDS:
            known = ", ".join(f"{k} ({v})" for v, k in sorted(KINDS, key=lambda kv: kv[1]))
            raise doc.error(Invalid(("kind",), f"unknown kind {data.get('kind')!r} of apiVersion "
                                              f"{data.get('apiVersion')!r}; this console accepts {known}, "
                                              f"and vcluster.yaml (privateNodes) with {fields.tenant}"))
        return key[1]
    if "privateNodes" in data or "autoNodes" in data:
        if not tenant:
            raise doc.error(Invalid((), f"a vcluster.yaml applies to a tenant: give {fields.tenant}"))
        return "vcluster.yaml"
    raise doc.error(Invalid((), "not a manifest: expected apiVersion and kind, or a vcluster.yaml with privateNodes"))


@dataclass
class SecretData:
    doc: Document
    values: dict[str, str]
    redacted: bool


class Context:
    def __init__(self, *, actor: str, tenant: str | None, result: ApplyResult, create_tenant: bool = True,
                 dry_run: bool = False, fields: Fields = Fields()):
        self.actor, self.tenant, self.result = actor, tenant, result
        self.create_tenant, self.dry_run, self.fields = create_tenant, dry_run, fields
        self.secrets: dict[tuple[str, str], SecretData] = {}
        self.used_secrets: set[tuple[str, str]] = set()
        self.quotas_set: list[Tenant] = []  # tenants whose quota this run changed

    def check_credentials(self) -> None:
        for key, secret in self.secrets.items():
            if key not in self.used_secrets:
                self.result.line(f"secret {key[0]}/{key[1]} not referenced by any BareMetalHost")

    def check_quotas(self) -> None:
        """Once every pool is applied: a quota set below what the tenant's pools ask for is applied (nothing is
        released), with a warning."""
        for tenant in self.quotas_set:
            warning = tenant_quota_warning(tenant=tenant, quota=tenant.quota_nodes)
            if warning:
                self.result.warn(warning)

    def report_drift_sources(self) -> None:
        """A changed NodeType or OSImage is a change of every static pool whose serving nodes were made from it
        (they drift, and the pool rolls them): said as the pool's change, unless the pool's own document changed."""
        changed = {item["what"] for item in self.result.items if item["verb"] == "configured"}
        types = {what.split("/", 1)[1] for what in changed if what.startswith("nodetype/")}
        images = {what.split("/", 1)[1] for what in changed if what.startswith("osimage/")}
        if not types and not images:
            return
        sources: dict[tuple[str, str], set[str]] = {}
        serving = (NodeClaim.objects.filter(phase=ClaimPhase.AVAILABLE, pool__kind=PoolKind.STATIC)
                   .values_list("pool__tenant__name", "pool__name", "node_type__name", "properties"))
        for tenant, pool, node_type, properties in serving:
            made_from = sources.setdefault((tenant, pool), set())
            if node_type in types:
                made_from.add(f"nodetype/{node_type}")
            if (properties or {}).get(OS_IMAGE_PROPERTY) in images:
                made_from.add(f"osimage/{properties[OS_IMAGE_PROPERTY]}")
        for (tenant, pool), made_from in sorted(sources.items()):
            what = f"nodepool/{tenant}/{pool}"
            if not made_from or what in changed:
                continue
            line = f"{what} configured (its nodes were made from {', '.join(sorted(made_from))}, changed: they drift)"
            item = {"what": what, "verb": "configured", "changes": [(name, "", "changed") for name in sorted(made_from)]}
            # Its own document, applied unchanged in the same run, is said once: as this change.
            at = next((i for i, it in enumerate(self.result.items) if it["what"] == what), None)
            if at is None:
                self.result.lines.append(line)
                self.result.items.append(item)
            else:
                self.result.lines[at], self.result.items[at] = line, item
            self.result.changed += 1

    def update(self, what: str, obj, values: dict, paths: dict[str, tuple], *, object_type: str, tenant=None,
               self_link: str = ""):
        try:
            created, changes = object_update(obj, values, actor=self.actor, object_type=object_type,
                                             tenant=tenant, self_link=self_link)
        except ValidationError as exc:
            raise _invalid_from(exc, paths) from None
        self.result.add(what, created, changes)
        return obj


def _invalid_from(exc: ValidationError, paths: dict[str, tuple]) -> Invalid:
    """Every error of a model's validation, each at its field's path in the manifest plus its position
    inside the field (a label's key, a taint's effect: core.labels)."""
    if not hasattr(exc, "error_dict"):
        return Invalid((), "; ".join(exc.messages))
    problems = []
    for name, errors in exc.error_dict.items():
        path = paths.get(name, ("metadata", "name") if name in ("name", "__all__") else ())
        for error in errors:
            inner, message = error_location(error)
            problems.append(Invalid(path + inner, message))
    return Invalid.all(problems)


def _metadata(doc: Document, *, namespaced: bool = False, default_namespace: str = "") -> tuple[str, str, Reader]:
    meta = Reader(doc.data).child("metadata").mapping(
        {"name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
         "creationTimestamp", "finalizers", "ownerReferences", "managedFields"}, required=("name",))
    name = meta.str("name", required=True)
    namespace = meta.str("namespace", default=default_namespace) if namespaced else ""
    return name, namespace, meta


def _spec(doc: Document, allowed: set[str], required: tuple[str, ...] = ()) -> Reader:
    top = Reader(doc.data).mapping({"apiVersion", "kind", "metadata", "spec", "status"})
    if not top.has("spec"):
        raise Invalid(("spec",), "required field is missing")
    return top.child("spec").mapping(allowed, required)


# --- Secret ---------------------------------------------------------------------------------------

def apply_secret(ctx: Context, doc: Document) -> None:
    name, namespace, meta = _metadata(doc, namespaced=True, default_namespace="metal3")
    Reader(doc.data).mapping({"apiVersion", "kind", "metadata", "type", "data", "stringData", "immutable"})
    top = Reader(doc.data)
    values = {}
    for key, text in top.string_map("data").items():
        try:
            values[key] = base64.b64decode(text, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise Invalid(("data", key), "is not valid base64") from None
    values.update(top.string_map("stringData"))
    redacted = meta.string_map("annotations").get(REDACTED) == "true"
    labels = meta.string_map("labels")
    if namespace == CLUSTER_SECRET_NAMESPACE or TOFU_CREDENTIALS_LABEL in labels:
        return _apply_provider_secret(ctx, namespace, name, labels, values, redacted)
    if not redacted:
        for key in ("username", "password"):
            if not values.get(key):
                raise Invalid(("data",), f"a BMC credentials Secret needs {key}")
    ctx.secrets[(namespace, name)] = SecretData(doc=doc, values=values, redacted=redacted)
    what = f"secret/{namespace}/{name}"
    created, changed = _secret_change(namespace, name, values, redacted)
    if changed:
        ctx.result.lines.append(f"{what} configured ({', '.join(changed)} changed)")  # never the data
        ctx.result.items.append({"what": what, "verb": "configured", "changes": [(k, "", "") for k in changed],
                                 "secret": True})
        ctx.result.changed += 1
    else:
        ctx.result.add(what, created)


def _apply_provider_secret(ctx: Context, namespace: str, name: str, labels: dict, values: dict,
                           redacted: bool) -> None:
    """A Secret providers read (machines.models.ProviderSecret): a cluster's kubeconfig in vcluster-platform, or
    OpenTofu credentials labelled terraform.vcluster.com/provider. Stored encrypted; an export's redacted copy keeps
    what is stored."""
    what = f"secret/{namespace}/{name}"
    secret = ProviderSecret.objects.filter(namespace=namespace, name=name).first()
    if namespace == CLUSTER_SECRET_NAMESPACE and TOFU_CREDENTIALS_LABEL not in labels and not redacted \
            and not values.get(KUBECONFIG_KEY):
        raise Invalid(("stringData",), f"a cluster's Secret in {CLUSTER_SECRET_NAMESPACE} needs {KUBECONFIG_KEY} "
                                       "(the kubeconfig of the cluster a provider's clusterRef names)")
    if redacted:
        ctx.result.add(what, secret is None)
        return
    stored = secret_data(secret) if secret else None
    if secret is not None and stored == values and secret.labels == labels:
        ctx.result.add(what, False)
        return
    if not ctx.dry_run:
        ProviderSecret.objects.update_or_create(namespace=namespace, name=name,
                                                defaults={"labels": labels, "contents": json.dumps(values)})
    if secret is None:
        ctx.result.add(what, True)
    else:
        changed = sorted(k for k in set(values) | set(stored) if values.get(k) != stored.get(k))
        ctx.result.lines.append(f"{what} configured ({', '.join(changed) or 'labels'} changed)")  # never the data
        ctx.result.items.append({"what": what, "verb": "configured", "changes": [(k, "", "") for k in changed],
                                 "secret": True})
        ctx.result.changed += 1


def _secret_change(namespace: str, name: str, values: dict, redacted: bool) -> tuple[bool, list[str]]:
    """(created, the keys that changed) of a Secret, as kubectl prints it: a Secret lives in the hosts that
    name it."""
    hosts = list(BareMetalHost.objects.filter(namespace=namespace, bmc_credentials_name=name)
                 .only("bmc_username", "bmc_password"))
    if not hosts:
        return True, []
    if redacted:
        return False, []  # an export's Secret: the credentials stay as they are
    return False, [key for key, field_name in (("username", "bmc_username"), ("password", "bmc_password"))
                   if any(getattr(host, field_name) != values[key] for host in hosts)]


# --- NodeProvider, NodeType -----------------------------------------------------------------------

def apply_node_provider(ctx: Context, doc: Document) -> None:
    name, _, _ = _metadata(doc)
    spec = _spec(doc, {"displayName", "properties", *PROVIDER_BLOCKS})
    blocks = [b for b in PROVIDER_BLOCKS if spec.has(b)]
    if len(blocks) != 1:
        raise Invalid(("spec",), "needs exactly one provider block (metal3, kubeVirt, terraform, bcm or clusterAPI)")
    kind = blocks[0]
    if kind not in BLOCK_FIELDS:
        raise Invalid(("spec", kind), f"provider kind {kind} is not supported by this console; "
                                      f"supported: {', '.join(BLOCK_FIELDS)}")
    # deriveLabels: inspections write GPU labels on hosts (pools/sku.py, hosts.services.host_derive_labels).
    block = spec.child(kind).mapping(BLOCK_FIELDS[kind])
    _check_external_block(kind, block)
    config = {k: v for k, v in block.value.items() if k != "nodeTypes"}
    provider = NodeProvider.objects.filter(name=name).first() or NodeProvider(name=name)
    if provider.pk and provider.kind != KIND_OF_BLOCK[kind] and provider.claims.exists():
        raise Invalid(("spec", kind), f"provider {name} is {provider.kind} and has claims: its kind cannot change")
    ctx.update(f"nodeprovider/{name}", provider,
               {"kind": KIND_OF_BLOCK[kind], "display_name": spec.str("displayName"),
                "properties": spec.string_map("properties"), "config": config},
               {"properties": ("spec", "properties"), "name": ("metadata", "name"), "config": block.path},
               object_type=ObjectType.NODEPROVIDER)
    declared = set()
    for item in block.child("nodeTypes", []).items():
        item.mapping(NODE_TYPE_FIELDS | TYPE_BLOCK_FIELDS[kind], required=("name",))
        type_name = item.str("name", required=True)
        if type_name in declared:
            raise Invalid(item.path + ("name",), f"node type {type_name!r} is declared twice")
        declared.add(type_name)
        _apply_node_type(ctx, item, type_name, provider, declared_in_provider=True, block=kind)
    for stale in provider.node_types.filter(declared_in_provider=True).exclude(name__in=declared).order_by("name"):
        try:
            node_type_delete(node_type=stale, actor=ctx.actor)
        except InUse as exc:
            raise Invalid(block.path + ("nodeTypes",), f"{exc}; keep declaring it until then") from None
        ctx.result.line(f"nodetype/{stale.name} deleted")
        ctx.result.changed += 1


NODE_TYPE_FIELDS = {"name", "displayName", "resources", "bareMetalHosts", "properties", "cost", "zone", "region",
                    "cleaning", "healthCheck", "sku", "health", "repair", "warm", "inspectionMode", "firmware",
                    "gpu"}


def _check_external_block(kind: str, block: Reader) -> None:
    """What an external provider needs before any machine is asked of it; each mistake with its path."""
    if kind == "metal3" and not block.has("clusterRef"):
        return  # the console's own conductor
    if kind in ("kubeVirt", "metal3"):
        ref = block.child("clusterRef").mapping({"cluster", "namespace"}, required=("cluster",))
        validate = ref.str("cluster", required=True)
        if not validate.strip():
            raise Invalid(ref.path + ("cluster",), "names the cluster: a Secret of that name in "
                                                   f"{CLUSTER_SECRET_NAMESPACE} holds its kubeconfig")
    if kind == "kubeVirt":
        block.choice("namespaceStrategy", ["vcluster", "fixed", "nodeClaim"], default="vcluster")
        block.child("virtualMachineTemplate", {}).mapping()
    if kind == "terraform":
        _node_template(block.child("nodeTemplate", {}), required=True)
        timeout = block.str("timeout")
        if timeout:
            try:
                parse_duration(timeout)
            except ValueError as exc:
                raise Invalid(block.path + ("timeout",), str(exc)) from None
    if block.has("maxCapacity"):
        _max_capacity(block)


def _max_capacity(block: Reader) -> None:
    value = block.int("maxCapacity")
    error = node_count_error(value)
    if value is None or value < 0 or error:
        raise Invalid(block.path + ("maxCapacity",), error or "a number of machines, 0 or more")


def _node_template(template: Reader, *, required: bool) -> None:
    """nodeTemplate: inline OpenTofu (`inline`) or from git (`git: {repository, branch|tag|commit, subPath,
    fetchInterval}`)."""
    template.mapping({"inline", "git"})
    if not template.value:
        if required:
            raise Invalid(template.path, "needs an OpenTofu template: inline, or git with a repository")
        return
    if template.has("inline") == template.has("git"):
        raise Invalid(template.path, "either inline or git, not both")
    if template.has("git"):
        git = template.child("git").mapping({"repository", "branch", "tag", "commit", "subPath", "fetchInterval",
                                             "credentials"}, required=("repository",))
        if sum(git.has(k) for k in ("branch", "tag", "commit")) > 1:
            raise Invalid(git.path, "one of branch, tag or commit")
        if git.has("fetchInterval"):
            try:
                parse_duration(git.str("fetchInterval"))
            except ValueError as exc:
                raise Invalid(git.path + ("fetchInterval",), str(exc)) from None
    elif not template.str("inline").strip():
        raise Invalid(template.path + ("inline",), "an empty template")
# spec.cleaning and spec.healthCheck: the NodeType's fields without their prefix, in camelCase (hosts/gate/cleaning.py
# reads them). Left out: the model's default, as for every other field, so the manifest stays the whole truth.
CLEANING = {"policy": "cleaning_policy", "fallback": "cleaning_fallback", "eraseConcurrency": "erase_concurrency",
            "eraseVerifyShare": "erase_verify_share", "eraseVerifyFull": "erase_verify_full"}
HEALTH_CHECK = {"dcgmLevel": "health_dcgm_level", "ncclMinBusbwGBps": "health_nccl_min_busbw_gbps"}


def _disk_rules(cleaning: Reader) -> list:
    """spec.cleaning.disks (pools/erase_rules.py), each mistake at its own rule's line."""
    rules = cleaning.child("disks", [])
    rules.items()
    try:
        check_disk_rules(rules.value)
    except ValidationError as exc:
        message = exc.messages[0]
        where = re.match(r"disks\[(\d+)\]((?:\.\w+)*): ", message)
        path = rules.path
        if where:
            path += (int(where.group(1)), *[p for p in where.group(2).split(".") if p])
            message = message[where.end():]
        raise Invalid(path, message) from None
    return rules.value


def _release_gate(spec: Reader) -> tuple[dict, dict]:
    """spec.cleaning and spec.healthCheck → (NodeType values, the path of each)."""
    cleaning = spec.child("cleaning", {}).mapping(set(CLEANING) | {"disks"})
    health = spec.child("healthCheck", {}).mapping(set(HEALTH_CHECK))
    default = {name: NodeType._meta.get_field(name).get_default()
               for name in (*CLEANING.values(), *HEALTH_CHECK.values())}
    values = {
        "cleaning_policy": cleaning.choice("policy", CleaningPolicy.values, default=default["cleaning_policy"]),
        "cleaning_fallback": cleaning.choice("fallback", CleaningPolicy.values),
        "erase_concurrency": cleaning.int("eraseConcurrency", default["erase_concurrency"]),
        "erase_verify_share": cleaning.number("eraseVerifyShare", default["erase_verify_share"]),
        "erase_verify_full": cleaning.bool("eraseVerifyFull", default["erase_verify_full"]),
        "health_dcgm_level": health.int("dcgmLevel", default["health_dcgm_level"]),
        "health_nccl_min_busbw_gbps": health.number("ncclMinBusbwGBps"),
        "cleaning_disks": _disk_rules(cleaning),
    }
    paths = {field: cleaning.path + (key,) for key, field in CLEANING.items()}
    paths["cleaning_disks"] = cleaning.path + ("disks",)
    paths.update({field: health.path + (key,) for key, field in HEALTH_CHECK.items()})
    return values, paths


def _repair_ladders(spec: Reader) -> dict:
    """spec.repair: {automatic, ladders: {KIND: [REMEDY, ...]}} (hosts/flows/repair.py climbs it), checked here with the
    path of each mistake; NodeType.clean() checks the same rules for the admin and the API."""
    block = spec.child("repair", {}).mapping({"automatic", "ladders"})
    value: dict = {}
    if block.has("automatic"):
        value["automatic"] = block.bool("automatic", True)
    if block.has("ladders"):
        ladders = block.child("ladders").mapping(set(FailureKind.values))
        value["ladders"] = {}
        for kind in ladders.value:
            remedies = ladders.child(kind, [])
            items = remedies.items()
            for item in items:
                if item.value not in RepairRemedy.values:
                    raise Invalid(item.path, f"{item.value!r} is not a remedy; expected one of "
                                             f"{', '.join(RepairRemedy.values)}")
            names = [item.value for item in items]
            if len(set(names)) != len(names):
                raise Invalid(remedies.path, "a remedy is listed twice")
            if len(names) > REPAIR_LADDER_MAX:
                raise Invalid(remedies.path, f"at most {REPAIR_LADDER_MAX} remedies")
            value["ladders"][str(kind)] = names
    return value


# spec.warm: {hosts: N, idleMinutes: M}: N hosts of the type kept warm after a passing gate, each powered off after
# M minutes idle (hosts/flows/warm.py). Left out: none kept warm.
WARM = {"hosts": "warm_hosts", "idleMinutes": "warm_idle_minutes"}


def _warm(spec: Reader) -> tuple[dict, dict]:
    """spec.warm → (NodeType values, the path of each)."""
    warm = spec.child("warm", {}).mapping(set(WARM))
    default_idle = NodeType._meta.get_field("warm_idle_minutes").get_default()
    hosts = warm.int("hosts", 0)
    idle = warm.int("idleMinutes", default_idle)
    if not 0 <= hosts <= WARM_MAX_HOSTS:
        raise Invalid(warm.path + ("hosts",), f"must be between 0 and {WARM_MAX_HOSTS} (0: no host kept warm), not {hosts}")
    if not 1 <= idle <= WARM_MAX_IDLE_MINUTES:
        raise Invalid(warm.path + ("idleMinutes",),
                      f"must be between 1 and {WARM_MAX_IDLE_MINUTES} minutes, not {idle}")
    return {"warm_hosts": hosts, "warm_idle_minutes": idle}, {field: warm.path + (key,) for key, field in WARM.items()}


def _apply_node_type(ctx: Context, spec: Reader, name: str, provider: NodeProvider, *, declared_in_provider: bool,
                     block: str = "metal3"):
    selector = spec.child("bareMetalHosts", {}).mapping({"selector"}).child("selector", {})
    provider_config = {key: spec.child(key).value for key in sorted(TYPE_BLOCK_FIELDS[block]) if spec.has(key)}
    if "maxCapacity" in provider_config:
        _max_capacity(spec)
    if "nodeTemplate" in provider_config:
        _node_template(spec.child("nodeTemplate"), required=False)
    if provider_config.get("automatedCleaningMode", "metadata") not in CLEANING_MODES:
        raise Invalid(spec.path + ("automatedCleaningMode",),
                      f"must be one of {', '.join(sorted(CLEANING_MODES))} (Metal3's), not "
                      f"{provider_config['automatedCleaningMode']!r}")
    for key in ("virtualMachineTemplate", "mergeVirtualMachineTemplate"):
        if key in provider_config:
            spec.child(key).mapping()
    node_type = NodeType.objects.filter(name=name).first() or NodeType(name=name)
    if node_type.pk and node_type.provider_id != provider.pk and node_type.declared_in_provider != declared_in_provider:
        raise Invalid(spec.path + ("name",), f"node type {name!r} is already declared by provider {node_type.provider}")
    cost = spec.int("cost")
    if cost is not None and cost < 0:
        raise Invalid(spec.path + ("cost",), "must be 0 or more")
    gate, gate_paths = _release_gate(spec)
    warm, warm_paths = _warm(spec)
    gate, gate_paths = {**gate, **warm}, {**gate_paths, **warm_paths}
    repair = _repair_ladders(spec)
    gate["inspection_mode"] = _inspection_mode(spec)
    gate_paths["inspection_mode"] = spec.path + ("inspectionMode",)
    firmware = spec.child("firmware", {}).mapping({"settings", "components"})
    if firmware.value:
        _refuse_firmware_over_ipmi_hosts(firmware.path, selector.value)
    ctx.update(f"nodetype/{name}", node_type,
               {"provider": provider, "display_name": spec.str("displayName"), "zone": spec.str("zone"),
                "region": spec.str("region"), "properties": spec.string_map("properties"),
                "resources": spec.string_map("resources"), "cost": cost, "host_selector": selector.value,
                "declared_in_provider": declared_in_provider, "sku": spec.child("sku", {}).mapping().value,
                "health": spec.child("health", {}).mapping().value, "repair": repair, "firmware": firmware.value,
                "gpu": spec.child("gpu", {}).mapping().value,
                "provider_config": provider_config, **gate},
               {"properties": spec.path + ("properties",), "resources": spec.path + ("resources",),
                "firmware": firmware.path, "gpu": spec.path + ("gpu",),
                "sku": spec.path + ("sku",), "health": spec.path + ("health",), "repair": spec.path + ("repair",),
                "host_selector": selector.path, "name": spec.path + ("name",), **gate_paths},
               object_type=ObjectType.NODETYPE)


def apply_node_type(ctx: Context, doc: Document) -> None:
    name, _, _ = _metadata(doc)
    every = set().union(*TYPE_BLOCK_FIELDS.values())
    spec = _spec(doc, NODE_TYPE_FIELDS - {"name"} | {"providerRef"} | every, required=("providerRef",))
    provider_name = spec.str("providerRef", required=True)
    provider = NodeProvider.objects.filter(name=provider_name).first()
    if provider is None:
        raise Invalid(spec.path + ("providerRef",), f"NodeProvider {provider_name!r} not found")
    block = next(b for b, k in KIND_OF_BLOCK.items() if k == provider.kind)
    for key in sorted(every - TYPE_BLOCK_FIELDS[block]):
        if spec.has(key):
            raise Invalid(spec.path + (key,), f"not a field of a {block} provider's NodeType")
    _apply_node_type(ctx, spec, name, provider, declared_in_provider=False, block=block)


# --- NodeEnvironment, OSImage ---------------------------------------------------------------------

def apply_node_environment(ctx: Context, doc: Document) -> None:
    name, namespace, _ = _metadata(doc, namespaced=True, default_namespace="p-default")
    spec = _spec(doc, {"properties", "providerRef", "vClusterRef", "displayName"})
    provider = tenant = None
    if spec.has("providerRef"):
        provider = NodeProvider.objects.filter(name=spec.str("providerRef")).first()
        if provider is None:
            raise Invalid(spec.path + ("providerRef",), f"NodeProvider {spec.str('providerRef')!r} not found")
    if spec.has("vClusterRef"):
        ref = spec.child("vClusterRef")
        tenant_name = ref.value if isinstance(ref.value, str) else ref.mapping({"name", "namespace"}).str("name")
        tenant = Tenant.objects.filter(name=tenant_name).first()
        if tenant is None:
            raise Invalid(ref.path, f"tenant (VirtualClusterInstance) {tenant_name!r} not found")
    env = NodeEnvironment.objects.filter(namespace=namespace, name=name).first() or \
        NodeEnvironment(namespace=namespace, name=name)
    ctx.update(f"nodeenvironment/{namespace}/{name}", env,
               {"display_name": spec.str("displayName"), "provider": provider, "tenant": tenant,
                "properties": spec.string_map("properties")},
               {"properties": spec.path + ("properties",), "name": ("metadata", "name")},
               object_type=ObjectType.NODEENVIRONMENT, tenant=tenant)


def apply_os_image(ctx: Context, doc: Document) -> None:
    name, _, _ = _metadata(doc)
    spec = _spec(doc, {"displayName", "description", "properties", "owner", "access", "format"})
    props = spec.string_map("properties")
    path = spec.path + ("properties",)
    if not props.get(OSImage.URL):
        raise Invalid(path, f"{OSImage.URL} is required")
    if not props.get(OSImage.CHECKSUM):
        raise Invalid(path, f"{OSImage.CHECKSUM} is required: an image is never written unverified")
    fmt = spec.str("format", default="raw")
    checksum = props.get(OSImage.CHECKSUM, "").strip().lower()
    # Detected from the length when omitted, here as in OSImage.clean(), so that applying again is a no-op.
    props.setdefault(OSImage.CHECKSUM_TYPE, CHECKSUM_LENGTHS.get(len(checksum), ""))
    image = OSImage.objects.filter(name=name).first() or OSImage(name=name)
    ctx.update(f"osimage/{name}", image,
               {"display_name": spec.str("displayName"), "description": spec.str("description"),
                "url": props.pop(OSImage.URL), "checksum": props.pop(OSImage.CHECKSUM),
                "checksum_type": props.pop(OSImage.CHECKSUM_TYPE, ""), "format": fmt, "properties": props},
               {"url": path + (OSImage.URL,), "checksum": path + (OSImage.CHECKSUM,),
                "checksum_type": path + (OSImage.CHECKSUM_TYPE,), "format": spec.path + ("format",)},
               object_type=ObjectType.OSIMAGE)


# --- Tenants: VirtualClusterInstance and vcluster.yaml --------------------------------------------

def apply_virtual_cluster_instance(ctx: Context, doc: Document) -> None:
    name, namespace, meta = _metadata(doc, namespaced=True, default_namespace="p-default")
    spec = _spec(doc, {"displayName", "description", "owner", "template", "templateRef", "clusterRef",
                       "parameters", "access", "networkPeer", "extraAccessRules"})
    annotations = meta.string_map("annotations")
    tenant = _tenant_upsert(ctx, name, namespace=namespace, display_name=spec.str("displayName"),
                            annotations=annotations, annotations_path=meta.path + ("annotations",))
    template = spec.child("template", {}).mapping()
    release = template.child("helmRelease", {}).mapping()
    values = release.child("values")
    if values.value in (None, ""):
        return
    if isinstance(values.value, str):
        offset = doc.line_of(values.path)  # a block scalar starts on the line after its key
        inner = load_documents(values.value, doc.file, line_offset=offset, index=doc.index)
        if not inner:
            return
        vdoc = inner[0]
        try:
            _apply_private_nodes(ctx, tenant, Reader(vdoc.data))
        except Invalid as exc:
            # The line comes from the inner document, which knows the paths inside the block; the message
            # names the whole path from the VirtualClusterInstance.
            raise vdoc.error(exc, outer=values.path) from None
    else:
        _apply_private_nodes(ctx, tenant, values)


def apply_vcluster_yaml(ctx: Context, doc: Document) -> None:
    if not ctx.create_tenant and not Tenant.objects.filter(name=ctx.tenant).exists():
        # A mistyped name must not make a tenant: a new one is an explicit choice.
        ask = ctx.fields.create_tenant or "asking for a new tenant"
        if not ctx.dry_run:
            raise Invalid((), f"tenant {ctx.tenant!r} does not exist: nothing was applied. Correct the name if it "
                              f"is mistyped, or tick {ask} to create it")
        ctx.result.notes.append(f"tenant {ctx.tenant!r} does not exist: it would be created. Apply creates it only "
                                f"with {ask} ticked; correct the name if it is mistyped.")
    tenant = _tenant_upsert(ctx, ctx.tenant, namespace=None, display_name=None, annotations={}, annotations_path=())
    _apply_private_nodes(ctx, tenant, Reader(doc.data))


def _tenant_upsert(ctx: Context, name: str, *, namespace: str | None, display_name: str | None,
                   annotations: dict, annotations_path: tuple) -> Tenant:
    tenant = Tenant.objects.filter(name=name).first() or Tenant(name=name)
    values = {}
    if namespace is not None:
        values["namespace"] = namespace
    if display_name is not None:
        values["display_name"] = display_name
    known = {"api-endpoint": "api_endpoint", "join-mode": "join_mode", "quota-nodes": "quota_nodes"}
    fabric = None
    for key, text in annotations.items():
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        short = key[len(ANNOTATION_PREFIX):]
        if key == FABRIC_ANNOTATION:
            try:
                fabric = parse_fabric_partitions(text)
            except ValidationError as exc:
                raise Invalid(annotations_path + (key,), exc.messages[0]) from None
            continue
        if short not in known:
            raise Invalid(annotations_path + (key,), f"unknown annotation; expected one of "
                                                    f"{', '.join(ANNOTATION_PREFIX + k for k in sorted(known))}, "
                                                    f"{FABRIC_ANNOTATION}")
        if short == "quota-nodes":
            if not text.isdigit():
                raise Invalid(annotations_path + (key,), "must be a whole number of nodes")
            values["quota_nodes"] = int(text)
        else:
            values[known[short]] = text
    if namespace is not None:  # a VirtualClusterInstance declares the whole tenant: unset means default
        values = {"api_endpoint": "", "join_mode": "vcluster", "quota_nodes": None, **values}
    paths = {field: annotations_path + (ANNOTATION_PREFIX + short,) for short, field in known.items()}
    paths["namespace"] = ("metadata", "namespace")
    quota = tenant.quota_nodes if tenant.pk else None
    ctx.update(f"virtualclusterinstance/{name}", tenant, values, paths, object_type=ObjectType.TENANT,
               self_link="tenant")
    if tenant.quota_nodes != quota:
        ctx.quotas_set.append(tenant)
    if fabric:
        try:
            lines = fabric_partitions_restore(tenant=tenant, wanted=fabric, actor=ctx.actor)
        except ValidationError as exc:
            raise Invalid(annotations_path + (FABRIC_ANNOTATION,), exc.messages[0]) from None
        ctx.result.lines += lines
        ctx.result.changed += sum(line.endswith(" created") for line in lines)
    return tenant


STATIC_FIELDS = {"name", "quantity", "nodeTypeSelector", "nodeLabels", "taints", "terminationGracePeriod", "profile",
                 "topology", "group", "disruption", "cleaning"}
DYNAMIC_FIELDS = {"name", "nodeTypeSelector", "nodeLabels", "taints", "terminationGracePeriod", "profile", "limits",
                  "disruption", "expireAfter", "weight", "topology", "group", "cleaning"}


def _apply_private_nodes(ctx: Context, tenant: Tenant, config: Reader) -> None:
    config.mapping()
    private = config.child("privateNodes") if config.has("privateNodes") else config
    private.mapping()
    enabled = private.bool("enabled", True)
    entries_reader = private.child("autoNodes", [])
    entries = [entries_reader] if isinstance(entries_reader.value, dict) else entries_reader.items()
    provider_properties, specs, seen_providers, seen_pools, problems = {}, [], {}, {}, []
    for entry in entries:
        entry.mapping({"provider", "properties", "static", "dynamic"}, required=("provider",))
        provider_name = entry.str("provider", required=True)
        if provider_name in seen_providers:
            raise Invalid(entry.path + ("provider",), f"provider {provider_name!r} has two autoNodes entries; "
                                                      "give one entry per provider")
        seen_providers[provider_name] = entry
        provider = NodeProvider.objects.filter(name=provider_name).first()
        if provider is None:
            raise Invalid(entry.path + ("provider",), f"NodeProvider {provider_name!r} not found")
        props = entry.string_map("properties")
        if props:
            provider_properties[provider_name] = props
        for kind, allowed in ((PoolKind.STATIC, STATIC_FIELDS), (PoolKind.DYNAMIC, DYNAMIC_FIELDS)):
            for pool in entry.child(kind, []).items():
                try:
                    pool.mapping(allowed, required=("name",) + (("quantity",) if kind == PoolKind.STATIC else ()))
                    specs.append(_pool_spec(pool, kind, provider, seen_pools))
                except Invalid as exc:
                    problems.append(exc)  # and the next pools': every error of the document at once
    if problems:
        raise Invalid.all(problems)
    try:
        result = tenant_private_nodes_apply(tenant=tenant, enabled=enabled, provider_properties=provider_properties,
                                            pools=[s for s, _ in specs], actor=ctx.actor)
    except ValidationError as exc:
        raise Invalid(entries_reader.path, "; ".join(exc.messages)) from None
    for name, (created, changes) in result.pools.items():
        ctx.result.add(f"nodepool/{tenant.name}/{name}", created, changes)
    if any(changes and not created for created, changes in result.pools.values()):
        task_send_on_commit(autonodes_tasks.ROLL)  # what a pool's nodes are made from may have changed: drift
    for name in result.deleted:
        ctx.result.line(f"nodepool/{tenant.name}/{name} deleted")
        ctx.result.changed += 1


def _keep_disks(pool: Reader, provider: NodeProvider) -> list:
    """The pool's cleaning.keepOnReimage: data disk roles its NodeTypes let a pool keep (pools/erase_rules.py)."""
    cleaning = pool.child("cleaning", {}).mapping({"keepOnReimage"})
    keep = cleaning.child("keepOnReimage", [])
    try:
        check_keep_disks(keep.value)
    except ValidationError as exc:
        raise Invalid(keep.path, exc.messages[0].removeprefix("keepOnReimage: ")) from None
    if not keep.value:
        return []
    selector = pool.list("nodeTypeSelector")
    types = [t for t in NodeType.objects.filter(provider=provider)
             if requirements_match(selector, t.effective_properties())] if isinstance(selector, list) else []
    for i, role in enumerate(keep.value):
        allowing = [t for t in types if any(isinstance(r, dict) and r.get("role") == role and
                                            r.get("keepOnReimage") is True for r in t.cleaning_disks or [])]
        if types and not allowing:
            raise Invalid(keep.path + (i,), f"no NodeType of this pool ({', '.join(t.name for t in types)}) lets a "
                                            f"pool keep disk role {role!r}: its spec.cleaning.disks must name it "
                                            "with keepOnReimage: true")
    return list(keep.value)


def _pool_spec(pool: Reader, kind: str, provider: NodeProvider, seen: dict) -> tuple[PoolSpec, Reader]:
    name = pool.str("name", required=True)
    if name in seen:
        raise Invalid(pool.path + ("name",), f"pool name {name!r} is used twice; pool names must be unique")
    seen[name] = pool
    values = {
        "node_type_selector": pool.list("nodeTypeSelector"),
        "node_labels": pool.string_map("nodeLabels"),
        "taints": pool.list("taints"),
        "termination_grace_period": pool.str("terminationGracePeriod"),
        "profile": pool.str("profile"),
        # Ours, beside vCluster's fields: where the nodes sit and whether they come in all-or-nothing groups.
        "topology": pool.child("topology", {}).value,
        "group": pool.child("group", {}).value,
        "keep_disks": _keep_disks(pool, provider),
    }
    if kind == PoolKind.STATIC:
        quantity = pool.int("quantity", required=True)
        if quantity < 0:
            raise Invalid(pool.path + ("quantity",), f"must be 0 or more, not {quantity}")
        values["quantity"] = quantity
        # Ours: the budgets its drift roll keeps to (autonodes.roll), as a dynamic pool's.
        values["disruption"] = pool.child("disruption", {}).mapping({"budgets"}).value
    else:
        values.update(limits=pool.string_map("limits"), disruption=pool.child("disruption", {}).mapping().value,
                      expire_after=pool.str("expireAfter"), weight=pool.int("weight"))
    # Validate here too, so that the error points at the pool's own lines.
    from pools.models import NodePool

    probe = NodePool(name=name, kind=kind, **values)
    try:
        probe.clean()
    except ValidationError as exc:
        field_paths = {"node_type_selector": "nodeTypeSelector", "node_labels": "nodeLabels", "taints": "taints",
                       "disruption": "disruption", "limits": "limits", "quantity": "quantity",
                       "topology": "topology", "group": "group", "keep_disks": "cleaning"}
        raise _invalid_from(exc, {name: pool.path + (field_paths.get(name, name),)
                                  for name in getattr(exc, "error_dict", {})}) from None
    return PoolSpec(name=name, provider=provider, kind=kind, values=values), pool


# --- BareMetalHost --------------------------------------------------------------------------------

BMH_SPEC = {"bmc", "bootMACAddress", "online", "rootDeviceHints", "automatedCleaningMode", "description",
            "inspectionMode",
            # Metal3 fields that this console sets itself while provisioning: accepted and ignored.
            "bootMode", "hardwareProfile", "image", "userData", "networkData", "metaData", "consumerRef",
            "externallyProvisioned", "customDeploy", "firmware", "raid", "preprovisioningNetworkDataName"}


def apply_bare_metal_host(ctx: Context, doc: Document) -> None:
    name, namespace, meta = _metadata(doc, namespaced=True, default_namespace="metal3")
    spec = _spec(doc, BMH_SPEC, required=("bmc", "bootMACAddress"))
    bmc = spec.child("bmc").mapping({"address", "credentialsName", "disableCertificateVerification"},
                                    required=("address", "credentialsName"))
    credentials_name = bmc.str("credentialsName", required=True)
    _refuse_what_ipmi_cannot(spec, bmc.str("address", required=True))
    _refuse_firmware_over_ipmi(bmc.str("address", required=True), meta.string_map("labels"),
                               meta.path + ("labels",))
    host = BareMetalHost.objects.filter(name=name).first() or BareMetalHost(name=name)
    secret = ctx.secrets.get((namespace, credentials_name))
    values = {
        "namespace": namespace, "bmc_address": bmc.str("address", required=True),
        "bmc_credentials_name": credentials_name,
        "bmc_disable_certificate_verification": bmc.bool("disableCertificateVerification", False),
        "boot_mac": spec.str("bootMACAddress", required=True).lower(), "online": spec.bool("online", True),
        "root_device_hints": spec.child("rootDeviceHints", {}).mapping().value,
        "labels": _with_derived_labels(host, meta.string_map("labels")),
        "automated_cleaning_mode": spec.str("automatedCleaningMode", default="metadata"),
        "inspection_mode": _inspection_mode(spec),
        "cleaning_policy": Reader(meta.string_map("annotations"), meta.path + ("annotations",))
        .choice(CLEANING_ANNOTATION, CleaningPolicy.values),
        # An override: the node's network data as written; the console allocates it no address (claims.ipam).
        "network_data": meta.string_map("annotations").get(NETWORK_DATA, ""),
    }
    if secret is None:
        if not host.pk or host.bmc_credentials_name != credentials_name:
            raise Invalid(bmc.path + ("credentialsName",),
                          f"Secret {namespace}/{credentials_name} not found: apply it in the same run")
    else:
        ctx.used_secrets.add((namespace, credentials_name))
        if not secret.redacted:
            values["bmc_username"] = secret.values["username"]
            values["bmc_password"] = secret.values["password"]
    creating = host.pk is None
    status = meta.string_map("annotations").get(STATUS_ANNOTATION)
    paths = {"bmc_address": bmc.path + ("address",), "boot_mac": spec.path + ("bootMACAddress",),
             "labels": meta.path + ("labels",), "root_device_hints": spec.path + ("rootDeviceHints",),
             "automated_cleaning_mode": spec.path + ("automatedCleaningMode",), "name": ("metadata", "name"),
             "inspection_mode": spec.path + ("inspectionMode",),
             "cleaning_policy": meta.path + ("annotations", CLEANING_ANNOTATION),
             "network_data": meta.path + ("annotations", NETWORK_DATA)}
    if not creating:
        ctx.update(f"baremetalhost/{name}", host, values, paths, object_type=ObjectType.HOST, self_link="host")
        return
    # A new host registers (or, with Metal3's status, comes in as that status says) through hosts.services.
    paths["status"] = meta.path + ("annotations", STATUS_ANNOTATION)
    try:
        host_create(values={"name": name, **values}, actor=ctx.actor,
                    status=_status_json(status, paths["status"]) if status else None)
    except ValidationError as exc:
        raise _invalid_from(exc, paths) from None
    ctx.result.add(f"baremetalhost/{name}", True)


def _inspection_mode(spec: Reader) -> str:
    """spec.inspectionMode of a BareMetalHost or a NodeType: agent or fast (pools.choices.InspectionMode); left out,
    "" (a host: its NodeType's; a NodeType: agent). Metal3's `disabled` is refused: every host is inspected."""
    if spec.str("inspectionMode") == "disabled":
        raise Invalid(spec.path + ("inspectionMode",), "inspection cannot be disabled here: the SKU check and the "
                                                       "release gate's census need an inventory; use agent or fast")
    return spec.choice("inspectionMode", InspectionMode.values)


def _refuse_what_ipmi_cannot(spec: Reader, address: str) -> None:
    """An ipmi:// host asking for what only Redfish does is refused here, with the reason, rather than failing its
    first boot: a live ISO (Metal3 boots it from virtual media) and UEFI secure boot (IPMI cannot set it)."""
    if not is_ipmi(address):
        return
    image = spec.child("image", {})
    if isinstance(image.value, dict) and str(image.value.get("format") or "").lower() == "live-iso":
        raise Invalid(image.path + ("format",), "a live ISO boots from virtual media, which an ipmi:// BMC cannot "
                                                "insert: use a redfish-virtualmedia:// address")
    if spec.str("bootMode") == "UEFISecureBoot":
        raise Invalid(spec.path + ("bootMode",), "an ipmi:// BMC cannot turn on UEFI secure boot: give this host a "
                                                 "Redfish address")
    if spec.str("inspectionMode") == InspectionMode.FAST:
        raise Invalid(spec.path + ("inspectionMode",), "fast inspection reads the inventory from a Redfish BMC; an "
                                                       "ipmi:// BMC lists none: use agent, or a Redfish address")


FIRMWARE_OVER_IPMI = ("BIOS settings and firmware are read and changed over Redfish (Bios, UpdateService), which an "
                      "ipmi:// BMC does not have")


def _refuse_firmware_over_ipmi(address: str, labels: dict, path: tuple) -> None:
    """An ipmi:// host that a NodeType with BIOS settings or firmware minimums would select: refused here, with the
    reason, rather than failing its intake."""
    if not is_ipmi(address):
        return
    wanting = [t.name for t in node_types_selecting(labels) if t.firmware]
    if wanting:
        raise Invalid(path, f"NodeType {', '.join(wanting)} selects this host and declares firmware; "
                            f"{FIRMWARE_OVER_IPMI}: give this host a Redfish address, or labels that type does not select")


def _refuse_firmware_over_ipmi_hosts(path: tuple, selector: dict) -> None:
    """A NodeType declaring firmware whose selector takes an ipmi:// host already registered: refused likewise."""
    if not selector:
        return
    ipmi = [h.name for h in BareMetalHost.objects.filter(bmc_address__istartswith="ipmi://").only("name", "labels")
            .order_by("name") if label_selector_matches(selector, h.labels or {})]
    if ipmi:
        raise Invalid(path, f"this NodeType selects {', '.join(ipmi[:5])}{' …' if len(ipmi) > 5 else ''} with an "
                            f"ipmi:// BMC; {FIRMWARE_OVER_IPMI}: narrow its bareMetalHosts selector, or give those hosts "
                            "Redfish addresses")


def _with_derived_labels(host: BareMetalHost, labels: dict) -> dict:
    """The manifest's labels, and those inspection derived on the host (deriveLabels) that it does not write:
    applying the same manifest again changes nothing, and export leaves the derived ones out."""
    if not host.pk or not labels_derived():
        return labels
    return {**{k: v for k, v in host.labels.items() if k in DERIVED_LABELS}, **labels}


def _status_json(text: str, path: tuple):
    """Metal3's status annotation (as `clusterctl move` writes it), read as JSON for hosts.services.host_create,
    which says what of it a new host may take."""
    try:
        return json.loads(text)
    except ValueError:
        raise Invalid(path, "must be Metal3 status JSON with provisioning.state") from None


HANDLERS = {
    "Secret": apply_secret, "NodeProvider": apply_node_provider, "NodeType": apply_node_type,
    "NodeEnvironment": apply_node_environment, "OSImage": apply_os_image,
    "VirtualClusterInstance": apply_virtual_cluster_instance, "vcluster.yaml": apply_vcluster_yaml,
    "BareMetalHost": apply_bare_metal_host,
}


def dump_yaml(data) -> str:
    return yaml.safe_dump(data, sort_keys=False)
