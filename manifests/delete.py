"""`delete -f`: kubectl-style removal of the objects that manifests name, all or nothing. Every document is read
and its object found first (apply's own classification and metadata rules); then everything goes in one
transaction, through the services that own each object, kinds in a fixed order and names in order within a
kind (one lock order); any refusal, and nothing is deleted."""
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import ProtectedError

from core.errors import InUse
from core.transactions import retry_on_deadlock
from core.transitions import ConcurrentTransition, IllegalTransition
from events.choices import ObjectType
from events.services import object_delete
from hosts.models import BareMetalHost
from hosts.services import host_delete
from pools.models import (
    NodeEnvironment,
    NodePool,
    NodeProvider,
    NodeType,
    OSImage,
    Tenant,
)
from pools.services import node_type_delete, pool_delete, tenant_delete

from .apply import DryRun, _classify, _metadata
from .source import Document, Invalid, ManifestError, Reader, load_documents

# Deleted in this order, whatever the order in the files: pools (and tenants) before hosts, as pool_delete locks
# a pool before its claims' hosts; what is referred to (types, providers, the Secrets hosts use) last.
ORDER = ["vcluster.yaml", "VirtualClusterInstance", "BareMetalHost", "NodeEnvironment", "OSImage", "NodeType",
         "NodeProvider", "Secret"]


@dataclass
class Target:
    kind: str
    what: str  # "baremetalhost/gpu-01", as apply prints it
    doc: Document
    path: tuple  # where the document names it
    obj: Any  # None: not found


@retry_on_deadlock()
def delete_files(files: list[tuple[str, str]], *, actor: str, tenant: str | None = None, dry_run: bool = False,
                 ignore_not_found: bool = False) -> list[str]:
    """Delete what [(file name, text), ...] names. Returns kubectl's lines ("baremetalhost/gpu-01 deleted").
    Raises ManifestError (file, document, line) for a document it cannot read, an object not found (unless
    `ignore_not_found`) or a refusal; nothing is deleted then."""
    docs = []
    for name, text in files:
        docs += load_documents(text, name)
    if not docs:
        raise ManifestError(files[0][0] if files else "-", None, None, "no documents to delete")
    targets: dict[str, Target] = {}
    for doc in docs:
        kind = _classify(doc, tenant)
        try:
            found = FIND[kind](doc, tenant)
        except Invalid as exc:
            raise doc.error(exc) from None
        for target in found:
            if target.obj is None and not ignore_not_found:
                raise doc.error(Invalid(target.path, f"{target.what} not found"))
            targets.setdefault(target.what, target)
    ordered = sorted((t for t in targets.values() if t.obj is not None),
                     key=lambda t: (ORDER.index(t.kind), t.what))
    lines = []
    try:
        with transaction.atomic():
            for target in ordered:
                try:
                    lines += DELETE[target.kind](target, actor)
                except (IllegalTransition, ConcurrentTransition, InUse) as exc:
                    raise target.doc.error(Invalid(target.path, str(exc))) from None
                except ProtectedError as exc:
                    raise target.doc.error(Invalid(target.path, _still_used(target.what, exc))) from None
            if dry_run:
                raise DryRun
    except DryRun:
        lines = [line + " (dry run)" for line in lines]
    return lines


def _still_used(what: str, exc: ProtectedError) -> str:
    users = sorted({f"{obj._meta.verbose_name} {obj}" for obj in exc.protected_objects})
    more = f" and {len(users) - 5} more" if len(users) > 5 else ""
    return f"{what} is still used by {', '.join(users[:5])}{more}: delete those first"


# --- finding: the object each document names ------------------------------------------------------------

NAME = ("metadata", "name")


def _named(kind: str, prefix: str, model, *, namespaced: bool = False, default_namespace: str = ""):
    def find(doc: Document, tenant: str | None) -> list[Target]:
        name, namespace, _ = _metadata(doc, namespaced=namespaced, default_namespace=default_namespace)
        lookup = {"name": name, **({"namespace": namespace} if model is NodeEnvironment else {})}
        what = f"{prefix}/{namespace}/{name}" if model is NodeEnvironment else f"{prefix}/{name}"
        return [Target(kind, what, doc, NAME, model.objects.filter(**lookup).first())]

    return find


def find_secret(doc: Document, tenant: str | None) -> list[Target]:
    # A Secret lives on in the hosts that took their BMC credentials from it: it exists while one refers to it.
    name, namespace, _ = _metadata(doc, namespaced=True, default_namespace="metal3")
    users = BareMetalHost.objects.filter(namespace=namespace, bmc_credentials_name=name)
    return [Target("Secret", f"secret/{namespace}/{name}", doc, NAME, (namespace, name) if users.exists() else None)]


