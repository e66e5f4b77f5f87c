"""Hosts as JSON: the whole host for those who may see BMC details, a tenant's view without them."""
# Hosts as JSON, in two shapes: the whole host for those who may see BMC details (admins, auditors), and a
# tenant's view of its own nodes without any BMC field. BMC credentials are write-only in both: they are
# set when a host is registered (or rotated), never returned.
from django.db import models
from django.db.models import Prefetch, prefetch_related_objects
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api import NoNulJSONField, StrictModelSerializer, StrictSerializer
from hosts.gate.cleaning import effective_cleaning, node_type_for
from hosts.models import BareMetalHost, EraseCertificate, HealthCheckRun
from hosts.selectors import host_sku_deviations
from pools.models import NodeType

CLAIM_FIELDS = ["claim", "tenant"]


class _ClaimLinks(serializers.Serializer):
    claim = serializers.SerializerMethodField()
    tenant = serializers.SerializerMethodField()

    def get_claim(self, obj) -> str | None:
        claim = _claim(obj)
        return claim.name if claim else None

    def get_tenant(self, obj) -> str | None:
        claim = _claim(obj)
        return claim.tenant.name if claim else None


def _claim(host):
    try:
        return host.claim
    except BareMetalHost.claim.RelatedObjectDoesNotExist:
        return None


EVIDENCE_SHOWN = 20  # the newest erase certificates and health runs of a host, as on its page


class EraseCertificateLinkSerializer(serializers.ModelSerializer):
    certificate_id = serializers.CharField(read_only=True, help_text="the id written on the signed certificate")
    url = serializers.SerializerMethodField(help_text="the signed certificate, exactly as `verify-certificate` "
                                                      "checks it")
    page = serializers.SerializerMethodField(help_text="the printable page")

    class Meta:
        model = EraseCertificate
        fields = ["id", "certificate_id", "disk", "serial", "method", "method_type", "result", "flow_id",
                  "previous_tenant", "created_at", "url", "page"]
        read_only_fields = fields

    def get_url(self, obj) -> str:
        return reverse("certificate-json", args=[obj.pk])

    def get_page(self, obj) -> str:
        return reverse("certificate", args=[obj.pk])


class HealthRunLinkSerializer(serializers.ModelSerializer):
    class Meta:
        model = HealthCheckRun
        fields = ["id", "suite", "verdict", "reasons", "node_type", "flow_id", "created_at"]
        read_only_fields = fields


class EraseCertificateSerializer(EraseCertificateLinkSerializer):
    """A whole certificate: the signed body and its signature (what the signed file holds, and what
    `verify-certificate` checks), never the key that signed it; `key_id` only names that key."""

    host = serializers.IntegerField(source="host_id", read_only=True, allow_null=True,
                                    help_text="the host's id; null once the host is gone (host_name stays)")
    document = serializers.JSONField(read_only=True, help_text="the signed certificate body (NIST SP 800-88 "
                                                               "Rev. 2, Appendix G)")
    signed_file = serializers.SerializerMethodField(help_text="the signed file (as `url`) for token callers")

    class Meta(EraseCertificateLinkSerializer.Meta):
        fields = ["id", "certificate_id", "host", "host_name", "flow_id", "disk", "serial", "model", "method",
                  "method_type", "result", "previous_tenant", "claim_name", "started_at", "ended_at", "created_at",
                  "document", "signature", "key_id", "revoked_at", "revoked_reason", "url", "page", "signed_file"]
        read_only_fields = fields

    def get_signed_file(self, obj) -> str:
        return reverse("api:erase-certificate-signed", args=[obj.pk])


class HealthRunSerializer(HealthRunLinkSerializer):
    """A health run as listed: the verdict, the reasons in the tool's words, per-GPU detail and thresholds."""

    host = serializers.IntegerField(source="host_id", read_only=True, allow_null=True,
                                    help_text="the host's id; null once the host is gone (host_name stays)")

    class Meta(HealthRunLinkSerializer.Meta):
        fields = ["id", "host", "host_name", "flow_id", "suite", "node_type", "verdict", "reasons", "gpus",
                  "thresholds", "exit_code", "duration_s", "created_at"]
        read_only_fields = fields


class HealthRunDetailSerializer(HealthRunSerializer):
    """One health run with the tool's command, raw output and the parser's whole answer."""

    class Meta(HealthRunSerializer.Meta):
        fields = [*HealthRunSerializer.Meta.fields, "command", "raw_output", "raw_json", "parsed"]
        read_only_fields = fields


