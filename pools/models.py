"""Where machines come from, what can be ordered, and what each tenant asks for."""
import ipaddress
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from core.crypto import EncryptedTextField
from core.labels import field_error, validate_labels, validate_taints
from core.limits import node_count_error

from .choices import (
    DEFAULT_LADDERS,
    ChecksumType,
    CleaningPolicy,
    FabricKind,
    ImageFormat,
    InspectionMode,
    JoinMode,
    PoolKind,
    ProviderKind,
)
from .erase_rules import check_disk_rules, check_keep_disks
from .firmware import check_firmware
from .gpu import check_gpu
from .health_tiers import check_health
from .matching import validate_label_selector, validate_requirements
from .sku import check_sku
from .validators import (
    NETWORK_DATA,
    check_disruption,
    check_fabric_ranges,
    check_host_selector,
    check_node_type_selector,
    check_quantities,
    check_repair,
    check_taints,
    collect,
    fabric_value_text,
    parse_ip_ranges,
    parse_quantity,
    validate_disruption,
    validate_dns_label,
    validate_duration,
    validate_group,
    validate_limits,
    validate_network_data,
    validate_object_name,
    validate_string_map,
    validate_topology,
)

NODE_TYPE_PROPERTY = "vcluster.com/node-type"
PROVIDER_PROPERTY = "vcluster.com/node-provider"
OS_IMAGE_PROPERTY = "vcluster.com/os-image"
SERVER_NAME_PROPERTY = "metal3.vcluster.com/server-name"
EXTENDED_RESOURCE_COST = 10000


def external_provider_q(prefix: str = "") -> Q:
    """NodeProvider.external as a filter; `prefix` reaches the provider from another model ("provider__")."""
    return ~Q(**{f"{prefix}kind": ProviderKind.METAL3}) | Q(**{f"{prefix}config__has_key": "clusterRef"})


class NodeProvider(models.Model):
    name = models.CharField(max_length=253, unique=True, validators=[validate_object_name])
    kind = models.CharField(max_length=32, choices=ProviderKind.choices, default=ProviderKind.METAL3)
    display_name = models.CharField(max_length=200, blank=True)
    properties = models.JSONField(default=dict, blank=True)
    # The rest of the provider block as written (clusterRef, deploy, ...), kept for export.
    config = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def external(self) -> bool:
        """Its machines come from elsewhere (machines/: KubeVirt, a Metal3 cluster's BareMetalHosts, OpenTofu), not
        from the console's own conductor: a metal3 provider with a clusterRef, or any other kind."""
        return self.kind != ProviderKind.METAL3 or "clusterRef" in (self.config or {})

    def clean(self):
        errors = {}
        collect(errors, "properties", lambda: validate_string_map(self.properties, "properties"),
                lambda: check_fabric_ranges(self.properties))
        # Export writes it back as the provider block: a mapping such as {clusterRef: ..., deploy: ...}.
        collect(errors, "config", lambda: _check_mapping(self.config, "a mapping (the rest of the metal3 block)"),
                lambda: _check_derive_labels(self.config))
        if errors:
            raise ValidationError(errors)


WARM_MAX_HOSTS = 100_000  # hosts/flows/warm.py: how many hosts of a type may be kept warm, and for how long idle
WARM_MAX_IDLE_MINUTES = 366 * 24 * 60


