"""Console forms for the catalogue, tenants, a pool's quantity and the YAML apply page, validated by the models'
own clean() and written through events.services.object_update."""
# Console forms for providers, NodeTypes, NodeEnvironments, OS images and tenants, the pool quantity and
# the YAML apply page. Validation is the models' own (`clean()`, the same that apply runs); writes go
# through events.services.object_update, which records each change in the Event log.
import yaml
from django import forms
from django.core.exceptions import ValidationError

from core.limits import node_count_error
from events.choices import ObjectType
from events.services import object_update
from hosts.models import BareMetalHost
from manifests.source import ManifestError, load_value
from pools.models import NodeEnvironment, NodeProvider, NodeType, OSImage, Tenant


class YAMLField(forms.CharField):
    """A mapping (or list) edited as YAML; JSON is YAML too."""

    widget = forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "class": "code"})

    def __init__(self, *, empty=None, **kwargs):
        self.empty = {} if empty is None else empty
        kwargs.setdefault("required", False)
        super().__init__(strip=False, **kwargs)

    def prepare_value(self, value):
        if isinstance(value, (dict, list)):
            return "" if not value else yaml.safe_dump(value, sort_keys=False, default_flow_style=False).rstrip()
        return value

    def to_python(self, value):
        if value in (None, "") or (isinstance(value, str) and not value.strip()):
            return type(self.empty)()
        if isinstance(value, (dict, list)):
            return value
        try:
            data = load_value(value)  # as apply reads YAML: within its limits, no NUL, no duplicate keys
        except ManifestError as exc:
            where = f" (line {exc.line})" if exc.line else ""
            raise ValidationError(f"{exc.message}{where}") from None
        if data is None:
            return type(self.empty)()
        if not isinstance(data, type(self.empty)):
            raise ValidationError(f"must be a {'mapping' if isinstance(self.empty, dict) else 'list'}")
        return data

    def has_changed(self, initial, data):
        return self.to_python(data) != (initial or type(self.empty)())


class RecordedForm(forms.ModelForm):
    """A model form whose save goes through object_update (validated again, saved only when something
    changed, and recorded with the user as the actor)."""

    object_type = ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A select's empty choice says what it means ("none"), not Django's "---------".
        for field in self.fields.values():
            if isinstance(field, forms.ModelChoiceField):
                if field.empty_label is not None:
                    field.empty_label = "none"
            elif isinstance(field, forms.ChoiceField):
                field.choices = [(value, "none" if label == "---------" else label) for value, label in field.choices]

    def save_as(self, actor: str):
        model = self._meta.model
        fresh = model.objects.get(pk=self.instance.pk) if self.instance.pk else model()
        values = {name: self.cleaned_data[name] for name in self._meta.fields if name in self.cleaned_data}
        values.update(self.extra_values())
        try:
            object_update(fresh, values, actor=actor, object_type=self.object_type, **self.links(fresh))
        except ValidationError as exc:
            self._add_model_errors(exc)
            return None
        return fresh

    def extra_values(self) -> dict:
        return {}

    def links(self, obj) -> dict:
        return {}

    def _add_model_errors(self, exc: ValidationError) -> None:
        if hasattr(exc, "error_dict"):
            for name, errors in exc.message_dict.items():
                self.add_error(name if name in self.fields else None, errors)
        else:
            self.add_error(None, exc.messages)


class NodeProviderForm(RecordedForm):
    object_type = ObjectType.NODEPROVIDER
    properties = YAMLField(help_text="string map, e.g. vcluster.com/os-image: ubuntu2404-20260926")

    class Meta:
        model = NodeProvider
        fields = ["name", "kind", "display_name", "properties"]