class EffectiveCleaningSerializer(serializers.Serializer):
    method = serializers.CharField(help_text="metadata, full or secure")
    fallback = serializers.CharField(help_text="empty: none")
    source = serializers.CharField(help_text="host override, the NodeType, or the site's default")
    node_type = serializers.CharField(help_text="the NodeType whose gate applies; empty: none matches")


class _HostList(serializers.ListSerializer):
    """A page of hosts with their newest certificates and health runs: two queries, whatever the page size."""

    def to_representation(self, data):
        hosts = list(data.all() if isinstance(data, models.manager.BaseManager) else data)
        prefetch_related_objects(hosts, *_evidence())
        return super().to_representation(hosts)


def _evidence() -> list[Prefetch]:
    return [Prefetch("erase_certificates", queryset=EraseCertificate.objects.order_by("-pk")[:EVIDENCE_SHOWN],
                     to_attr="newest_certificates"),
            Prefetch("health_runs", queryset=HealthCheckRun.objects.order_by("-pk")
                     .defer("command", "raw_output", "raw_json", "gpus", "parsed", "thresholds")[:EVIDENCE_SHOWN],
                     to_attr="newest_health_runs")]


class HostSerializer(StrictModelSerializer, _ClaimLinks):
    """For admins (who write) and auditors (who read): everything but the credentials, with the host's release
    gate (its effective cleaning method) and its newest erase certificates and health runs."""

    bmc_username = serializers.CharField(write_only=True, required=False, max_length=255,
                                         help_text="write-only; never returned")
    bmc_password = serializers.CharField(write_only=True, required=False, max_length=255,
                                         trim_whitespace=False, style={"input_type": "password"},
                                         help_text="write-only; never returned")
    has_bmc_credentials = serializers.SerializerMethodField()
    effective_cleaning = serializers.SerializerMethodField()
    erase_certificates = serializers.SerializerMethodField()
    health_runs = serializers.SerializerMethodField()
    preflight_tls = serializers.SerializerMethodField(
        help_text="how the last preflight reached the BMC: verified, not verified (disableCertificateVerification) "
                  "or none (plain HTTP)")
    preflight_checks = serializers.SerializerMethodField(
        help_text="the last preflight per check: bmc and boot, each {ok, reason}, and the BMC's quirks")
    warm = serializers.BooleanField(source="is_warm", read_only=True,
                                    help_text="available and on in the agent's ramdisk: a claim skips power-on, "
                                              "network boot and lookup (its NodeType's warm.hosts)")
    kept = serializers.SerializerMethodField(
        help_text="data disks kept by an in-place re-image, and the pool they are held for: {pool: \"tenant/pool\" "
                  "(null: deleted), until, disks: [{disk, serial, role}]}; only that pool's claims may have the host "
                  "until then, and every disk is erased when the hold ends; null: no hold")
    sku_deviations = serializers.SerializerMethodField(
        help_text="how the host's last inventory differs from the SKU of each NodeType that selects it: "
                  "{NodeType: [\"GPUs: 7 of 8 NVIDIA H200\", ...]}; empty: it conforms (or was never inspected)")

    class Meta:
        model = BareMetalHost
        fields = ["id", "name", "namespace", "bmc_address", "bmc_credentials_name", "bmc_username", "bmc_password",
                  "has_bmc_credentials", "bmc_disable_certificate_verification", "boot_mac", "online",
                  "root_device_hints", "labels", "automated_cleaning_mode", "cleaning_policy", "effective_cleaning",
                  "inventory", "sku_deviations", "firmware", "power_state", "state", "state_changed_at",
                  "deadline_at", "error_type", "error_message", "error_count", *CLAIM_FIELDS, "erase_certificates",
                  "health_runs", "preflight_ok", "preflight_checked_at", "preflight_reason", "preflight_tls", "preflight_checks",
                  "warm", "warm_since", "warm_until", "kept", "created_at", "updated_at"]
        read_only_fields = ["inventory", "firmware", "power_state", "state", "state_changed_at", "deadline_at",
                            "error_type", "error_message", "error_count", "preflight_ok", "preflight_checked_at",
                            "preflight_reason", "warm_since", "warm_until", "created_at", "updated_at"]
        extra_kwargs = {"cleaning_policy": {"help_text": "overrides its NodeType's cleaning method; empty: the "
                                                         "NodeType's"},
                        # No generic uniqueness check: full_clean() says which host has the MAC.
                        "boot_mac": {"validators": []}}
        list_serializer_class = _HostList

    # Registered once; what identifies the server and its BMC is not changed in place (apply a
    # BareMetalHost manifest, or take it out and register it again).
    FIXED_AFTER_CREATE = ("name", "namespace", "bmc_address", "boot_mac")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.instance, models.Model):
            for name in self.FIXED_AFTER_CREATE:
                self.fields[name].read_only = True

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_kept(self, obj) -> dict | None:
        if obj.kept_until is None:
            return None
        pool = obj.kept_for_pool
        return {"pool": f"{pool.tenant.name}/{pool.name}" if pool else None, "until": obj.kept_until,
                "disks": obj.kept_disks}

    def get_preflight_tls(self, obj) -> str:
        return ((obj.preflight or {}).get("bmc") or {}).get("tls", "")

    def get_preflight_checks(self, obj) -> dict:
        detail = obj.preflight or {}
        bmc, boot = detail.get("bmc") or {}, detail.get("boot") or {}
        if not detail:
            return {}
        return {"bmc": {"ok": bmc.get("ok"), "reason": bmc.get("reason", "")},
                "boot": {"ok": boot.get("ok"), "reason": boot.get("reason", "")},
                "quirks": bmc.get("quirks") or {}}

    @extend_schema_field(serializers.DictField(child=serializers.ListField(child=serializers.CharField())))
    def get_sku_deviations(self, obj) -> dict:
        return host_sku_deviations(obj, self._node_types())

    def _node_types(self) -> list[NodeType]:
        types = self.context.get("sku_node_types")
        if types is None:  # read once per response, however many hosts it lists
            types = self.context["sku_node_types"] = list(NodeType.objects.all())
        return types

    def get_has_bmc_credentials(self, obj) -> bool:
        return bool(obj.bmc_username and obj.bmc_password)

    @extend_schema_field(EffectiveCleaningSerializer)
    def get_effective_cleaning(self, obj) -> dict:
        """The method the gate will use at the host's next release: the host's override, else its NodeType's
        (hosts.gate.cleaning: the claim's, else the strictest whose selector matches), else the site's default."""
        claim = _claim(obj)
        cleaning = effective_cleaning(obj, node_type=node_type_for(obj, claim, self._node_types()))
        return {key: cleaning[key] for key in ("method", "fallback", "source", "node_type")}

    @extend_schema_field(EraseCertificateLinkSerializer(many=True))
    def get_erase_certificates(self, obj) -> list:
        newest = getattr(obj, "newest_certificates", None)
        if newest is None:
            prefetch_related_objects([obj], _evidence()[0])
            newest = obj.newest_certificates
        return EraseCertificateLinkSerializer(newest, many=True).data

    @extend_schema_field(HealthRunLinkSerializer(many=True))
    def get_health_runs(self, obj) -> list:
        newest = getattr(obj, "newest_health_runs", None)
        if newest is None:
            prefetch_related_objects([obj], _evidence()[1])
            newest = obj.newest_health_runs
        return HealthRunLinkSerializer(newest, many=True).data

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if isinstance(self.instance, models.Model) and isinstance(self.initial_data, dict):
            # Sent again unchanged is fine; another value is refused, never silently ignored.
            changed = {name: [f"is fixed once the host is registered (it is {getattr(self.instance, name)!r})"]
                       for name in self.FIXED_AFTER_CREATE
                       if name in self.initial_data and self.initial_data[name] != getattr(self.instance, name)}
            if changed:
                raise serializers.ValidationError(changed)
        if self.instance is None and not (attrs.get("bmc_username") and attrs.get("bmc_password")):
            raise serializers.ValidationError({"bmc_password": ["a host is registered with its BMC username and "
                                                                "password"]})
        return attrs


