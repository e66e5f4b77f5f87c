"""`export`: every object `apply` accepts, written back as manifests, in a stable order and form, so
that export → apply on an empty database → export gives the same text (secrets excepted)."""
import base64

import yaml

from hosts.models import BareMetalHost
from machines.clusters import secret_data
from machines.models import ProviderSecret
from pools.choices import PoolKind
from pools.fabric import fabric_partitions_text
from pools.models import NodeEnvironment, NodeProvider, NodeType, OSImage, Tenant
from pools.selectors import labels_derived
from pools.sku import DERIVED_LABELS
from pools.validators import NETWORK_DATA

from .apply import (
    ANNOTATION_PREFIX,
    CLEANING,
    CLEANING_ANNOTATION,
    FABRIC_ANNOTATION,
    HEALTH_CHECK,
    KIND_OF_BLOCK,
    LOFT,
    METAL3,
    REDACTED,
    WARM,
)


class _Dumper(yaml.SafeDumper):
    pass


def _str_representer(dumper, data):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_representer)


def dump(data) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000, allow_unicode=True)


def _put(mapping: dict, key: str, value) -> None:
    if value not in (None, "", {}, []):
        mapping[key] = value


def _node_type_body(t: NodeType) -> dict:
    body: dict = {}
    _put(body, "displayName", t.display_name)
    _put(body, "zone", t.zone)
    _put(body, "region", t.region)
    _put(body, "resources", dict(sorted(t.resources.items())))
    _put(body, "cost", t.cost)
    _put(body, "properties", dict(sorted(t.properties.items())))
    if t.host_selector:
        body["bareMetalHosts"] = {"selector": t.host_selector}
    _put(body, "sku", t.sku)
    _put(body, "health", t.health)
    # Written even when they are the defaults: a backup that does not depend on the defaults of the version
    # that restores it.
    body["cleaning"] = {key: _number(getattr(t, field)) for key, field in CLEANING.items()
                        if getattr(t, field) not in (None, "")}
    if t.cleaning_disks:
        body["cleaning"]["disks"] = t.cleaning_disks
    body["healthCheck"] = {key: _number(getattr(t, field)) for key, field in HEALTH_CHECK.items()
                           if getattr(t, field) is not None}
    _put(body, "repair", t.repair)  # only what was written: kinds left out climb the default ladder
    if t.firmware:  # settings by name: the same text whatever order the database keeps a JSON object in
        body["firmware"] = {**({"settings": dict(sorted(t.firmware["settings"].items()))}
                               if t.firmware.get("settings") else {}),
                            **({"components": t.firmware["components"]} if t.firmware.get("components") else {})}
    _put(body, "gpu", t.gpu)
    if t.warm_hosts:
        body["warm"] = {key: getattr(t, field) for key, field in WARM.items()}
    _put(body, "inspectionMode", t.inspection_mode)
    body.update(sorted(t.provider_config.items()))  # an external provider's per-type block, as written
    return body


