"""BareMetalHost: one server, its BMC, its hardware and where it is in its life cycle."""
import re

from django.core.exceptions import ValidationError
from django.db import models

from core.crypto import EncryptedTextField
from core.labels import validate_labels
from pools.choices import CleaningPolicy, InspectionMode
from pools.validators import (
    validate_network_data,
    validate_object_name,
    validate_string_map,
)

from .bmc.client import BMCError, is_ipmi, parse_address
from .choices import CleaningMode, HostState, PowerState, RepairOutcome, Verdict

MAC = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")


class BareMetalHost(models.Model):
    name = models.CharField(max_length=253, unique=True, validators=[validate_object_name])
    namespace = models.CharField(max_length=63, default="metal3")
    bmc_address = models.CharField(max_length=500)
    bmc_credentials_name = models.CharField(max_length=253, blank=True)
    bmc_username = EncryptedTextField(blank=True)
    bmc_password = EncryptedTextField(blank=True)
    bmc_disable_certificate_verification = models.BooleanField(default=False)
    boot_mac = models.CharField(max_length=17, unique=True)
    online = models.BooleanField(default=True)
    root_device_hints = models.JSONField(default=dict, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    automated_cleaning_mode = models.CharField(max_length=16, choices=CleaningMode.choices,
                                               default=CleaningMode.METADATA)
    # Overrides its NodeType's cleaning method (hosts/gate/cleaning.py); blank: the NodeType's.
    cleaning_policy = models.CharField(max_length=16, choices=CleaningPolicy.choices, blank=True, default="")
    inventory = models.JSONField(default=dict, blank=True)  # CPUs, RAM, disks, NICs, GPUs from inspection
    # The inventory of record's disks (hosts/gate/census.py): {"disks": [{name, serial, model, size_bytes, type}],
    # "recorded_at", "by"}, from the first inspection (or an imported Metal3 status). Later inspections do not
    # change it; a difference is a deviation until an admin accepts it (hosts.services.host_disk_record_accept).
    disk_record = models.JSONField(default=dict, blank=True)
    # Metal3's inspectionMode (pools.choices.InspectionMode); blank: its NodeType's, else agent.
    inspection_mode = models.CharField(max_length=8, choices=InspectionMode.choices, blank=True, default="")
    # What the BMC itself listed at the last inspection (hosts.bmc.client.BMC.inventory, with "read_at"), kept beside
    # the agent's `inventory`: its drives are a census the agent cannot change (hosts/gate/census.py). {"none":
    # reason} where the BMC lists nothing (an IPMI BMC); {} before the first inspection.
    bmc_inventory = models.JSONField(default=dict, blank=True)
    # What its BMC last said of its BIOS and firmware (hosts/flows/firmware.py), as Metal3's HostFirmwareSettings and
    # HostFirmwareComponents status: {"settings": {name: value}, "pending": {...}, "settings_read_at",
    # "components": [{component, id, name, currentVersion, initialVersion, lastVersionFlashed?, updatedAt?}],
    # "components_read_at"}.
    firmware = models.JSONField(default=dict, blank=True)
    # The `metal3.vcluster.com/network-data` annotation: the node's network configuration as the admin wrote it.
    # Written into its seed as is; the console allocates no address from a NodeEnvironment for this host.
    network_data = models.TextField(blank=True)
    power_state = models.CharField(max_length=8, choices=PowerState.choices, default=PowerState.UNKNOWN)
    # The last contact with the BMC (hosts.services.host_bmc_contact): written by the flows' BMC calls and by the
    # periodic check of available hosts. False ("BMC red"): the host is not allocatable (hosts/capacity.py).
    bmc_ok = models.BooleanField(null=True, blank=True)
    bmc_checked_at = models.DateTimeField(null=True, blank=True)
    bmc_error = models.CharField(max_length=500, blank=True)
    # Preflight (hosts/preflight.py): the BMC network and the provisioning network checked for this host. None:
    # never checked; False ("preflight red"): the host is not allocated (hosts/capacity.py). `preflight` keeps
    # each check's verdict and reason, how TLS went and the BMC's quirks; `preflight_reason` the first red reason.
    preflight_ok = models.BooleanField(null=True, blank=True)
    preflight_checked_at = models.DateTimeField(null=True, blank=True)
    preflight_reason = models.CharField(max_length=500, blank=True)
    preflight = models.JSONField(default=dict, blank=True)
    # Written only by hosts.services.hosts_transition_batch.
    state = models.CharField(max_length=16, choices=HostState.choices, default=HostState.REGISTERING,
                             db_index=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    # Held after a restore (HostState.HELD): the state the restored database gave the host, which the world reconcile
    # holds against the host's real state (claims/restore.py). Empty otherwise.
    held_from = models.CharField(max_length=16, choices=HostState.choices, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, db_index=True)
    error_type = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    error_count = models.PositiveIntegerField(default=0)  # consecutive failures; reset on success
    # The flow that drives the host through its current state (hosts/engine/): its name, run id, the
    # steps done with their times, and the step under way. Resumable: a new worker carries on from here.
    flow = models.JSONField(default=dict, blank=True)
    drive_lease_until = models.DateTimeField(null=True, blank=True)  # one driver at a time
    # Warm (hosts/flows/warm.py): available, powered on in the agent's ramdisk after a passing release gate, its agent
    # idle and heartbeating, so that a claim skips power-on, network boot and lookup. Set by the gate's keep_warm
    # step; emptied by any move out of available and when the host is powered off (idle or its agent silent).
    warm_since = models.DateTimeField(null=True, blank=True, db_index=True)
    warm_until = models.DateTimeField(null=True, blank=True)  # powered off after this, if still idle
    driven_at = models.DateTimeField(null=True, blank=True, db_index=True)
    # A ramdisk boot found raced (hosts/boot/ramdisk.py), not yet dealt with by the host's flow: the next drive, under
    # its lease, boots the host again (read with the row the drive loads anyway: no query of its own).
    raced_boot_id = models.IntegerField(null=True, blank=True)
    # Data disks kept by a re-image of the same pool (hosts/gate/plan.py): the host is that pool's alone until
    # `kept_until`; then, or when the pool is gone or needs it no more, the full erase before anyone else has it
    # (hosts.services.hosts_kept_release). Set before the erase that keeps them; emptied by an erase that keeps
    # nothing, and when the pool's own claim takes the host back. `kept_disks`: [{disk, serial, role}].
    kept_for_pool = models.ForeignKey("pools.NodePool", null=True, blank=True, on_delete=models.SET_NULL,
                                      related_name="+")
    kept_until = models.DateTimeField(null=True, blank=True, db_index=True)
    kept_disks = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "bare-metal host"

    def __str__(self) -> str:
        return self.name

    @property
    def state_colour(self) -> str:
        return HostState.colour(self.state)

    @property
    def held_back(self) -> str:
        """Why a free host cannot be allocated ("" when it can, or is not free): hosts.capacity counts it "Held
        back", never plainly Available, and it needs attention."""
        if self.state not in (HostState.AVAILABLE, HostState.CHECKING):
            return ""
        if self.bmc_ok is False:
            return "its BMC does not answer"
        if self.preflight_ok is False:
            return "its preflight is red"
        return ""

    @property
    def is_warm(self) -> bool:
        """Available and on in the agent's ramdisk, ready for a claim to write its image at once (hosts/flows/warm.py)."""
        return self.state == HostState.AVAILABLE and self.warm_since is not None

    def clean(self):
        errors = {}
        try:
            parse_address(self.bmc_address)
        except BMCError as exc:
            errors["bmc_address"] = exc.message
        mac = (self.boot_mac or "").lower()
        if not MAC.match(mac):
            errors["boot_mac"] = f"{self.boot_mac!r} is not a MAC address such as 52:54:00:12:34:56"
        self.boot_mac = mac
        try:
            validate_string_map(self.labels, "labels")
            validate_labels(self.labels)
        except ValidationError as exc:
            errors["labels"] = exc.error_list
        if self.network_data:
            try:
                validate_network_data(self.network_data)
            except ValidationError as exc:
                errors["network_data"] = exc.error_list
        if not isinstance(self.root_device_hints, dict):
            errors["root_device_hints"] = "must be a mapping such as {deviceName: /dev/nvme0n1}"
        if self.inspection_mode == InspectionMode.FAST and is_ipmi(self.bmc_address):
            errors["inspection_mode"] = ("fast inspection reads the inventory from a Redfish BMC; an ipmi:// BMC lists "
                                         "none: use agent, or a Redfish address")
        if errors:
            raise ValidationError(errors)

    def unique_error_message(self, model_class, unique_check):
        # Name the host that has the MAC: the admin, the API and `apply` all say it (validate_unique).
        if tuple(unique_check) == ("boot_mac",):
            other = BareMetalHost.objects.filter(boot_mac=self.boot_mac).exclude(pk=self.pk).first()
            if other is not None:
                return ValidationError(f"boot MAC {self.boot_mac} is already the boot MAC of host {other.name}",
                                       code="unique")
        return super().unique_error_message(model_class, unique_check)


class AgentSession(models.Model):
    """One boot of the agent on a host. Its token (kept only as a hash) is valid while it is the host's
    newest session: a token from an earlier boot is refused."""

    host = models.ForeignKey(BareMetalHost, on_delete=models.CASCADE, related_name="agent_sessions")
    boot_id = models.CharField(max_length=64)
    token_hash = models.CharField(max_length=64, unique=True)
    active = models.BooleanField(default=True)
    # Where its lookup came from: a later refused lookup from here with a secret of this host's is its own agent
    # lingering (routine), from elsewhere it is someone else (hosts/protocol/api.py, _refusal_event).
    address = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(auto_now_add=True)
    # The boot whose secret opened the session: a raced boot ends every session of it (hosts/boot/ramdisk.py).
    ramdisk_boot = models.ForeignKey("RamdiskBoot", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="sessions")

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["host", "active"])]

    def __str__(self) -> str:
        return f"{self.host.name} boot {self.boot_id[:8]}"