class NodeType(models.Model):
    name = models.CharField(max_length=253, unique=True, validators=[validate_object_name])
    provider = models.ForeignKey(NodeProvider, on_delete=models.PROTECT, related_name="node_types")
    display_name = models.CharField(max_length=200, blank=True)
    zone = models.CharField(max_length=100, blank=True)
    region = models.CharField(max_length=100, blank=True)
    properties = models.JSONField(default=dict, blank=True)
    resources = models.JSONField(default=dict, blank=True)  # {"cpu": "64", "memory": "2Ti", "nvidia.com/gpu": "8"}
    cost = models.PositiveIntegerField(null=True, blank=True)
    # Kubernetes LabelSelector over BareMetalHost labels: {"matchLabels": {"role": "gpu"}}.
    host_selector = models.JSONField(default=dict, blank=True)
    # Declared inside its NodeProvider's spec.metal3.nodeTypes (exported there again).
    declared_in_provider = models.BooleanField(default=False)
    # The release gate (hosts/gate/cleaning.py): how a host of this type is erased and verified before it is
    # handed to anyone again, and which GPU health suite it must pass. A host may override the method.
    cleaning_policy = models.CharField(max_length=16, choices=CleaningPolicy.choices, default=CleaningPolicy.FULL)
    cleaning_fallback = models.CharField(max_length=16, choices=CleaningPolicy.choices, blank=True, default="",
                                         help_text="used, and recorded, when the method cannot run; blank: none")
    erase_concurrency = models.PositiveSmallIntegerField(default=4, help_text="disks erased at once")
    erase_verify_share = models.FloatField(default=0.01, help_text="share of each disk read back (0.01 = 1%)")
    erase_verify_full = models.BooleanField(default=False, help_text="read every byte back instead of a sample")
    # Per disk (pools/erase_rules.py): the OS disk's and data disks' methods for a re-image of the same pool, and
    # which data disks a pool may keep then. A host that may go to another tenant gets every disk purged anyway.
    cleaning_disks = models.JSONField(default=list, blank=True)
    health_dcgm_level = models.PositiveSmallIntegerField(default=2, help_text="dcgmi diag -r N; 0: not run")
    health_nccl_min_busbw_gbps = models.FloatField(null=True, blank=True,
                                                   help_text="all_reduce_perf busbw at 8 GiB; blank: not run")
    # What each server of this type must have (pools/sku.py): GPU model and count, memory, NVMe, NICs, firmware.
    # Inspection results are compared with it; a host that deviates goes to repair, never to the pool as this type.
    sku = models.JSONField(default=dict, blank=True)
    # The health tiers (pools/health_tiers.py): handover, release, intake and idle checks, each with its suite,
    # thresholds and time budget. Release defaults to the health_* fields above; the others run when declared.
    health = models.JSONField(default=dict, blank=True)
    # BIOS settings its hosts must have and minimum firmware versions (pools/firmware.py): applied at intake and before a
    # provision, verified after the reboot (hosts/flows/firmware.py); a setting that does not stick sends the host to repair.
    firmware = models.JSONField(default=dict, blank=True)
    # The state its GPUs are handed over in (pools/gpu.py): MIG layout (none by default) and persistence mode; the
    # release gate resets every GPU to it and checks it (hosts/gate/gpu_state.py).
    gpu = models.JSONField(default=dict, blank=True)
    # An external provider's per-type block as written (machines/kinds): kubeVirt's virtualMachineTemplate,
    # mergeVirtualMachineTemplate and maxCapacity; terraform's nodeTemplate and maxCapacity. metal3 uses host_selector.
    provider_config = models.JSONField(default=dict, blank=True)
    # The repair ladder of its hosts (hosts/flows/repair.py): {"automatic": bool, "ladders": {kind: [remedy, ...]}};
    # {}: automatic, every kind on its default ladder (pools.choices.DEFAULT_LADDERS).
    repair = models.JSONField(default=dict, blank=True)
    # Warm hosts (hosts/flows/warm.py): how many hosts of this type stay powered on in the agent's ramdisk after a
    # passing release gate, ready to write an image at once, and for how long an idle one stays on.
    # Where its hosts' inventories come from (a host's own inspection_mode wins); "": agent.
    inspection_mode = models.CharField(max_length=8, choices=InspectionMode.choices, blank=True, default="")
    warm_hosts = models.PositiveIntegerField(default=0, validators=[MaxValueValidator(WARM_MAX_HOSTS)],
                                             help_text="hosts kept warm; 0: none")
    warm_idle_minutes = models.PositiveIntegerField(default=30, validators=[MinValueValidator(1),
                                                                            MaxValueValidator(WARM_MAX_IDLE_MINUTES)],
                                                    help_text="a warm host idle this long is powered off")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self):
        errors = {}
        if self.cleaning_fallback and self.cleaning_fallback == self.cleaning_policy:
            errors["cleaning_fallback"] = ["a fallback must differ from the method"]
        if _number(self.erase_concurrency) and self.erase_concurrency < 1:
            errors["erase_concurrency"] = ["at least 1 disk at a time"]
        # Values that are not numbers at all are reported by clean_fields(); here, their range.
        if _number(self.erase_verify_share) and not 0 < self.erase_verify_share <= 1:
            errors["erase_verify_share"] = ["between 0 (excluded) and 1, e.g. 0.01 for 1%"]
        if node_count_error(self.warm_hosts):
            errors["warm_hosts"] = [node_count_error(self.warm_hosts)]
        if _number(self.health_dcgm_level) and self.health_dcgm_level > 4:
            errors["health_dcgm_level"] = ["dcgmi diag levels are 1 to 4 (0: not run)"]
        busbw = self.health_nccl_min_busbw_gbps
        if _number(busbw) and not 0 < busbw < float("inf"):
            errors["health_nccl_min_busbw_gbps"] = ["a bus bandwidth in GB/s above 0, e.g. 400; empty: NCCL not run"]
        collect(errors, "properties", lambda: validate_string_map(self.properties, "properties"))
        collect(errors, "sku", lambda: check_sku(self.sku))
        collect(errors, "health", lambda: check_health(self.health))
        collect(errors, "firmware", lambda: check_firmware(self.firmware))
        collect(errors, "gpu", lambda: check_gpu(self.gpu))
        collect(errors, "repair", lambda: check_repair(self.repair))
        collect(errors, "cleaning_disks", lambda: check_disk_rules(self.cleaning_disks))
        collect(errors, "host_selector", lambda: check_host_selector(self.host_selector),
                lambda: validate_label_selector(self.host_selector))
        collect(errors, "resources",
                lambda: _check_mapping(self.resources, "a mapping such as {cpu: '64', memory: '512Gi'}"),
                lambda: check_quantities(self.resources))
        if errors:
            raise ValidationError(errors)

    def effective_properties(self) -> dict:
        """Built-in properties first (as vCluster sets them), explicit ones override."""
        props = {NODE_TYPE_PROPERTY: self.name, PROVIDER_PROPERTY: self.provider.name}
        if self.zone:
            props["topology.kubernetes.io/zone"] = self.zone
        return {**props, **self.properties}

    def repair_ladder(self, kind: str) -> list[str]:
        """The remedies a host of this type climbs for a failure of `kind`, in order; [] when none is automatic."""
        config = self.repair or {}
        if config.get("automatic") is False:
            return []
        ladders = config.get("ladders") or {}
        return list(ladders[kind] if kind in ladders else DEFAULT_LADDERS.get(kind, DEFAULT_LADDERS["unknown"]))

    def effective_cost(self) -> int:
        """vCluster's default when unset: 10 per CPU, 2 per GB of memory, 10000 per other resource."""
        if self.cost is not None:
            return self.cost
        total = 0.0
        for key, value in self.resources.items():
            amount = parse_quantity(value)
            if key == "cpu":
                total += 10 * amount
            elif key == "memory":
                total += 2 * amount / 1e9
            else:
                total += EXTENDED_RESOURCE_COST * amount
        return int(round(total))