def find_pools(doc: Document, tenant: str | None) -> list[Target]:
    """The pools a vcluster.yaml declares (privateNodes.autoNodes[].static / dynamic), of the --tenant."""
    config = Reader(doc.data).mapping()
    private = config.child("privateNodes") if config.has("privateNodes") else config
    entries = private.mapping().child("autoNodes", [])
    targets = []
    for entry in [entries] if isinstance(entries.value, dict) else entries.items():
        entry.mapping()
        for kind in ("static", "dynamic"):
            for pool in entry.child(kind, []).items():
                name = pool.mapping().str("name", required=True)
                found = NodePool.objects.filter(tenant__name=tenant, name=name).select_related("tenant").first()
                targets.append(Target("vcluster.yaml", f"nodepool/{tenant}/{name}", doc, pool.path + ("name",), found))
    return targets


FIND = {
    "Secret": find_secret,
    "NodeProvider": _named("NodeProvider", "nodeprovider", NodeProvider),
    "NodeType": _named("NodeType", "nodetype", NodeType),
    "NodeEnvironment": _named("NodeEnvironment", "nodeenvironment", NodeEnvironment, namespaced=True,
                              default_namespace="p-default"),
    "OSImage": _named("OSImage", "osimage", OSImage),
    "VirtualClusterInstance": _named("VirtualClusterInstance", "virtualclusterinstance", Tenant, namespaced=True,
                                     default_namespace="p-default"),
    "vcluster.yaml": find_pools,
    "BareMetalHost": _named("BareMetalHost", "baremetalhost", BareMetalHost, namespaced=True,
                            default_namespace="metal3"),
}


# --- deleting: through each object's service ----------------------------------------------------------

def delete_host(target: Target, actor: str) -> list[str]:
    host_delete(host=target.obj, actor=actor)
    return [f"{target.what} deleted"]


def delete_pool(target: Target, actor: str) -> list[str]:
    pool_delete(pool=target.obj, actor=actor)  # its claims release (drain, delete the Node, clean the host)
    return [f"{target.what} deleted"]


def delete_tenant(target: Target, actor: str) -> list[str]:
    if tenant_delete(tenant=target.obj, actor=actor):
        return [f"{target.what} deleted"]
    releasing = target.obj.claims.exclude(phase="Released").count()
    return [f"{target.what} deleting: {releasing} claim(s) release first, then it goes"]


def delete_node_type(target: Target, actor: str) -> list[str]:
    node_type_delete(node_type=target.obj, actor=actor)
    return [f"{target.what} deleted"]


def delete_provider(target: Target, actor: str) -> list[str]:
    """A NodeProvider goes with its NodeTypes (each refused while a claim uses it)."""
    lines = []
    for node_type in target.obj.node_types.order_by("name"):
        node_type_delete(node_type=node_type, actor=actor)
        lines.append(f"nodetype/{node_type.name} deleted")
    object_delete(target.obj, actor=actor, object_type=ObjectType.NODEPROVIDER)
    return [*lines, f"{target.what} deleted"]


def _plain(object_type: str):
    def delete(target: Target, actor: str) -> list[str]:
        obj = type(target.obj).objects.filter(pk=target.obj.pk).first()
        if obj is not None:  # a tenant's network may have gone with its tenant in this run
            object_delete(obj, actor=actor, object_type=object_type, tenant=getattr(obj, "tenant", None))
        return [f"{target.what} deleted"]

    return delete


def delete_secret(target: Target, actor: str) -> list[str]:
    namespace, name = target.obj
    users = list(BareMetalHost.objects.filter(namespace=namespace, bmc_credentials_name=name)
                 .order_by("name").values_list("name", flat=True)[:5])
    if users:
        raise InUse(f"{target.what} holds the BMC credentials of baremetalhost {', '.join(users)}: delete those "
                    "hosts in the same run, or apply them with another Secret first")
    return [f"{target.what} deleted"]


DELETE = {
    "Secret": delete_secret,
    "NodeProvider": delete_provider,
    "NodeType": delete_node_type,
    "NodeEnvironment": _plain(ObjectType.NODEENVIRONMENT),
    "OSImage": _plain(ObjectType.OSIMAGE),
    "VirtualClusterInstance": delete_tenant,
    "vcluster.yaml": delete_pool,
    "BareMetalHost": delete_host,
}