class RamdiskBoot(models.Model):
    """One boot into the agent's ramdisk that the console started, with the secret that proves an agent is
    that boot. The secret reaches the server only through its boot path (the per-host iPXE script, or the
    virtual-media image), served once on the agent listener; the console keeps its hash, and the secret
    itself (encrypted) only until that one delivery. The lookup that presents it opens the boot's one agent
    session; a second lookup is refused. Only the host's newest boot counts.

    A boot whose configuration was fetched more than once is raced (someone else on the provisioning network
    asked for it too): it is void, and the console boots the host again with a new secret. Nothing the boot's
    agent reports is trusted before the boot has settled: `settle_s` after its start with one fetch at most."""

    host = models.ForeignKey(BareMetalHost, on_delete=models.CASCADE, related_name="ramdisk_boots")
    flow_id = models.CharField(max_length=64, blank=True)
    secret = EncryptedTextField(blank=True)  # emptied once delivered
    secret_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivered_via = models.CharField(max_length=16, blank=True)  # ipxe, virtual-media
    looked_up_at = models.DateTimeField(null=True, blank=True)
    via = models.CharField(max_length=16, blank=True)  # how it is to be delivered: ipxe, virtual-media
    media_token_hash = models.CharField(max_length=64, blank=True)  # virtual media: the one-time URL's token
    fetches = models.PositiveIntegerField(default=0)  # requests for its configuration, served or not
    fetched_from = models.JSONField(default=list, blank=True)  # their client addresses
    settle_s = models.FloatField(null=True, blank=True)  # decided at its start (hosts.boot.ramdisk.boot_settle_s)
    raced_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)  # powered off, booted from disk: no race after this

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["host", "created_at"])]

    def __str__(self) -> str:
        return f"{self.host.name} ramdisk boot {self.pk}"


class CommandStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    SENT = "sent", "Sent"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class HostCommand(models.Model):
    """Work for the agent on a host: queued by a flow step, fetched by a heartbeat, closed by a result."""

    host = models.ForeignKey(BareMetalHost, on_delete=models.CASCADE, related_name="commands")
    flow_id = models.CharField(max_length=36)  # the flow run that queued it
    step = models.CharField(max_length=64)
    name = models.CharField(max_length=64)
    args = models.JSONField(default=dict, blank=True)
    secret_args = EncryptedTextField(blank=True)  # JSON merged into args when sent (join tokens)
    status = models.CharField(max_length=8, choices=CommandStatus.choices, default=CommandStatus.QUEUED)
    session = models.ForeignKey(AgentSession, null=True, blank=True, on_delete=models.SET_NULL)
    progress = models.FloatField(null=True, blank=True)
    message = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]
        constraints = [models.UniqueConstraint(fields=["host", "flow_id", "step"], name="uniq_command_per_step")]

    def __str__(self) -> str:
        return f"{self.name} on {self.host.name} ({self.status})"

    @property
    def public_id(self) -> str:
        return f"c-{self.pk}"


class EraseCertificate(models.Model):
    """One disk's erase, verified: the fields of NIST SP 800-88 Rev. 2 Appendix G plus host, previous tenant and
    claim, as a document signed by the console (hosts/gate/certificates.py). A failed erase or verification is kept
    the same way, with result "fail": it is the evidence that sent the host to repair."""

    host = models.ForeignKey(BareMetalHost, null=True, on_delete=models.SET_NULL, related_name="erase_certificates")
    host_name = models.CharField(max_length=253)  # the certificate outlives the host row
    flow_id = models.CharField(max_length=36)  # the flow run (release, registration, retest) that erased
    disk = models.CharField(max_length=64)
    serial = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=200, blank=True)
    method = models.CharField(max_length=32, blank=True)  # the method performed (pools.erase_rules.METHODS, kept)
    method_type = models.CharField(max_length=16, blank=True)  # Clear, Purge, None
    result = models.CharField(max_length=4, choices=Verdict.choices)
    previous_tenant = models.CharField(max_length=253, blank=True)
    claim_name = models.CharField(max_length=253, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    document = models.JSONField()  # the signed certificate body
    signature = models.CharField(max_length=128)
    key_id = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)
    # Signed from a boot found raced afterwards: the signature still checks, the console no longer stands by it.
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "disk"]
        constraints = [models.UniqueConstraint(fields=["flow_id", "disk"], name="uniq_certificate_per_disk_and_run")]

    def __str__(self) -> str:
        return f"{self.host_name} {self.disk} ({self.serial or 'no serial'}): {self.method or '?'} {self.result}"

    @property
    def certificate_id(self) -> str:
        return self.document.get("certificate_id", "")