def _check_derive_labels(config: dict) -> None:
    if "deriveLabels" in config and not isinstance(config["deriveLabels"], bool):
        raise ValidationError([field_error(("deriveLabels",), f"must be true or false, not {config['deriveLabels']!r}")])


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_mapping(value, what: str) -> None:
    if not isinstance(value, dict):
        raise ValidationError(f"must be {what}")


@dataclass(frozen=True)
class Network:
    interface: ipaddress.IPv4Interface  # gateway address with the prefix, e.g. 10.0.0.1/24
    ranges: list
    dns: list[str]

    @property
    def gateway(self):
        return self.interface.ip

    @property
    def pools(self) -> list:
        """The ranges addresses are handed out from: the ip-range's, or without one the whole network but its
        network and broadcast addresses (the gateway is never handed out either way: `addresses`)."""
        if self.ranges:
            return self.ranges
        net = self.interface.network
        if net.num_addresses <= 2:
            return [(net.network_address, net.broadcast_address)]
        return [(net.network_address + 1, net.broadcast_address - 1)]

    def addresses(self):
        """Every address that may be handed out, lowest first."""
        gateway = self.gateway
        for first, last in self.pools:
            for value in range(int(first), int(last) + 1):
                address = ipaddress.ip_address(value)
                if address != gateway:
                    yield address

    def size(self) -> int:
        total = sum(int(last) - int(first) + 1 for first, last in self.pools)
        return total - sum(1 for first, last in self.pools if first <= self.gateway <= last)


