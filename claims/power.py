"""A claim's node powered on, off or rebooted: the machine an external provider made for it (through the machines
app, claims.providers.machine_power) or its host through the BMC (hosts.services.host_power_request). The API and
the console's pages both ask here, with the same rule of who may."""
from core import scoping
from core.transitions import IllegalTransition
from hosts.services import host_power_request

from .lifecycle import LIVE
from .providers import machine_power, machines_of

# The actions, as the API names them, with the pages' words for them.
POWER_ACTIONS = {"power-on": "Power on", "power-off": "Power off", "power-cycle": "Reboot"}


class NothingToPower(IllegalTransition):
    """The claim holds no node that can be powered (Pending, Releasing, Released; a machine not made yet)."""


def claim_power_allowed(user, tenant) -> bool:
    """Who may power a claim's node, as the claims API lets them (core.api.ScopedPermission with the view's
    member_actions and operator_actions): platform admins and operators any claim, a tenant admin those of its
    tenant (`tenant`: the claim's)."""
    return scoping.acts_on_hosts(user) or scoping.may_change_tenant(user, tenant)


def claim_power_refusal(claim) -> str:
    """Why the claim's node cannot be powered, before asking ("" when it may be): the service checks again."""
    if claim.phase not in LIVE or (claim.host_id is None and not _has_machine(claim)):
        return f"claim {claim.name} is {claim.phase} and holds no node to power"
    return ""


def _has_machine(claim) -> bool:
    machine = machines_of([claim.pk]).get(claim.pk)
    return machine is not None and machine["state"] in ("Running", "Stopped")


def claim_power(*, claim, action: str, actor: str, reason: str = "") -> str:
    """Ask for `action` (power-on, power-off, power-cycle) on the claim's node: the request goes in the Event log
    now (with the claim, so its page lists it) and a worker sends it on commit. What was asked, in words.
    Raises NothingToPower when the claim holds no node, IllegalTransition when a flow drives its host's power."""
    if action not in POWER_ACTIONS:
        raise ValueError(f"unknown power action {action!r}")
    reason = (reason or "").strip()
    if claim.phase in LIVE and claim.host_id is None and machine_power(
            claim=claim, action=action, actor=actor, reason=reason):
        return f"{POWER_ACTIONS[action]}: asked for claim {claim.name}'s machine; the outcome will appear in its events"
    if claim.host_id is None or claim.phase not in LIVE:
        raise NothingToPower(f"claim {claim.name} is {claim.phase} and holds no node to power")
    host_power_request(host=claim.host, action=action, actor=actor, reason=reason)
    return (f"{POWER_ACTIONS[action]}: asked for claim {claim.name}'s host {claim.host.name}; the BMC's answer will "
            "appear in its events")