class NodeTypeForm(RecordedForm):
    object_type = ObjectType.NODETYPE
    properties = YAMLField(help_text="string map; vcluster.com/node-type and the provider are added")
    resources = YAMLField(help_text='e.g. cpu: "192", memory: 2Ti, nvidia.com/gpu: "8"')
    host_selector = YAMLField(help_text="Kubernetes label selector over host labels, e.g. matchLabels: {role: gpu}")
    # A manifest's spec.sku, spec.health and spec.repair, as written there; NodeType.clean() checks them (pools/sku.py,
    # pools/health_tiers.py, pools.validators.check_repair) as it does for the API and the admin.
    sku = YAMLField(label="SKU",
                    help_text='what each server must have, e.g. gpu: {model: "NVIDIA H200", count: 8}, '
                              "nvme: {count: 8, minSize: 3.84T}; a host that deviates goes to repair")
    health = YAMLField(label="Health tiers",
                       help_text="handover, release, intake, idle, e.g. idle: {interval: 24h, hostsAtOnce: 2}; "
                                 "{} runs a tier with its defaults")
    repair = YAMLField(label="Repair ladder",
                       help_text="remedies per failure kind, e.g. ladders: {gpu-xid: [gpu-reset, power-cycle, "
                                 "retest]}; automatic: false hands every failure to a person; empty: the default "
                                 "ladders")

    class Meta:
        model = NodeType
        fields = ["name", "provider", "display_name", "zone", "region", "properties", "resources", "cost",
                  "host_selector",
                  # The release gate: a manifest's spec.cleaning and spec.healthCheck.
                  "cleaning_policy", "cleaning_fallback", "erase_concurrency", "erase_verify_share",
                  "erase_verify_full", "health_dcgm_level", "health_nccl_min_busbw_gbps",
                  # Warm hosts (hosts/flows/warm.py): a manifest's spec.warm.
                  "warm_hosts", "warm_idle_minutes",
                  # Where its hosts' inventories come from: a manifest's spec.inspectionMode.
                  "inspection_mode",
                  # The SKU, the health tiers, the repair ladder: declared above.
                  "sku", "health", "repair"]
        labels = {"warm_hosts": "Warm hosts", "warm_idle_minutes": "Warm host idle minutes",
                  "cleaning_policy": "Cleaning method", "cleaning_fallback": "Cleaning fallback",
                  "erase_concurrency": "Disks erased at once", "erase_verify_share": "Share read back",
                  "erase_verify_full": "Read every byte back", "health_dcgm_level": "dcgmi diag level",
                  "health_nccl_min_busbw_gbps": "NCCL all-reduce busbw, GB/s at least", "inspection_mode": "Inspection"}
        help_texts = {"cleaning_policy": "how a released host's disks are erased before anyone gets it again; "
                                         "a host may override it",
                      "cleaning_fallback": "used, and recorded on the certificate, when the method cannot run; "
                                           "empty: none (the host goes to repair)"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("warm_hosts", "warm_idle_minutes"):  # left empty: as it is (a new type: the default)
            self.fields[name].required = False
        # An empty cost is computed from the resources (NodeType.effective_cost), as the list shows it: say so.
        cost = self.fields["cost"]
        cost.help_text = "empty: computed from the resources, as vCluster does (10 per CPU, 2 per GB of memory, " \
                         "10000 per other resource)"
        if self.instance.pk and self.instance.cost is None:
            computed = self.instance.effective_cost()
            cost.widget.attrs["placeholder"] = f"{computed} (computed)"
            cost.help_text = f"empty: computed from the resources, now {computed} " \
                             "(10 per CPU, 2 per GB of memory, 10000 per other resource)"

    def _kept(self, name: str):
        value = self.cleaned_data.get(name)
        return getattr(self.instance, name) if value is None else value

    def clean_warm_hosts(self):
        return self._kept("warm_hosts")

    def clean_warm_idle_minutes(self):
        return self._kept("warm_idle_minutes")

    def clean_resources(self):
        resources = self.cleaned_data["resources"]
        # Quantities are strings in Kubernetes; YAML reads 192 as a number.
        return {str(k): str(v) for k, v in resources.items()} if isinstance(resources, dict) else resources


class NodeEnvironmentForm(RecordedForm):
    object_type = ObjectType.NODEENVIRONMENT
    properties = YAMLField(help_text="metal3.vcluster.com/network-cidr, network-ip-range, dns-servers")

    class Meta:
        model = NodeEnvironment
        fields = ["name", "namespace", "display_name", "provider", "tenant", "properties"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].empty_label = "shared (every tenant)"  # as the list says it

    def links(self, obj) -> dict:
        return {"tenant": self.cleaned_data.get("tenant")}


class OSImageForm(RecordedForm):
    object_type = ObjectType.OSIMAGE
    properties = YAMLField(help_text="any further properties, kept as written")

    class Meta:
        model = OSImage
        fields = ["name", "display_name", "description", "url", "checksum", "checksum_type", "format", "size_bytes",
                  "properties"]


class TenantForm(RecordedForm):
    object_type = ObjectType.TENANT
    kubeconfig = forms.CharField(
        required=False, strip=False, widget=forms.Textarea(attrs={"rows": 4, "class": "code", "autocomplete": "off"}),
        help_text="the tenant API's kubeconfig; stored encrypted, never shown again. Leave empty to keep it.")

    class Meta:
        model = Tenant
        fields = ["name", "namespace", "display_name", "api_endpoint", "join_mode", "quota_nodes"]

    def extra_values(self) -> dict:
        kubeconfig = self.cleaned_data.get("kubeconfig") or ""
        return {"kubeconfig": kubeconfig} if kubeconfig.strip() else {}

    def clean_kubeconfig(self):
        text = self.cleaned_data.get("kubeconfig") or ""
        if text.strip():
            try:
                data = load_value(text, "kubeconfig")
            except ManifestError as exc:  # its message may quote the text, which holds credentials
                raise ValidationError(f"not valid YAML (line {exc.line})" if exc.line else "not valid YAML") from None
            if not isinstance(data, dict) or not data.get("clusters"):
                raise ValidationError("a kubeconfig needs at least one cluster")
        return text

    def links(self, obj) -> dict:
        return {"self_link": "tenant"}


class QuantityForm(forms.Form):
    quantity = forms.IntegerField(min_value=0)
    version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    def clean_quantity(self):
        quantity = self.cleaned_data["quantity"]
        if node_count_error(quantity):  # as the API and the admin: the bound by its name
            raise forms.ValidationError(node_count_error(quantity))
        return quantity


class ApplyForm(forms.Form):
    text = forms.CharField(required=False, strip=False, label="YAML",
                           widget=forms.Textarea(attrs={"rows": 18, "class": "code", "spellcheck": "false"}))
    file = forms.FileField(required=False, label="or upload a file")
    tenant = forms.CharField(required=False, max_length=63,
                             help_text="for a tenant's vcluster.yaml (privateNodes)")
    create_tenant = forms.BooleanField(required=False, label="Create tenant",
                                       help_text="create the tenant named above if it does not exist (unticked, "
                                                 "a mistyped name makes nothing)")

    def clean(self):
        data = super().clean()
        upload = data.get("file")
        if upload:
            try:
                data["text"] = upload.read().decode("utf-8")
            except UnicodeDecodeError:
                self.add_error("file", "not UTF-8 text")
            data["file_name"] = upload.name
        else:
            data["file_name"] = "pasted.yaml"
        if not (data.get("text") or "").strip() and not self.errors:
            self.add_error("text", "paste YAML or upload a file")
        return data


# --- a host's BMC, boot MAC and labels (console.host_pages) ----------------------------------------------------

# A credential's box: never filled from the server (render_value=False), never offered by the browser's autofill.
SECRET_INPUT = forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"})


def credential_fields(*, keep: str) -> tuple[forms.CharField, forms.CharField]:
    """A host's BMC username and password as a form asks for them: never shown back, empty keeps them."""
    return (forms.CharField(label="BMC username", required=False, max_length=255,
                            widget=forms.TextInput(attrs={"autocomplete": "off"}),
                            help_text=f"never shown; leave empty to keep {keep}"),
            forms.CharField(label="BMC password", required=False, max_length=255, strip=False, widget=SECRET_INPUT,
                            help_text=f"never shown; leave empty to keep {keep}"))


class HostEditForm(RecordedForm):
    """What a person fixes on a registered host: its BMC address, credentials and TLS setting, its boot MAC, its
    labels, its inspection mode.
    Checked by BareMetalHost.clean() (the same as apply and the API), saved through object_update (the
    Event masks the credentials). The credentials are never shown back: left empty, they stay as they are."""

    object_type = ObjectType.HOST
    labels = YAMLField(help_text="string map, e.g. role: gpu, rack: r1")
    bmc_username, bmc_password = credential_fields(keep="the current one")

    class Meta:
        model = BareMetalHost
        fields = ["bmc_address", "bmc_disable_certificate_verification", "bmc_username", "bmc_password", "boot_mac",
                  "labels", "inspection_mode"]
        labels = {"bmc_address": "BMC address", "bmc_disable_certificate_verification": "Skip TLS verification",
                  "boot_mac": "Boot MAC", "inspection_mode": "Inspection"}
        help_texts = {"inspection_mode": "blank: its NodeType's, else agent"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("bmc_username", "bmc_password"):  # never sent to the browser, not even the username
            self.initial[name] = ""

    def clean(self):
        cleaned = super().clean()
        for name in ("bmc_username", "bmc_password"):
            if not cleaned.get(name):
                cleaned.pop(name, None)  # empty: kept as it is
        if "\x00" in (cleaned.get("bmc_password") or "") + (cleaned.get("bmc_username") or ""):
            raise ValidationError("a NUL character is not allowed in the credentials")
        return cleaned

    def links(self, obj) -> dict:
        return {"self_link": "host"}


class HostBulkEditForm(forms.Form):
    """What the fleet board's selection may change on every selected host at once: the BMC credentials (one
    account on every BMC) and labels set or removed. Each host is then checked and saved on its own (the same
    checks as one host's edit)."""

    bmc_username, bmc_password = credential_fields(keep="each host's own")
    labels_set = YAMLField(label="Labels to set", help_text="string map, e.g. rack: r7")
    labels_remove = forms.CharField(label="Labels to remove", required=False, max_length=2000,
                                    help_text="label keys, separated by commas or spaces")

    def clean(self):
        cleaned = super().clean()
        cleaned["labels_remove"] = sorted(set((cleaned.get("labels_remove") or "").replace(",", " ").split()))
        for name in ("bmc_username", "bmc_password", "labels_remove"):
            if "\x00" in str(cleaned.get(name) or ""):
                raise ValidationError("a NUL character is not allowed")
        if not (cleaned.get("bmc_username") or cleaned.get("bmc_password") or cleaned.get("labels_set")
                or cleaned.get("labels_remove")):
            raise ValidationError("say what to change: credentials, labels to set or labels to remove")
        return cleaned

    def values_for(self, host: BareMetalHost) -> dict:
        """The values this edit gives one host."""
        values = {name: self.cleaned_data[name] for name in ("bmc_username", "bmc_password")
                  if self.cleaned_data.get(name)}
        if self.cleaned_data.get("labels_set") or self.cleaned_data.get("labels_remove"):
            labels = {k: v for k, v in (host.labels or {}).items() if k not in self.cleaned_data["labels_remove"]}
            labels.update(self.cleaned_data.get("labels_set") or {})
            values["labels"] = labels
        return values