class NodeEnvironment(models.Model):
    name = models.CharField(max_length=253, validators=[validate_object_name])
    namespace = models.CharField(max_length=63, default="p-default", validators=[validate_dns_label])
    display_name = models.CharField(max_length=200, blank=True)
    provider = models.ForeignKey(NodeProvider, null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="environments")
    tenant = models.ForeignKey("Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="environments")
    properties = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    CIDR = "metal3.vcluster.com/network-cidr"
    IP_RANGE = "metal3.vcluster.com/network-ip-range"
    DNS = "metal3.vcluster.com/dns-servers"

    class Meta:
        ordering = ["namespace", "name"]
        constraints = [models.UniqueConstraint(fields=["namespace", "name"], name="uniq_environment_name")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    def clean(self):
        validate_string_map(self.properties, "properties")
        try:
            check_fabric_ranges(self.properties)
            if self.properties.get(NETWORK_DATA):
                validate_network_data(self.properties[NETWORK_DATA])
            if self.CIDR in self.properties or self.IP_RANGE in self.properties:
                self._check_overlaps(self.network())
        except ValidationError as exc:
            raise ValidationError({"properties": exc.messages}) from None

    def _check_overlaps(self, network: "Network | None") -> None:
        """Two environments on one network (the same CIDR, or networks that overlap) must not share an address
        they both hand out: each would give it to a node of its own."""
        if network is None:
            return
        others = NodeEnvironment.objects.exclude(pk=self.pk).order_by("namespace", "name")
        for other in others:
            try:
                theirs = other.network()
            except ValidationError:
                continue
            if theirs is None or not network.interface.network.overlaps(theirs.interface.network):
                continue
            for first, last in network.pools:
                for their_first, their_last in theirs.pools:
                    if max(first, their_first) <= min(last, their_last):
                        mine = self.properties.get(self.IP_RANGE) and self.IP_RANGE or self.CIDR
                        raise ValidationError(
                            f"{mine}: {_span(first, last)} overlaps NodeEnvironment {other} ({_span(their_first, their_last)}"
                            f" on {theirs.interface.network}): NodeEnvironment {self.namespace}/{self.name} and "
                            f"NodeEnvironment {other} would hand out the same addresses; give each its own range")

    def network(self) -> Network | None:
        cidr = self.properties.get(self.CIDR)
        if not cidr:
            if self.IP_RANGE in self.properties:
                raise ValidationError(f"{self.IP_RANGE} needs {self.CIDR} too")
            return None
        try:
            interface = ipaddress.ip_interface(cidr)
        except ValueError:
            raise ValidationError(f"{self.CIDR}: {cidr!r} is not an address with prefix such as 10.0.0.1/24") from None
        ranges = parse_ip_ranges(self.properties.get(self.IP_RANGE, ""))
        for first, last in ranges:
            if first not in interface.network or last not in interface.network:
                raise ValidationError(f"{self.IP_RANGE}: {first}-{last} is outside {interface.network}")
        dns = [d.strip() for d in self.properties.get(self.DNS, "").split(",") if d.strip()]
        for server in dns:
            try:
                ipaddress.ip_address(server)
            except ValueError:
                raise ValidationError(f"{self.DNS}: {server!r} is not an IP address") from None
        return Network(interface=interface, ranges=ranges, dns=dns)


def _span(first, last) -> str:
    return str(first) if first == last else f"{first}-{last}"


CHECKSUM_LENGTHS = {32: ChecksumType.MD5, 64: ChecksumType.SHA256, 128: ChecksumType.SHA512}


class OSImage(models.Model):
    name = models.CharField(max_length=253, unique=True, validators=[validate_object_name])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    url = models.CharField(max_length=2000)
    checksum = models.CharField(max_length=128)
    checksum_type = models.CharField(max_length=8, choices=ChecksumType.choices, blank=True)  # detected in clean()
    format = models.CharField(max_length=8, choices=ImageFormat.choices, default=ImageFormat.RAW)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    properties = models.JSONField(default=dict, blank=True)  # any further properties, kept as written
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    URL = "metal3.vcluster.com/image-url"
    CHECKSUM = "metal3.vcluster.com/image-checksum"
    CHECKSUM_TYPE = "metal3.vcluster.com/image-checksum-type"

    class Meta:
        ordering = ["name"]
        verbose_name = "OS image"

    def __str__(self) -> str:
        return self.name

    def clean(self):
        errors = {}
        collect(errors, "properties", lambda: validate_string_map(self.properties, "properties"))
        if not self.url.startswith(("http://", "https://", "file://")):
            errors["url"] = f"{self.url!r} is not an http(s) or file URL"
        checksum = (self.checksum or "").strip().lower()
        if not checksum:
            errors["checksum"] = "a checksum is required: an image is never written unverified"
        elif not all(c in "0123456789abcdef" for c in checksum):
            errors["checksum"] = "must be hexadecimal"
        elif not self.checksum_type:
            detected = CHECKSUM_LENGTHS.get(len(checksum))
            if detected is None:
                errors["checksum"] = f"cannot tell the checksum type from its length ({len(checksum)})"
            self.checksum_type = detected or ""
        elif CHECKSUM_LENGTHS.get(len(checksum)) != self.checksum_type:
            errors["checksum"] = f"a {self.checksum_type} checksum has {_hex_length(self.checksum_type)} hex digits"
        self.checksum = checksum
        if errors:
            raise ValidationError(errors)


def _hex_length(kind: str) -> int:
    return {v: k for k, v in CHECKSUM_LENGTHS.items()}[kind]


class Tenant(models.Model):
    """A VirtualClusterInstance: one tenant with its own Kubernetes API."""

    name = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    namespace = models.CharField(max_length=63, default="p-default", validators=[validate_dns_label])
    display_name = models.CharField(max_length=200, blank=True)
    api_endpoint = models.CharField(max_length=300, blank=True, help_text="host:port of the tenant API (its VIP)")
    kubeconfig = EncryptedTextField(blank=True)
    join_mode = models.CharField(max_length=16, choices=JoinMode.choices, default=JoinMode.VCLUSTER)
    quota_nodes = models.PositiveIntegerField(null=True, blank=True, help_text="most nodes at once; empty: no limit")
    private_nodes_enabled = models.BooleanField(default=True)
    # Each autoNodes entry's properties, by provider name: {"metal3": {"vcluster.com/os-image": "..."}}.
    provider_properties = models.JSONField(default=dict, blank=True)
    # Set when the tenant is deleted while it still holds nodes: its pools are gone, its claims release
    # (drain, clean), and the tenant row goes once every claim is Released (pools.services.tenants_finalize).
    deleting_since = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "tenant"  # a VirtualClusterInstance: the class's docstring says so
        verbose_name_plural = "tenants"

    def __str__(self) -> str:
        return self.name

    def clean(self):
        if not isinstance(self.provider_properties, dict):
            raise ValidationError({"provider_properties": "must map provider names to properties"})
        for provider, props in self.provider_properties.items():
            try:
                validate_string_map(props, f"properties of {provider}")
            except ValidationError as exc:
                raise ValidationError({"provider_properties": exc.messages}) from None


class NodePool(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=63, validators=[validate_dns_label])
    provider = models.ForeignKey(NodeProvider, on_delete=models.PROTECT, related_name="pools")
    kind = models.CharField(max_length=8, choices=PoolKind.choices, default=PoolKind.STATIC)
    quantity = models.PositiveIntegerField(null=True, blank=True)  # static pools
    node_type_selector = models.JSONField(default=list, blank=True)
    node_labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    termination_grace_period = models.CharField(max_length=32, blank=True, validators=[validate_duration])
    profile = models.CharField(max_length=100, blank=True)
    # Dynamic pools.
    limits = models.JSONField(default=dict, blank=True)
    disruption = models.JSONField(default=dict, blank=True)
    expire_after = models.CharField(max_length=32, blank=True, validators=[validate_duration])
    weight = models.IntegerField(null=True, blank=True)
    # Where the pool's nodes sit (validate_topology): {"sameRailGroup": true} and/or {"sameRack": true}.
    topology = models.JSONField(default=dict, blank=True)
    # All-or-nothing groups (validate_group): {"size": 4, "onMemberFailure": "Replace" | "ReleaseGroup"}.
    group = models.JSONField(default=dict, blank=True)
    # The data disk roles (its NodeType's `cleaning.disks`) kept on a re-image of this pool (pools/erase_rules.py):
    # never on a release that may take the host to another tenant.
    keep_disks = models.JSONField(default=list, blank=True)
    # Optimistic concurrency: bumped on every change.
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="uniq_pool_name_per_tenant")]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.name}"

    @property
    def properties(self) -> dict:
        return dict(self.tenant.provider_properties.get(self.provider.name, {}))

    def clean(self):
        errors = {}
        if self.tenant_id and self.tenant.deleting_since is not None:
            errors["tenant"] = f"tenant {self.tenant.name} is being deleted: its pools cannot change"
        if self.kind == PoolKind.STATIC:
            if self.quantity is None:
                errors["quantity"] = "a static pool needs a quantity"
            elif self.quantity < 0:
                errors["quantity"] = "must be 0 or more"
            elif node_count_error(self.quantity):
                errors["quantity"] = node_count_error(self.quantity)
            if isinstance(self.disruption, dict) and set(self.disruption) - {"budgets"}:
                errors["disruption"] = [("a static pool's disruption has budgets only (its drift roll), not "
                                         f"{', '.join(sorted(set(self.disruption) - {'budgets'}))}")]
        elif self.quantity is not None:
            errors["quantity"] = "a dynamic pool has limits, not a quantity"
        # Shapes first (a number where a list belongs is an error, not a TypeError), then the meaning.
        collect(errors, "node_type_selector", lambda: check_node_type_selector(self.node_type_selector),
                lambda: validate_requirements(self.node_type_selector))
        collect(errors, "node_labels", lambda: validate_string_map(self.node_labels, "nodeLabels"),
                lambda: validate_labels(self.node_labels))
        collect(errors, "taints", lambda: check_taints(self.taints), lambda: validate_taints(self.taints))
        collect(errors, "disruption", lambda: check_disruption(self.disruption),
                lambda: validate_disruption(self.disruption))
        collect(errors, "limits", lambda: check_quantities(self.limits), lambda: validate_limits(self.limits))
        collect(errors, "topology", lambda: validate_topology(self.topology))
        collect(errors, "group", lambda: validate_group(self.group))
        collect(errors, "keep_disks", lambda: check_keep_disks(self.keep_disks))
        size = self.group_size
        if (self.kind == PoolKind.STATIC and size and "group" not in errors and isinstance(self.quantity, int)
                and "quantity" not in errors and self.quantity % size):
            errors["quantity"] = (f"a pool of groups of {size} asks for whole groups: {self.quantity} is not a "
                                  f"multiple of {size}")
        if errors:
            raise ValidationError(errors)

    @property
    def group_size(self) -> int:
        """Members of each all-or-nothing group; 0: the pool's claims are placed one by one."""
        size = (self.group or {}).get("size") if isinstance(self.group, dict) else None
        return size if isinstance(size, int) and not isinstance(size, bool) else 0

    def shared_topology(self) -> tuple[str, ...]:
        """What every node of the pool shares, as `topology` says (hosts.topology.Topology fields)."""
        topology = self.topology if isinstance(self.topology, dict) else {}
        return tuple(key for key, flag in (("rack", "sameRack"), ("rail_group", "sameRailGroup"))
                     if topology.get(flag) is True)

    def group_shares(self) -> tuple[str, ...]:
        """What the members of one group share: the pool's `topology`, else one rail group."""
        return self.shared_topology() or ("rail_group",)