def _number(value):
    """400.0 → 400: written as it would be typed (and read back to the same stored value)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def export_documents(*, include_secrets: bool = False) -> list[dict]:
    docs = [_provider_secret(secret, include_secrets) for secret in ProviderSecret.objects.all()]
    for provider in NodeProvider.objects.prefetch_related("node_types"):
        block = dict(sorted(provider.config.items()))
        inline = sorted((t for t in provider.node_types.all() if t.declared_in_provider), key=lambda t: t.name)
        if inline:
            block["nodeTypes"] = [{"name": t.name, **_node_type_body(t)} for t in inline]
        spec: dict = {}
        _put(spec, "displayName", provider.display_name)
        _put(spec, "properties", dict(sorted(provider.properties.items())))
        spec[next(b for b, k in KIND_OF_BLOCK.items() if k == provider.kind)] = block
        docs.append({"apiVersion": LOFT, "kind": "NodeProvider", "metadata": {"name": provider.name}, "spec": spec})
    for t in NodeType.objects.filter(declared_in_provider=False).select_related("provider"):
        docs.append({"apiVersion": LOFT, "kind": "NodeType", "metadata": {"name": t.name},
                     "spec": {"providerRef": t.provider.name, **_node_type_body(t)}})
    for env in NodeEnvironment.objects.select_related("provider", "tenant"):
        spec = {}
        _put(spec, "displayName", env.display_name)
        if env.provider:
            spec["providerRef"] = env.provider.name
        if env.tenant:
            spec["vClusterRef"] = {"name": env.tenant.name}
        _put(spec, "properties", dict(sorted(env.properties.items())))
        docs.append({"apiVersion": LOFT, "kind": "NodeEnvironment",
                     "metadata": {"name": env.name, "namespace": env.namespace}, "spec": spec})
    for image in OSImage.objects.all():
        spec = {}
        _put(spec, "displayName", image.display_name)
        _put(spec, "description", image.description)
        spec["format"] = image.format
        spec["properties"] = {OSImage.URL: image.url, OSImage.CHECKSUM: image.checksum,
                              OSImage.CHECKSUM_TYPE: image.checksum_type, **dict(sorted(image.properties.items()))}
        docs.append({"apiVersion": LOFT, "kind": "OSImage", "metadata": {"name": image.name}, "spec": spec})
    for tenant in Tenant.objects.prefetch_related("pools__provider", "fabric_partitions"):
        docs.append(_virtual_cluster_instance(tenant))
    secrets_written = set()
    hosts = list(BareMetalHost.objects.all())
    for host in hosts:
        key = (host.namespace, host.bmc_credentials_name)
        if host.bmc_credentials_name and key not in secrets_written:
            secrets_written.add(key)
            docs.append(_secret(host, include_secrets))
    # Labels that inspection derived (deriveLabels) are the inventory's, not the manifest's: left out.
    derived = set(DERIVED_LABELS) if labels_derived() else set()
    for host in hosts:
        docs.append(_bare_metal_host(host, derived))
    return docs


def export_text(*, include_secrets: bool = False) -> str:
    return "".join("---\n" + dump(doc) for doc in export_documents(include_secrets=include_secrets))


def private_nodes_config(tenant: Tenant) -> dict:
    """The tenant's pools as vcluster.yaml's privateNodes, in the current list form."""
    by_provider: dict[str, dict] = {}
    for name, props in sorted(tenant.provider_properties.items()):
        by_provider[name] = {"provider": name, "properties": dict(sorted(props.items()))}
    for pool in sorted(tenant.pools.all(), key=lambda p: (p.provider.name, p.kind, p.name)):
        entry = by_provider.setdefault(pool.provider.name, {"provider": pool.provider.name})
        entry.setdefault(pool.kind, []).append(_pool(pool))
    config = {"enabled": tenant.private_nodes_enabled}
    if by_provider:
        config["autoNodes"] = [by_provider[k] for k in sorted(by_provider)]
    return {"privateNodes": config}


def _pool(pool) -> dict:
    body = {"name": pool.name}
    if pool.kind == PoolKind.STATIC:
        body["quantity"] = pool.quantity
        _put(body, "disruption", pool.disruption)  # its drift roll's budgets
    _put(body, "nodeTypeSelector", pool.node_type_selector)
    _put(body, "nodeLabels", dict(sorted(pool.node_labels.items())))
    _put(body, "taints", pool.taints)
    _put(body, "terminationGracePeriod", pool.termination_grace_period)
    _put(body, "profile", pool.profile)
    _put(body, "topology", dict(sorted(pool.topology.items())))
    _put(body, "group", dict(sorted(pool.group.items())))
    if pool.keep_disks:
        body["cleaning"] = {"keepOnReimage": pool.keep_disks}
    if pool.kind == PoolKind.DYNAMIC:
        _put(body, "limits", dict(sorted(pool.limits.items())))
        _put(body, "disruption", pool.disruption)
        _put(body, "expireAfter", pool.expire_after)
        _put(body, "weight", pool.weight)
    return body


def _virtual_cluster_instance(tenant: Tenant) -> dict:
    annotations = {}
    _put(annotations, ANNOTATION_PREFIX + "api-endpoint", tenant.api_endpoint)
    if tenant.join_mode != "vcluster":
        annotations[ANNOTATION_PREFIX + "join-mode"] = tenant.join_mode
    if tenant.quota_nodes is not None:
        annotations[ANNOTATION_PREFIX + "quota-nodes"] = str(tenant.quota_nodes)
    # The tenant's fabric partitions (pools.fabric) for the network side's switch tool, which reads them here
    # (`vlan=100,ib-pkey=0x8001`); apply records them again on a restore.
    _put(annotations, FABRIC_ANNOTATION, fabric_partitions_text(tenant.fabric_partitions.all()))
    metadata = {"name": tenant.name, "namespace": tenant.namespace}
    _put(metadata, "annotations", annotations)
    spec: dict = {}
    _put(spec, "displayName", tenant.display_name)
    spec["template"] = {"helmRelease": {"values": dump(private_nodes_config(tenant))}}
    return {"apiVersion": LOFT, "kind": "VirtualClusterInstance", "metadata": metadata, "spec": spec}


def _provider_secret(secret: ProviderSecret, include_secrets: bool) -> dict:
    metadata = {"name": secret.name, "namespace": secret.namespace}
    _put(metadata, "labels", dict(sorted(secret.labels.items())))
    doc = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque"}
    if include_secrets:
        doc["stringData"] = dict(sorted(secret_data(secret).items()))
    else:
        metadata["annotations"] = {REDACTED: "true"}
    return doc


def _secret(host: BareMetalHost, include_secrets: bool) -> dict:
    metadata = {"name": host.bmc_credentials_name, "namespace": host.namespace}
    doc = {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque"}
    if include_secrets and host.bmc_username:
        doc["data"] = {"username": base64.b64encode(host.bmc_username.encode()).decode(),
                       "password": base64.b64encode(host.bmc_password.encode()).decode()}
    else:
        metadata["annotations"] = {REDACTED: "true"}
    return doc


def _bare_metal_host(host: BareMetalHost, derived: set[str] = frozenset()) -> dict:
    metadata = {"name": host.name, "namespace": host.namespace}
    _put(metadata, "labels", dict(sorted((k, v) for k, v in host.labels.items() if k not in derived)))
    annotations = {}
    if host.cleaning_policy:
        annotations[CLEANING_ANNOTATION] = host.cleaning_policy
    if host.network_data:
        annotations[NETWORK_DATA] = host.network_data
    _put(metadata, "annotations", annotations)
    bmc = {"address": host.bmc_address, "credentialsName": host.bmc_credentials_name}
    if host.bmc_disable_certificate_verification:
        bmc["disableCertificateVerification"] = True
    spec = {"bmc": bmc, "bootMACAddress": host.boot_mac, "online": host.online}
    _put(spec, "rootDeviceHints", host.root_device_hints)
    spec["automatedCleaningMode"] = host.automated_cleaning_mode
    _put(spec, "inspectionMode", host.inspection_mode)
    return {"apiVersion": METAL3, "kind": "BareMetalHost", "metadata": metadata, "spec": spec}
