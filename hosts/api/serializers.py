"""Hosts as JSON, in two shapes: the whole host for those who may see BMC details (admins, auditors), and a
tenant's view of its own nodes without any BMC field. BMC credentials are write-only in both: they are
set when a host is registered (or rotated), never returned."""
from django.db import models
from rest_framework import serializers

from hosts.models import BareMetalHost
from pools.api.base import NoNulJSONField, StrictModelSerializer, StrictSerializer

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


class HostSerializer(StrictModelSerializer, _ClaimLinks):
    """For admins (who write) and auditors (who read): everything but the credentials."""

    bmc_username = serializers.CharField(write_only=True, required=False, max_length=255,
                                         help_text="write-only; never returned")
    bmc_password = serializers.CharField(write_only=True, required=False, max_length=255,
                                         trim_whitespace=False, style={"input_type": "password"},
                                         help_text="write-only; never returned")
    has_bmc_credentials = serializers.SerializerMethodField()

    class Meta:
        model = BareMetalHost
        fields = ["id", "name", "namespace", "bmc_address", "bmc_credentials_name", "bmc_username", "bmc_password",
                  "has_bmc_credentials", "bmc_disable_certificate_verification", "boot_mac", "online",
                  "root_device_hints", "labels", "automated_cleaning_mode", "inventory", "power_state", "state",
                  "state_changed_at", "deadline_at", "error_type", "error_message", "error_count", *CLAIM_FIELDS,
                  "created_at", "updated_at"]
        read_only_fields = ["inventory", "power_state", "state", "state_changed_at", "deadline_at", "error_type",
                            "error_message", "error_count", "created_at", "updated_at"]

    # Registered once; what identifies the server and its BMC is not changed in place (apply a
    # BareMetalHost manifest, or take it out and register it again).
    FIXED_AFTER_CREATE = ("name", "namespace", "bmc_address", "boot_mac")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if isinstance(self.instance, models.Model):
            for name in self.FIXED_AFTER_CREATE:
                self.fields[name].read_only = True

    def get_has_bmc_credentials(self, obj) -> bool:
        return bool(obj.bmc_username and obj.bmc_password)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None and not (attrs.get("bmc_username") and attrs.get("bmc_password")):
            raise serializers.ValidationError({"bmc_password": ["a host is registered with its BMC username and "
                                                                "password"]})
        return attrs


class TenantHostSerializer(_ClaimLinks, serializers.ModelSerializer):
    """A tenant member's node: what it is and how it is doing; nothing about its BMC."""

    inventory = NoNulJSONField(read_only=True)

    class Meta:
        model = BareMetalHost
        fields = ["id", "name", "online", "labels", "inventory", "power_state", "state", "state_changed_at",
                  *CLAIM_FIELDS]
        read_only_fields = fields


class MaintenanceSerializer(StrictSerializer):
    on = serializers.BooleanField(help_text="true: take the host out of service; false: give it back (it registers again)")
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class RetrySerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