class TenantMembership(models.Model):
    """A user who belongs to a tenant: sees that tenant's pools, claims and nodes only; as its admin also
    changes its pools and quantities and joins nodes, as its viewer only reads (core.scoping)."""

    class Role(models.TextChoices):
        ADMIN = "admin", "tenant admin"
        VIEWER = "viewer", "tenant viewer"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="tenant_memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ADMIN,
                            help_text="admin: changes the tenant's pools and joins nodes; viewer: reads only")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "user"], name="uniq_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} ({self.role})"


class FabricPartition(models.Model):
    """A tenant's share of the fabric between its servers: a VLAN id or an InfiniBand partition key, taken
    from the range its NodeEnvironment (or NodeProvider) configures when its first node is provisioned, and
    kept until the tenant is deleted (pools.fabric). The console records and exports it; the network side's
    tool configures the switches."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="fabric_partitions")
    kind = models.CharField(max_length=16, choices=FabricKind.choices)
    value = models.PositiveIntegerField()
    # Where the range came from, as a person finds it: "NodeEnvironment p-default/servers 100-199".
    source = models.CharField(max_length=300, blank=True)
    since = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["tenant__name", "kind"]
        constraints = [
            # No two tenants share a value, and a tenant holds one partition of each kind.
            models.UniqueConstraint(fields=["kind", "value"], name="uniq_fabric_partition_value"),
            models.UniqueConstraint(fields=["tenant", "kind"], name="uniq_fabric_partition_per_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.label} for {self.tenant_id and self.tenant.name}"

    @property
    def value_text(self) -> str:
        return fabric_value_text(self.kind, self.value)

    @property
    def label(self) -> str:
        return f"{'VLAN' if self.kind == FabricKind.VLAN else 'P_Key'} {self.value_text}"
