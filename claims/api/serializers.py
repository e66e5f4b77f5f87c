"""Claims as JSON: what a tenant asked for, which node it got, and where it is in its life."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from claims.models import ClaimGroup, NodeClaim
from claims.presenters import claim_groups_rows
from claims.providers import REBOOT_ANNOTATION, claim_proof, claims_extras
from core.api import NoNulJSONField, StrictSerializer


class ConditionSerializer(serializers.Serializer):
    type = serializers.CharField()
    status = serializers.CharField()
    lastTransitionTime = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(required=False)
    message = serializers.CharField(required=False, help_text="Drifted: what changed since the node was made")


class GroupSummarySerializer(serializers.Serializer):
    """The all-or-nothing group a claim belongs to, as one unit (claims.presenters.claim_groups_rows)."""

    name = serializers.CharField()
    size = serializers.IntegerField()
    state = serializers.CharField(help_text="Waiting, Provisioning, Available, Replacing, Failed, Releasing, Released")
    rack = serializers.CharField()
    rail_group = serializers.CharField()
    reason = serializers.CharField()
    message = serializers.CharField(help_text="why it waits, or what its last member failure did")


class NodeClaimSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.CharField(source="pool_name", read_only=True)
    provider = serializers.SlugRelatedField(slug_field="name", read_only=True)
    node_type = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    host = serializers.CharField(source="host_name", read_only=True)
    conditions = ConditionSerializer(many=True, read_only=True)
    drifted_since = serializers.DateTimeField(
        read_only=True, allow_null=True,
        help_text="since when its node is no longer what its pool would make now (null: it is); see drift")
    drift = serializers.CharField(read_only=True, help_text="what changed: \"OS image ubuntu-a → ubuntu-b; labels: "
                                                            "team=ml added\"; empty when not drifted")
    replacement_of = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True,
        help_text="the claim this one replaces (a drift roll's replacement made first); released once this is "
                  "Available")
    group = serializers.SerializerMethodField(help_text="its all-or-nothing group; null when placed on its own")
    machine = serializers.SerializerMethodField(
        help_text="the machine an external provider made for it (a KubeVirt VirtualMachine, a Metal3 cluster's "
                  "BareMetalHost, an OpenTofu workspace); null for a host of the console's own")
    proof = serializers.SerializerMethodField(
        help_text="which proof exists that its data is not handed on: erase certificates (a host), or what the "
                  "provider does with the disks (destroyed with the machine, another cluster's cleaning)")
    power = serializers.SerializerMethodField(help_text="power.state as vCluster writes it: On, Off or empty")
    annotations = serializers.SerializerMethodField(
        help_text="machines.vcluster.com/reboot: when a reboot was last asked (RFC 3339), as vCluster writes it")

    class Meta:
        model = NodeClaim
        fields = ["id", "name", "namespace", "tenant", "pool", "group", "provider", "node_type", "host", "node_name",
                  "ip_address", "phase", "phase_changed_at", "reason", "message", "attempts", "requirements",
                  "properties", "node_labels", "taints", "conditions", "created_at", "scheduled_at", "provisioned_at",
                  "joined_at", "available_at", "released_at", "drifted_since", "drift", "replacement_of", "machine",
                  "proof", "power", "annotations"]
        read_only_fields = fields

    def _extras(self, obj) -> dict:
        extras = self.context.get("extras")  # the view reads a page's in a fixed number of queries
        if extras is None or obj.pk not in extras["machines"]:
            extras = claims_extras([obj])
        return extras

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_machine(self, obj) -> dict | None:
        machine = self._extras(obj)["machines"][obj.pk]
        if machine is None:
            return None
        return {key: machine[key] for key in ("kind", "name", "namespace", "state", "message", "power", "made",
                                              "outputs", "created_at", "running_at", "gone_at")}

    @extend_schema_field(serializers.JSONField())
    def get_proof(self, obj) -> dict:
        extras = self._extras(obj)
        return claim_proof(obj, extras["machines"][obj.pk], extras["certificates"].get(obj.name, []))

    def get_power(self, obj) -> dict:
        machine = self._extras(obj)["machines"][obj.pk]
        if machine is not None:
            return {"state": machine["power"]}
        host = obj.host if obj.host_id else None
        return {"state": host.power_state if host is not None and host.power_state in ("On", "Off") else ""}

    def get_annotations(self, obj) -> dict:
        reboot = self._extras(obj)["reboots"].get(obj.pk)
        return {REBOOT_ANNOTATION: reboot.isoformat()} if reboot else {}

    @extend_schema_field(GroupSummarySerializer(allow_null=True))
    def get_group(self, obj) -> dict | None:
        if not obj.group_id:
            return None
        groups = self.context.get("groups")  # {id: group with its state}: the view reads a page's in one go
        if groups is None or obj.group_id not in groups:
            groups = {g.pk: g for g in claim_groups_rows(ClaimGroup.objects.filter(pk=obj.group_id))}
        group = groups.get(obj.group_id)
        return GroupSummarySerializer(group).data if group is not None else None


class GroupMemberSerializer(serializers.ModelSerializer):
    host = serializers.CharField(source="host_name", read_only=True)

    class Meta:
        model = NodeClaim
        fields = ["id", "name", "phase", "host", "node_name", "reason", "message"]
        read_only_fields = fields


class ClaimGroupSerializer(serializers.ModelSerializer):
    """An all-or-nothing group: N claims placed together on one rail group (or rack), or none of them."""

    tenant = serializers.SlugRelatedField(slug_field="name", read_only=True)
    pool = serializers.CharField(source="pool_name", read_only=True)
    state = serializers.CharField(read_only=True,
                                  help_text="Waiting, Provisioning, Available, Replacing, Failed, Releasing, Released")
    members = GroupMemberSerializer(source="shown_members", many=True, read_only=True,
                                    help_text="its current members (those being released once replaced are left out)")

    class Meta:
        model = ClaimGroup
        fields = ["id", "name", "tenant", "pool", "size", "state", "on_member_failure", "shares", "rack",
                  "rail_group", "placed_at", "placements", "reason", "message", "members", "created_at"]
        read_only_fields = fields


class ReleaseSerializer(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class AdoptSerializer(StrictSerializer):
    """A server that already runs an OS and serves a tenant's node, to adopt (claims.restore.host_adopt)."""
    name = serializers.CharField(max_length=253, help_text="the host's name: the name of the node it serves")
    bmc_address = serializers.CharField(max_length=500)
    bmc_username = serializers.CharField(max_length=200)
    bmc_password = serializers.CharField(max_length=200, write_only=True, style={"input_type": "password"})
    bmc_disable_certificate_verification = serializers.BooleanField(required=False, default=False)
    boot_mac = serializers.CharField(max_length=17)
    labels = NoNulJSONField(required=False, default=dict)
    tenant = serializers.CharField(required=False, allow_blank=True, default="", max_length=63,
                                   help_text="the tenant whose node it serves (checked)")
    claim = serializers.CharField(required=False, allow_blank=True, default="", max_length=253,
                                  help_text="the claim it serves; default: the node's vmetal.dev/claim label")
class ClaimPowerSerializer(StrictSerializer):
    action = serializers.ChoiceField(choices=["power-cycle", "power-on", "power-off"])
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")