class HealthCheckRun(models.Model):
    """One health suite on one host: the tool's raw output, the parsed verdict and per-GPU detail, and the
    thresholds of the NodeType it was judged against (hosts/gate/health.py)."""

    host = models.ForeignKey(BareMetalHost, null=True, on_delete=models.SET_NULL, related_name="health_runs")
    host_name = models.CharField(max_length=253)
    flow_id = models.CharField(max_length=36)
    suite = models.CharField(max_length=16)  # gpu-reset, dcgmi, nccl, gpus, nvlink, burn-in
    # The health tier that ran it (pools/health_tiers.py): handover, release, intake, idle.
    tier = models.CharField(max_length=16, default="release")
    node_type = models.CharField(max_length=253, blank=True)
    command = models.TextField(blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    raw_output = models.TextField(blank=True)
    raw_json = models.TextField(blank=True)  # all_reduce_perf -J report, when there is one
    verdict = models.CharField(max_length=4, choices=Verdict.choices)
    reasons = models.JSONField(default=list, blank=True)  # in the tool's own words
    gpus = models.JSONField(default=dict, blank=True)  # per GPU: status, tests, reasons
    parsed = models.JSONField(default=dict, blank=True)  # the parser's whole answer
    thresholds = models.JSONField(default=dict, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "suite"]
        constraints = [models.UniqueConstraint(fields=["flow_id", "tier", "suite"],
                                               name="uniq_health_run_per_tier_suite_and_run")]

    def __str__(self) -> str:
        return f"{self.suite}: {self.verdict}" + (f" ({self.reasons[0]})" if self.reasons and self.verdict == "fail" else "")


class RepairCase(models.Model):
    """One stay of a host in repair, from the failure that sent it there to its return to service (or its
    retirement): the failure's kind and evidence, the ladder it climbs (hosts/flows/repair.py), where it stands on it,
    and how it ended. Mean time to repair and the repair rate are read from these rows (hosts.selectors)."""

    host = models.ForeignKey(BareMetalHost, null=True, on_delete=models.SET_NULL, related_name="repair_cases")
    host_name = models.CharField(max_length=253)
    node_type = models.CharField(max_length=253, blank=True)  # its NodeType when it failed ("" if none matched)
    kind = models.CharField(max_length=16)  # pools.choices.FailureKind
    detail = models.CharField(max_length=200, blank=True)  # "GPU 3", "nvme0n1"
    failure_step = models.CharField(max_length=64, blank=True)
    failure = models.TextField(blank=True)  # the reason of the move into repair
    evidence = models.JSONField(default=dict, blank=True)  # the failed run's: health run, certificates
    ladder = models.JSONField(default=list, blank=True)  # the remedies, in order, as read when it opened
    position = models.PositiveSmallIntegerField(default=0)  # rungs started so far
    outcome = models.CharField(max_length=16, choices=RepairOutcome.choices, default=RepairOutcome.RUNNING)
    summary = models.TextField(blank=True)  # "gpu-xid on GPU 3: tried gpu-reset (failed), ..."
    opened_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_by = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        indexes = [models.Index(fields=["host", "closed_at"]), models.Index(fields=["closed_at", "node_type", "kind"])]
        constraints = [models.UniqueConstraint(fields=["host"], condition=models.Q(closed_at__isnull=True),
                                               name="one_open_repair_case_per_host")]

    def __str__(self) -> str:
        return f"{self.host_name}: {self.kind} ({self.outcome})"

    @property
    def what(self) -> str:
        return f"{self.kind} on {self.detail}" if self.detail else self.kind


class RepairAttempt(models.Model):
    """One rung of a repair case's ladder: the remedy, when it ran, how it ended, and its evidence (the health
    runs and certificates of its checks, the step that failed and the tool's words)."""

    case = models.ForeignKey(RepairCase, on_delete=models.CASCADE, related_name="attempts")
    host = models.ForeignKey(BareMetalHost, null=True, on_delete=models.SET_NULL, related_name="repair_attempts")
    host_name = models.CharField(max_length=253)
    kind = models.CharField(max_length=16)
    position = models.PositiveSmallIntegerField()  # 1 for the first rung
    step = models.CharField(max_length=16)  # the remedy: pools.choices.RepairRemedy
    flow_id = models.CharField(max_length=36, blank=True)  # the repair flow run that carried it out
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=RepairOutcome.choices, default=RepairOutcome.RUNNING)
    message = models.TextField(blank=True)
    failed_step = models.CharField(max_length=64, blank=True)
    evidence = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["case", "position"]
        constraints = [models.UniqueConstraint(fields=["case", "position"], name="one_attempt_per_rung")]

    def __str__(self) -> str:
        return f"{self.host_name} #{self.position} {self.step}: {self.outcome}"


class WorldEpoch(models.Model):
    """One row: the epoch of the database, as `manage.py backup` last turned it (hosts/restore.py). Its twin lives
    outside the database, in CERTIFICATE_ARCHIVE_DIR; a database whose epoch differs from the world's was restored
    from a backup, and nothing acts on a host until the world reconcile read the host's real state."""

    epoch = models.CharField(max_length=64)
    changed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.epoch
