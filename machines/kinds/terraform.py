"""Kind `terraform`: one OpenTofu workspace per claim, named NODE_CLAIM.PROJECT.node, whose state the console keeps
(machines/tofu). fill = init + apply, release = destroy; power re-applies with var.vcluster.powerState."""
import json
import re

from django.conf import settings

from core.crypto import decrypt, encrypt
from pools.choices import ProviderKind

from ..choices import DiskProof, MachineState
from ..models import ProviderSecret, TofuState
from ..tofu import backend, runner
from . import Join, KindError, Progress, register

PROVIDER_LABEL = "terraform.vcluster.com/provider"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# For the provider's page: said plainly where people choose this kind (docs/providers-terraform.md).
UNTESTED = ("No real tofu run was tested here: OpenTofu cannot be installed on the machines this was built on; "
            "the runner was tested against a stand-in executable (tests/fixtures/fake_tofu).")
SEALED = "tofu_inputs"  # machine.memory: the last inputs, encrypted (userData is a secret), for power and destroy


def workspace_name(claim) -> str:
    """NODE_CLAIM.PROJECT.node; a claim's namespace is its project's, "p-<project>" as vCluster Platform names it."""
    return f"{claim.name}.{claim.namespace.removeprefix('p-')}.node"


def _node_type(machine):
    return machine.node_type or machine.claim.node_type


def _setting(machine, key):
    """A NodeType's own value (its provider_config) before the provider's (spec.terraform)."""
    node_type = _node_type(machine)
    value = (node_type.provider_config or {}).get(key) if node_type else None
    return value if value not in (None, "") else (machine.provider.config or {}).get(key)


def inputs(machine, *, user_data: str, power: str) -> dict:
    """var.vcluster, with the fields vCluster Platform's templates read (docs/providers-terraform.md)."""
    claim, node_type, environment = machine.claim, _node_type(machine), machine.claim.environment
    properties = {**((node_type.properties or {}) if node_type else {}), **(claim.properties or {})}
    return {"vcluster": {
        "name": claim.name,
        "namespace": claim.namespace,
        "userData": user_data,
        "powerState": power,
        "requirements": properties,
        "instance": {"metadata": {"name": claim.tenant.name, "namespace": claim.namespace}},
        "nodeClaim": {"apiVersion": "management.loft.sh/v1", "kind": "NodeClaim",
                      "metadata": {"name": claim.name, "namespace": claim.namespace},
                      "spec": {"providerRef": machine.provider.name,
                               "typeRef": node_type.name if node_type else "",
                               "properties": claim.properties or {}, "requirements": claim.requirements or []}},
        "nodeType": {"metadata": {"name": node_type.name if node_type else ""},
                     "spec": {"properties": (node_type.properties or {}) if node_type else {},
                              "resources": (node_type.resources or {}) if node_type else {}}},
        "nodeEnvironment": {"metadata": {"name": environment.name if environment else "",
                                         "namespace": environment.namespace if environment else ""},
                            "outputs": {}},
    }}


def provider_env(provider) -> dict:
    """The credentials of Secrets labelled terraform.vcluster.com/provider=<provider name>: each key an
    environment variable of OpenTofu's (AWS_ACCESS_KEY_ID, ARM_CLIENT_SECRET, ...)."""
    env = {}
    for secret in ProviderSecret.objects.order_by("namespace", "name"):
        if (secret.labels or {}).get(PROVIDER_LABEL) != provider.name or not secret.contents:
            continue
        try:
            data = json.loads(str(secret.contents))
        except ValueError:
            raise KindError(f"Secret {secret} is not a mapping of keys to values", retry=False) from None
        env.update({k: str(v) for k, v in data.items() if ENV_NAME.fullmatch(k)})
    return env


def _apply(machine, variables: dict, action: str) -> dict:
    workspace = workspace_name(machine.claim)
    template = _setting(machine, "nodeTemplate")
    try:
        timeout = runner.duration_s(_setting(machine, "timeout"), settings.TOFU_TIMEOUT_S)
        run = runner.Run(workspace=workspace, template=template or {}, variables=variables,
                         password=backend.tofu_credentials(name=workspace, provider=machine.provider),
                         env=provider_env(machine.provider), timeout_s=timeout)
        outputs = runner.tofu(run, action)
    except runner.TofuFailed as exc:
        raise KindError(f"workspace {workspace}: {exc.message}", retry=exc.retry) from None
    machine.memory = {**(machine.memory or {}), SEALED: encrypt(json.dumps(variables))}
    return outputs


def _sealed(machine, *, power: str) -> dict:
    sealed = (machine.memory or {}).get(SEALED)
    variables = json.loads(decrypt(sealed)) if sealed else inputs(machine, user_data="", power=power)
    variables["vcluster"]["powerState"] = power
    return variables


class Terraform:
    def capacity(self, node_type) -> int | None:
        value = (node_type.provider_config or {}).get("maxCapacity")
        if value in (None, ""):
            value = (node_type.provider.config or {}).get("maxCapacity")
        return None if value in (None, "") else int(value)

    def fill(self, machine, join: Join) -> None:
        workspace = workspace_name(machine.claim)
        if (machine.memory or {}).get("applied"):
            return  # made: applying again with a new join's userData could replace the machine
        machine.name = machine.name or workspace
        machine.made = [{"kind": "Workspace", "name": workspace}]
        machine.outputs = _apply(machine, inputs(machine, user_data=join.user_data, power="On"), "apply")
        machine.memory = {**machine.memory, "applied": True, "node_name": join.node_name}
        machine.power = "On"

    def progress(self, machine) -> Progress:
        memory = machine.memory or {}
        if not memory.get("applied"):
            return Progress(MachineState.CREATING, "waiting for tofu apply")
        if machine.power == "Off":
            return Progress(MachineState.STOPPED, "powered off (var.vcluster.powerState)",
                            node_name=memory.get("node_name", ""))
        return Progress(MachineState.RUNNING, "applied", node_name=memory.get("node_name", ""),
                        details={"outputs": machine.outputs})

    def power(self, machine, action: str) -> None:
        """Re-apply with var.vcluster.powerState "On" or "Off"; a reboot is an Off apply then an On apply, so any
        template that honours powerState reboots its machine."""
        steps = {"on": ["On"], "off": ["Off"], "reboot": ["Off", "On"]}.get(action)
        if steps is None:
            raise KindError(f"no power action {action!r}", retry=False)
        for state in steps:
            machine.outputs = _apply(machine, _sealed(machine, power=state), "apply")
            machine.power = state

    def release(self, machine) -> bool:
        """destroy, then forget the state and the workspace's directory. Idempotent: no state, nothing to
        destroy."""
        workspace = workspace_name(machine.claim)
        state = TofuState.objects.filter(name=workspace).first()
        if state is not None and state.tofu_state:
            _apply(machine, _sealed(machine, power=machine.power or "On"), "destroy")
        TofuState.objects.filter(name=workspace).delete()
        runner.forget(workspace)
        machine.outputs = {}
        machine.memory = {k: v for k, v in (machine.memory or {}).items() if k != SEALED}
        return True

    def disk_proof(self, machine) -> str:
        return DiskProof.DESTROYED


register(ProviderKind.TERRAFORM, Terraform())