class TenantInventoryField(NoNulJSONField):
    """The inventory without NIC MAC addresses: a tenant has no use for them, and a MAC is what an agent
    lookup names (hosts/boot/ramdisk.py), so they stay with the platform's admins."""

    def to_representation(self, value):
        return without_macs(super().to_representation(value))


def without_macs(inventory):
    if not isinstance(inventory, dict) or not isinstance(inventory.get("nics"), list):
        return inventory
    return {**inventory, "nics": [{k: v for k, v in nic.items() if "mac" not in k.lower()} if isinstance(nic, dict)
                                  else nic for nic in inventory["nics"]]}


class TenantHostSerializer(_ClaimLinks, serializers.ModelSerializer):
    """A tenant member's node: what it is and how it is doing; nothing about its BMC or its MAC addresses."""

    inventory = TenantInventoryField(read_only=True)

    class Meta:
        model = BareMetalHost
        fields = ["id", "name", "online", "labels", "inventory", "power_state", "state", "state_changed_at",
                  *CLAIM_FIELDS]
        read_only_fields = fields


HostSerializer.MEMBER_VARIANT = TenantHostSerializer  # the schema: BMC fields are optional (core.api hooks)


class MaintenanceSerializer(StrictSerializer):
    on = serializers.BooleanField(help_text="true: take the host out of service; false: give it back (it registers again)")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class RetrySerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

